"""A parent that exits while boxed_math's worker zygote warms up leaves no BrokenPipeError traceback under its own
error. Deterministic form: the zygote finds its parent's end of the control socket already closed."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_zygote_whose_parent_is_gone_exits_quietly():
    code = (
        "import socket; from reward_plugins.boxed_math.pool import _zygote\n"
        "parent, child = socket.socketpair()\n"
        "parent.close()  # the parent exited during the warm-up\n"
        "_zygote(child.detach(), 'reward_plugins.boxed_math.math_check:check', [])\n"
        "print('zygote returned')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert "BrokenPipeError" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert "zygote returned" in run.stderr + run.stdout  # its stdout is dup'ed onto stderr
