"""Run a script or a module on several CPU processes the way users launch multi-GPU jobs.

`accelerate launch --cpu --num_processes 2` silently runs ONE process; what works is
`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2` (gloo backend).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A free TCP port on loopback (parallel test workers must not share accelerate's default 29500)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_on_cpu(*script_and_args, num_processes: int = 2, timeout: float = 600, cwd=REPO) -> subprocess.CompletedProcess:
    """`accelerate launch` on CPU processes: ``script_and_args`` is a script path and its arguments, or
    ``"--module", "tests.<harness>", ...`` for a test harness (run as ``python -m`` from the repository root)."""
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(num_processes),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), *map(str, script_and_args)]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc
