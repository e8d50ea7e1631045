"""Run a script on several CPU processes the way users launch multi-GPU jobs.

`accelerate launch --cpu --num_processes 2` silently runs ONE process; what works is
`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2` (gloo backend).
"""

from __future__ import annotations

import os
import subprocess
import sys


def launch_on_cpu(*script_and_args, num_processes: int = 2, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(num_processes),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           *map(str, script_and_args)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc
