"""One main job as a user launches it, measured: ``accelerate launch --num_processes 1 examples/SCRIPT.py ...``.

Shared by ``benchmarks.tool_r1`` (the second main job) and ``benchmarks.shared_cores`` (each main job quiet and
with cores busy, back to back). The job runs once; its wall time, the peak RSS of the largest process of the tree
(``wait4``'s ``ru_maxrss`` over the launcher and the job it waited for, as ``/usr/bin/time -v`` reports it) and
the load average before and after are recorded. ``busy`` pure-Python spinning processes run alongside (one core
taken by another process each).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def launch_job(script: str, job_args: list[str], busy: int = 0, python: str = sys.executable) -> dict:
    """Run ``examples/{script}.py`` (or, for a dotted name, the module ``script``: ``benchmarks.tool_arms``) once
    under ``accelerate launch`` of ``python`` with ``busy`` spinners alongside. -> the command, wall seconds, peak RSS
    (KiB), loads, cores and the exit status."""
    target = ["-m", script] if "." in script else [str(ROOT / "examples" / f"{script}.py")]
    command = [python, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", *target, *job_args]
    print("$ " + " ".join(command), flush=True)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
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
    result = {"command": " ".join(command), "busy_processes": busy, "wall_s": round(wall, 1),
              "peak_rss_kib": usage.ru_maxrss, "load_before": load_before, "load_after": os.getloadavg(),
              "cores": len(os.sched_getaffinity(0)), "exit_status": os.waitstatus_to_exitcode(status)}
    print(f"wall {wall:.0f} s, peak RSS {usage.ru_maxrss / 1024:.0f} MiB ({usage.ru_maxrss * 1024 / 1e9:.2f} GB), "
          f"load average {load_before[0]:.2f} before, {result['load_after'][0]:.2f} after, {result['cores']} cores, "
          f"{busy} spinning process(es) alongside", flush=True)
    return result


def tool_job_smoke_args(out: Path, hidden_size: int = 64) -> list[str]:
    """Arguments that make the tool job (``examples/tool_r1.py``, ``benchmarks.tool_arms``) a smoke run: its ``--smoke`` mode on a tiny random model with
    ChatML tokens (``trl_rlvr.testing.build_tiny_chatml_model``, built under ``out`` once), seconds to minutes.
    ``hidden_size=256``: heads of 64, a size vLLM's CPU attention takes."""
    model = out / f"tiny_model_{hidden_size}"
    if not model.is_dir():
        from trl_rlvr.testing import build_tiny_chatml_model

        model = build_tiny_chatml_model(model, hidden_size=hidden_size)
    return ["--smoke", "--model_name_or_path", str(model), "--max_completion_length", "24",
            "--overlong_buffer_length", "8", "--save_model", "false", "--plot", "false"]
