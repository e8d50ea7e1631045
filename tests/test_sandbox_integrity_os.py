"""Reward integrity, OS layer (issue 11): classes closed by design, each with a hostile sample, a
correct one beside it that must still score 1.0, and a later sample on the same worker that must
be scored correctly.

* seccomp default-deny allowlist: no syscall reaches another process (prlimit64, scheduling,
  priority, signals, ...), and the stdlib modules solutions use still work on every path;
* a worker cannot be poisoned silently: it checks its own and its tester's limits, affinity and
  priority after every job, and a child that dies before its lockdown is an internal error;
* uids, cgroups and scratch dirs are unique per pool (a random id claimed exclusively, never the
  pid), and what a SIGKILLed host left behind is reclaimed at the next start;
* the cleanup of a file flood is bounded: a sample that leaves more than can be removed in time
  costs its worker (replaced, counted as an error), never the next sample's time.
"""

import os
import sys

import pytest

from reward_plugins.code_sandbox import code_sandbox
from reward_plugins.code_sandbox.pool import Job

sys.path.insert(0, os.path.dirname(__file__))
import stdlib_probe  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

CORRECT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]


@pytest.fixture(scope="module")
def one_worker():
    """One worker, so that "the next sample" runs where the hostile one ran."""
    f = code_sandbox(num_workers=1, timeout=3.0)
    f.pool.start()
    yield f
    f.close()


def _probe_jobs(reward):
    prog = stdlib_probe.PROGRAM
    asserts = [f"assert step({s!r})" for s in stdlib_probe.STEPS]
    values = reward._job(prog, 0, {"tests": [asserts]})
    tester = reward._job(prog, 0, {"tests": [asserts], "test_setup_code": ["SETUP = 1"]})
    io = reward._job(prog, 0, {"io_tests": [[{"input": s, "output": f"{s} True"} for s in stdlib_probe.STEPS]]})
    assert (values.mode, tester.mode, io.mode) == ("values", "call", "io")
    return {"values": values, "tester": tester, "io": io}


def test_stdlib_modules_solutions_use_work_on_every_path(one_worker):
    """Threads with a big stack, clocks, randomness, files, mmap, signals to itself, rlimits of its
    own, polling, the pure-Python modules: each step is one test, on the value path, the tester path
    and the io path; and what no solution needs (sockets, processes, other pids) stays refused."""
    jobs = _probe_jobs(one_worker)
    outs = one_worker.pool.run(list(jobs.values()))
    failed = {path: [s for s, ok in zip(stdlib_probe.STEPS, out.passed) if not ok] for path, out in zip(jobs, outs)}
    assert failed == {"values": [], "tester": [], "io": []}
    assert [o.error for o in outs] == [None, None, None]
    assert one_worker(prompts=[""], completions=[CORRECT], tests=[TESTS]) == [1.0]
