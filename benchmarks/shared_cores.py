"""A main job on quiet cores and with cores taken by another process, back to back on one machine.

    python -m benchmarks.shared_cores --job {r1zero,tool_r1} [--busy 1] [--save FILE] [--smoke] [-- JOB ARGUMENTS]

Runs ``accelerate launch examples/JOB.py`` twice, one run after the other (``benchmarks._jobs``): first alone, then
with ``--busy`` pure-Python spinning processes alongside (default 1: one of the cores taken). Reports each run's
wall time, peak RSS, load average and the job's own stage timings, the slowdown (busy wall / quiet wall; the thread
default is chosen to keep it within ~2x with one core busy, docs/benchmarks.md "Torch threads on shared cores"),
and checks that both runs got the same figures (the training steps' rewards and the held-out results: the thread
count must not change what a seeded job learns). ``--smoke``: the tool job's smoke mode on a tiny random model,
both ways (seconds to minutes); the figures checked, the slowdown only printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks._jobs import launch_job, tool_job_smoke_args
from benchmarks._status import finish


def job_figures(job: str, metrics: dict) -> dict:
    """What a seeded run of ``job`` learned, without timings: each training step's mean reward and the held-out
    results (r1zero: greedy accuracy, format rate and mean length before and after; tool_r1: every arm's table)."""
    if job == "r1zero":
        held_out = {when: {k: (metrics[when] or {}).get(k) for k in ("accuracy", "format_rate", "mean_length")}
                    for when in ("before", "after")}
    else:
        held_out = {arm: {k: v for k, v in figures.items() if k != "seconds"}
                    for arm, figures in metrics["arms"].items() if figures}
    return {"step_rewards": [row["reward"] for row in metrics["history"] if "reward" in row], "held_out": held_out}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", choices=["r1zero", "tool_r1"], default="tool_r1")
    parser.add_argument("--busy", type=int, default=1, help="spinning processes alongside the second run")
    parser.add_argument("--save", default=None, help="write both measurements as JSON to this file")
    parser.add_argument("--smoke", action="store_true", help="the tool job's smoke mode on a tiny model")
    parser.add_argument("extra", nargs="*", help="more arguments of the job (after --)")
    args = parser.parse_args(argv)
    if args.smoke and args.job != "tool_r1":
        parser.error("--smoke runs the tool job's smoke mode: use --job tool_r1")
    base = Path(tempfile.mkdtemp(prefix=f"shared_cores_{args.job}_"))
    smoke = tool_job_smoke_args(base) if args.smoke else []
    runs, failures = {}, []
    for name, busy in (("quiet", 0), ("busy", args.busy)):
        out = base / name
        run = launch_job(args.job, ["--output_dir", str(out), *args.extra, *smoke], busy)
        metrics_file = out / f"{args.job}_metrics.json"
        if run["exit_status"] != 0:
            failures.append(f"the {name} run exited with {run['exit_status']}")
        elif not metrics_file.is_file():
            failures.append(f"the {name} run wrote no {metrics_file}")
        else:
            metrics = json.loads(metrics_file.read_text())
            run.update(timings_s=metrics["timings_s"], figures=job_figures(args.job, metrics))
            if not args.smoke and not run["figures"]["step_rewards"]:
                failures.append(f"the {name} run logged no training step")
        runs[name] = run
    result = {"job": args.job, "runs": runs}
    if not failures:
        result["slowdown"] = round(runs["busy"]["wall_s"] / runs["quiet"]["wall_s"], 2)
        result["same_figures"] = runs["busy"]["figures"] == runs["quiet"]["figures"]
        print(f"{args.job}: quiet {runs['quiet']['wall_s']:.0f} s, {args.busy} core(s) busy {runs['busy']['wall_s']:.0f} s:"
              f" {result['slowdown']:.2f}x; peak RSS {runs['quiet']['peak_rss_kib'] / 1024:.0f} / "
              f"{runs['busy']['peak_rss_kib'] / 1024:.0f} MiB; the same figures: {result['same_figures']}")
        for name in runs:
            print(f"  {name} timings_s: {runs[name]['timings_s']}")
        if not result["same_figures"]:
            failures.append("the busy run learned something else than the quiet one: "
                            f"{runs['quiet']['figures']} vs {runs['busy']['figures']}")
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=1))
    return finish("shared_cores", failures)


if __name__ == "__main__":
    sys.exit(main())
