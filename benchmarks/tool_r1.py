"""The second main job's wall time and peak memory: its lab run (``benchmarks.tool_arms``: examples/tool_r1.py's stages,
with the comparisons the committed runs hold) under ``accelerate launch``.

    python -m benchmarks.tool_r1 [--seeds 42 1 2] [--busy N] [--save FILE] [--smoke] [-- EXTRA JOB ARGUMENTS]

Runs the job once per seed (``--seeds``: the job's ``--seed``, each into ``<output_dir>/seed<S>``, then a summary
over the seeds: each arm's pass@1 per seed, their mean and range, and the wall times; without ``--seeds``, once with
the job's own seed, into ``output_dir``) (``accelerate launch --num_processes 1 ... -m benchmarks.tool_arms``, ``benchmarks._jobs``), and reports
its wall time, the peak RSS of the largest process of the tree (``wait4``'s ``ru_maxrss``, as ``/usr/bin/time -v``),
the load average before and after, and the job's own timings and held-out figures from its metrics file.
``--busy N``: N pure-Python spinning processes run alongside (one core taken by another process: how the job holds
up on shared cores; ``benchmarks.shared_cores`` runs both ways back to back). The default output directory is a
temporary one, removed at the end (``--output_dir DIR`` keeps the job's model, metrics and curves). ``--smoke``: the
job's ``--smoke`` mode on a tiny random model with ChatML tokens (``trl_rlvr.testing.build_tiny_chatml_model``): one
short step of each stage, seconds to minutes; its table marks this run's columns ``[smoke]`` beside the committed
real-model ``[committed]`` ones, and the summary says so. Quoted in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks._jobs import launch_job, tool_job_smoke_args
from benchmarks._status import finish


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="one run per seed (the job's --seed), each into <output_dir>/seed<S>, then a summary")
    parser.add_argument("--busy", type=int, default=0, help="spinning processes alongside the job")
    parser.add_argument("--output_dir", default=None, help="the job's output_dir (default: a temporary dir)")
    parser.add_argument("--save", default=None, help="write the measurement as JSON to this file")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("extra", nargs="*", help="more arguments of the job (benchmarks.tool_arms; after --)")
    args = parser.parse_args(argv)
    if args.seeds and "--seed" in args.extra:
        parser.error("--seeds sets the job's --seed: give one or the other")
    temporary = args.output_dir is None
    out = Path(args.output_dir or tempfile.mkdtemp(prefix="tool_r1_"))
    try:
        if not args.seeds:
            result, failures = measure(args, out)
        else:
            runs = {seed: measure(args, out / f"seed{seed}", ["--seed", str(seed)]) for seed in args.seeds}
            failures = [f"seed {seed}: {failure}" for seed, (_, fails) in runs.items() for failure in fails]
            result = {"seeds": {seed: run for seed, (run, _) in runs.items()},
                      "summary": seeds_summary({seed: run for seed, (run, _) in runs.items()})}
            print_summary(result["summary"])
        if args.save:
            Path(args.save).write_text(json.dumps(result, indent=1))
        return finish("tool_r1", failures)
    finally:
        if temporary:
            shutil.rmtree(out, ignore_errors=True)
            print(f"removed the temporary output directory {out} (--output_dir DIR keeps it)")


def measure(args, out: Path, seed_args: list[str] = ()) -> tuple[dict, list[str]]:
    """Run the job into ``out`` and report it -> (the measurement, its failures)."""
    out.mkdir(parents=True, exist_ok=True)
    job = ["--output_dir", str(out), *seed_args, *args.extra]
    if args.smoke:
        from trl_rlvr.evaluation.progress import plain_library_bars

        plain_library_bars()  # building the tiny model: no \r bars in a log
        job += tool_job_smoke_args(out)
    result = launch_job("benchmarks.tool_arms", job, args.busy)
    rc = result["exit_status"]
    failures = [] if rc == 0 else [f"the job exited with {rc}"]
    metrics_file = out / "tool_r1_metrics.json"
    if rc == 0 and "--arm" not in args.extra:
        if not metrics_file.is_file():
            failures.append(f"no {metrics_file}")
        else:
            metrics = json.loads(metrics_file.read_text())
            result.update(timings_s=metrics["timings_s"], goals=metrics["goals"],
                          pass_at_1={k: v["pass@1"] for k, v in metrics["arms"].items() if v})
            if not args.smoke and not metrics["history"]:
                failures.append("the job logged no training step")
    if args.smoke:
        result["smoke"] = True
        print("SMOKE RUN (a tiny random model, one short step per stage): timings_s and pass_at_1 below test the "
              "code path; they are not the job's results (examples/README.md, docs/benchmarks.md)")
    for key in ("timings_s", "pass_at_1", "goals"):
        if key in result:
            print(f"{key}: {result[key]}")
    return result, failures


def seeds_summary(runs: dict) -> dict:
    """Over the seeds' runs (seed -> measurement): each arm's pass@1 per seed, mean, min and max; the wall times."""
    arms = {}
    for seed, run in runs.items():
        for arm, value in (run.get("pass_at_1") or {}).items():
            arms.setdefault(arm, {})[seed] = value
    summary = {"seeds": list(runs), "wall_s": {seed: run["wall_s"] for seed, run in runs.items()}, "pass_at_1": {}}
    for arm, by_seed in arms.items():
        values = [v for v in by_seed.values() if v is not None]
        summary["pass_at_1"][arm] = {"per_seed": by_seed, "mean": sum(values) / len(values) if values else None,
                                     "min": min(values, default=None), "max": max(values, default=None)}
    return summary


def print_summary(summary: dict) -> None:
    print(f"\nover seeds {' '.join(map(str, summary['seeds']))}: held-out pass@1 per arm (mean, range, per seed)")
    for arm, s in summary["pass_at_1"].items():
        if s["mean"] is None:
            print(f"  {arm}: -")
            continue
        each = ", ".join(f"{seed}: {v:.1%}" for seed, v in s["per_seed"].items() if v is not None)
        print(f"  {arm}: {s['mean']:.1%} ({s['min']:.1%} to {s['max']:.1%}; {each})")
    print("wall: " + ", ".join(f"seed {seed} {wall:.0f} s" for seed, wall in summary["wall_s"].items()))


if __name__ == "__main__":
    sys.exit(main())
