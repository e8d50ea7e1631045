"""The tool job's RL stage, synchronous and asynchronous, side by side on this machine: how long each takes and what
each learns, from the same cold start.

    python -m benchmarks.tool_async --output_dir OUT [--seed 42] [--save FILE] [-- EXTRA JOB ARGUMENTS]
    python -m benchmarks.tool_async --output_dir OUT --sync_run DIR    # the synchronous arm: a run made here already
    python -m benchmarks.tool_async --smoke                             # a tiny random model, one step each (CI)

1. the synchronous job (``benchmarks.tool_arms``: cold start, its evaluation, tool RL on ``RLVRTrainer`` with HF
   generation, the evaluation after RL) into ``OUT/sync``; or, with ``--sync_run DIR``, the run in ``DIR``
   (``tool_r1_metrics.json`` and ``cold_start``, made by ``python -m benchmarks.tool_r1 --output_dir DIR`` on this
   machine with the same extra arguments);
2. the asynchronous RL stage from that cold start (``--model_name_or_path SYNC/cold_start --sft_traces 0
   --eval_start false --async``: ``RLVRAsyncTrainer``, its vLLM server on the last core, the trainer on the
   other) and its evaluation after RL, into ``OUT/async``, with ``--async_python`` (an interpreter with vLLM;
   default: this one).

Prints and saves (``--save``) each RL stage's wall time (the job's ``RL`` timing: ``trainer.train()``), the server's
start (not in the ratio: a server may outlive a run), their ratio, each arm's held-out pass@1 with its 95% interval,
the tokens the server generated, and each arm's command, wall time and peak RSS. Both arms use the job's evaluation
(HF generation, seeded) on the same held-out questions.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._jobs import launch_job, tool_job_smoke_args
from benchmarks._status import finish, skip

SYNC_LABEL, ASYNC_LABEL = "cold start + tool RL", "tool RL"  # the async arm starts from a checkpoint (sft_traces 0)


def has_vllm(python: str) -> bool:
    """Whether ``python`` can import vLLM (without importing it: seconds)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([python, "-c", probe], check=False).returncode == 0


def arm_figures(metrics: dict, label: str) -> dict:
    """An arm's RL stage time, its evaluation after RL (pass@1 and its interval) and its server's record."""
    evaluation = metrics["evaluations"][label]
    return {"rl_s": metrics["timings_s"]["RL"], "server_start_s": metrics["timings_s"].get("vLLM server start"),
            "pass@1": evaluation["mean@n"], "pass@1_interval": evaluation["pass@1_intervals"].get("all"),
            "steps": len(metrics["history"]), "vllm_server": metrics.get("vllm_server")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default=None, help="where both arms write (default: a temporary dir)")
    parser.add_argument("--seed", type=int, default=42, help="the job's --seed, both arms")
    parser.add_argument("--sync_run", default=None, help="the synchronous arm: a run's output_dir made on this machine")
    parser.add_argument("--async_python", default=sys.executable, help="an interpreter with vLLM for the async arm")
    parser.add_argument("--save", default=None, help="write the measurement as JSON to this file")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("extra", nargs="*", help="more arguments of both arms (benchmarks.tool_arms; after --)")
    args = parser.parse_args(argv)
    if not has_vllm(args.async_python):
        return skip("benchmarks.tool_async", f"the async arm needs vLLM in {args.async_python} (--async_python: "
                                             "vLLM's CPU build in its own venv, as .ci/run builds it)")
    temporary = args.output_dir is None
    out = Path(args.output_dir or tempfile.mkdtemp(prefix="tool_async_"))
    try:
        return measure(args, out)
    finally:
        if temporary:
            shutil.rmtree(out, ignore_errors=True)


def measure(args, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    common = ["--seed", str(args.seed), *args.extra]
    smoke = tool_job_smoke_args(out, hidden_size=256) if args.smoke else []  # the server serves it too
    result, failures = {"seed": args.seed}, []
    if args.sync_run:
        sync_dir = Path(args.sync_run)
        result["sync"] = {"run": str(sync_dir)}
    else:
        sync_dir = out / "sync"
        result["sync"] = launch_job("benchmarks.tool_arms", ["--output_dir", str(sync_dir), *common, *smoke])
    async_dir = out / "async"
    start = ["--model_name_or_path", str(sync_dir / "cold_start"), "--sft_traces", "0", "--eval_start", "false"]
    if smoke:  # the smoke arguments without their model: the async arm starts from the sync arm's cold start
        at = smoke.index("--model_name_or_path")
        smoke = smoke[:at] + smoke[at + 2:]
    result["async"] = launch_job("benchmarks.tool_arms", ["--output_dir", str(async_dir), *common, *smoke, *start,
                                                          "--async", "--save_model", "false"],
                                 python=args.async_python)
    for arm, directory, label in (("sync", sync_dir, SYNC_LABEL), ("async", async_dir, ASYNC_LABEL)):
        metrics_file = directory / "tool_r1_metrics.json"
        if result[arm].get("exit_status", 0) != 0 or not metrics_file.is_file():
            failures.append(f"the {arm} arm did not finish ({metrics_file})")
            continue
        result[arm].update(arm_figures(json.loads(metrics_file.read_text()), label))
    if not failures:
        result["ratio_rl_s"] = round(result["async"]["rl_s"] / result["sync"]["rl_s"], 3)
        report(result, args.smoke)
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=1))
    return finish("tool_async", failures)


def report(result: dict, smoke: bool) -> None:
    if smoke:
        print("SMOKE RUN (a tiny random model, one step per arm): the figures test the code path, not the method")
    for arm in ("sync", "async"):
        r = result[arm]
        interval = r["pass@1_interval"]
        spread = f" (95% interval {interval[0]:.1%} to {interval[1]:.1%})" if interval else ""
        server = f", server start {r['server_start_s']:.0f} s" if r.get("server_start_s") is not None else ""
        print(f"{arm:5s}: RL stage {r['rl_s']:.0f} s over {r['steps']} steps{server}; held-out pass@1 "
              f"{r['pass@1']:.1%}{spread}")
    counters = (result["async"].get("vllm_server") or {}).get("counters") or {}
    if counters:
        tokens = counters["generation_tokens"]
        print(f"async: the server generated {tokens:.0f} tokens in {counters['requests']:.0f} requests "
              f"({tokens / result['async']['rl_s']:.0f} tokens/s over the RL stage)")
    print(f"async / sync RL stage wall time: {result['ratio_rl_s']:.3f} (goal <= 0.6)")


if __name__ == "__main__":
    sys.exit(main())
