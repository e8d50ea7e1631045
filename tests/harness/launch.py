"""Run a script or a module on several CPU processes the way users launch multi-GPU jobs.

`accelerate launch --cpu --num_processes 2` silently runs ONE process; what works is
`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2` (gloo backend).

A launch whose rank aborted in gloo's teardown ("terminate called without an active exception", SIGABRT) is run once
more, with a warning (:func:`run_launch`): the abort is torch's, at interpreter exit, and rare (none in 57 launches of
the dynamic-sampling harness in a row; now and then in a whole suite's run). The exit handler
(``trl_rlvr._compat.gloo_exit``) destroys the group as PyTorch asks, but a transformers ``Trainer`` keeps the group
and its threads alive past that (measured on torch 2.13: ``pt_gloo_runloop`` and ``gloo_tcp_loop`` still run after
the handler, and after the trainer is deleted), so the handler cannot rule the abort out. A second abort fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import warnings
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
    return run_launch(cmd, cwd=cwd, env=env, timeout=timeout)


#: What a rank that gloo's teardown aborted leaves in the launch's stderr (libstdc++'s message; the launcher's report).
GLOO_EXIT_ABORT = ("terminate called without an active exception", f"exitcode: -{int(signal.SIGABRT)})")


def aborted_in_gloo_teardown(proc: subprocess.CompletedProcess) -> bool:
    """Whether a failed launch is a rank's abort in gloo's teardown, with no Python error on any rank before it (the
    launcher's own traceback, which reports the abort, comes after)."""
    if proc.returncode == 0 or not all(mark in proc.stderr for mark in GLOO_EXIT_ABORT):
        return False
    return "Traceback (most recent call last)" not in proc.stderr.split(GLOO_EXIT_ABORT[0])[0]


def run_launch(cmd, cwd, env, timeout: float) -> subprocess.CompletedProcess:
    """Run an ``accelerate launch`` command and assert that it succeeded; a launch a rank's abort in gloo's teardown
    failed is run once more (the module's docstring says why), with a warning naming it."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if aborted_in_gloo_teardown(proc):
        warnings.warn(f"a rank aborted in gloo's teardown; launching once more: {' '.join(map(str, cmd[-4:]))}",
                      stacklevel=2)
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc
