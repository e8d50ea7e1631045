"""The second main job's wall time and peak memory: ``accelerate launch examples/tool_r1.py`` as a user runs it.

    python -m benchmarks.tool_r1 [--busy N] [--save FILE] [--smoke] [-- EXTRA JOB ARGUMENTS]

Runs the job once in its own session (``accelerate launch --num_processes 1 ... examples/tool_r1.py``), and reports
its wall time, the peak RSS of the largest process of the tree (``wait4``'s ``ru_maxrss`` over the launcher and the
job it waited for, as ``/usr/bin/time -v`` reports it), the load average before and after, and the job's own
timings and held-out figures from its metrics file. ``--busy N``: N pure-Python spinning processes run alongside
(one core taken by another process: how the job holds up on shared cores). The default output directory is a
temporary one. ``--smoke``: the job's ``--smoke`` mode on a tiny random model with ChatML tokens
(``trl_rlvr.testing.build_tiny_chatml_model``): one short step of each stage, seconds to minutes. Quoted in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._status import finish

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, default=0, help="spinning processes alongside the job")
    parser.add_argument("--output_dir", default=None, help="the job's output_dir (default: a temporary dir)")
    parser.add_argument("--save", default=None, help="write the measurement as JSON to this file")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("extra", nargs="*", help="more arguments of examples/tool_r1.py (after --)")
    args = parser.parse_args(argv)
    out = args.output_dir or tempfile.mkdtemp(prefix="tool_r1_")
    job = ["--output_dir", out, *args.extra]
    if args.smoke:
        from trl_rlvr.testing import build_tiny_chatml_model

        model = build_tiny_chatml_model(Path(out) / "tiny_model")
        job += ["--smoke", "--model_name_or_path", str(model), "--max_completion_length", "24",
                "--overlong_buffer_length", "8", "--save_model", "false", "--plot", "false"]
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", str(ROOT / "examples" / "tool_r1.py"), *job]
    print("$ " + " ".join(command), flush=True)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    load_before = os.getloadavg()
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    wall = time.perf_counter() - start
    rc = os.waitstatus_to_exitcode(status)
    failures = [] if rc == 0 else [f"the job exited with {rc}"]
    result = {"command": " ".join(command), "busy_processes": args.busy, "wall_s": round(wall, 1),
              "peak_rss_kib": usage.ru_maxrss, "load_before": load_before, "load_after": os.getloadavg(),
              "cores": len(os.sched_getaffinity(0)), "exit_status": rc}
    metrics_file = Path(out) / "tool_r1_metrics.json"
    if rc == 0 and "--arm" not in args.extra:
        if not metrics_file.is_file():
            failures.append(f"no {metrics_file}")
        else:
            metrics = json.loads(metrics_file.read_text())
            result.update(timings_s=metrics["timings_s"], goals=metrics["goals"],
                          pass_at_1={k: v["pass@1"] for k, v in metrics["arms"].items() if v})
            if not args.smoke and not metrics["history"]:
                failures.append("the job logged no training step")
    print(f"wall {wall:.0f} s, peak RSS {usage.ru_maxrss / 1024:.0f} MiB ({usage.ru_maxrss * 1024 / 1e9:.2f} GB), "
          f"load average {load_before[0]:.2f} before, {result['load_after'][0]:.2f} after, {result['cores']} cores, "
          f"{args.busy} spinning process(es) alongside")
    for key in ("timings_s", "pass_at_1", "goals"):
        if key in result:
            print(f"{key}: {result[key]}")
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=1))
    return finish("tool_r1", failures)


if __name__ == "__main__":
    sys.exit(main())
