"""A reward worker killed from outside (SIGKILL) in the middle of a batch: the samples it held run again on fresh
workers, so a worker killed once costs no sample; one whose worker is killed again on the retry, while a control
check passes, is judged as a sample that breaks its worker (0, counted in the reward's errors metric); the other
samples of the batch score as usual, and the next batch is scored by fresh workers as if nothing happened.
boxed_math's pool (reward_plugins.boxed_math.pool) and code_sandbox's pool (reward_plugins.code_sandbox.host.pool);
the attribution is the plugins' ``attribute``."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

from reward_plugins.boxed_math import boxed_math
from reward_plugins.boxed_math import pool as _pool
from tests.harness.processes import wait_gone

GOLDS = [str(n) for n in range(11, 19)]  # eight problems, each its own check task
RIGHT = [f"</think> \\boxed{{{g}}}" for g in GOLDS]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children first."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    out, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        out += children
        frontier = children
    return out


def _kill_workers_as_tasks_are_handed_out(kills: int, zygote_too: bool = False):
    """A trace that SIGKILLs the worker a task is about to be sent to, for the first ``kills`` tasks of the batch
    (and the zygote, with the first, when ``zygote_too``); it waits for each to be dead, so the task can never be
    answered. Returns (install, indices of the killed tasks)."""
    killed = []
    with open(_pool.__file__) as f:
        (send,) = [i for i, text in enumerate(f, 1) if "w.tx.send((w.token, tasks[i][1]))" in text]

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == send and len(killed) < kills:
            worker, task = frame.f_locals["w"], frame.f_locals["i"]
            victims = [worker.pid]
            if zygote_too and not killed:
                pool = frame.f_locals.get("self")
                victims += [pool._zygote.proc.pid] if isinstance(pool, _pool.DeadlinePool) else []
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            for pid in victims:
                wait_gone(pid, poll=0.01)
            killed.append(task)
        return local

    def install():
        sys.settrace(lambda frame, event, arg: local if frame.f_code is _pool.DeadlinePool._dispatch.__code__ else None)

    return install, killed


@pytest.mark.parametrize("zygote_too", [False, True], ids=["workers", "workers_and_zygote"])
def test_boxed_math_workers_killed_mid_batch_cost_no_sample(zygote_too):
    reward = boxed_math(num_workers=2, timeout=20.0)
    metrics = {}
    assert reward(completions=RIGHT, answer=GOLDS) == [1.0] * 8  # warm
    pool = reward._pool()
    install, killed = _kill_workers_as_tasks_are_handed_out(kills=2, zygote_too=zygote_too)
    install()
    try:
        rewards = reward(completions=RIGHT, answer=GOLDS, log_metric=metrics.__setitem__)
    finally:
        sys.settrace(None)
    assert len(killed) == 2
    # the killed workers' checks run again on fresh workers: no answer pays for a worker killed from outside
    assert rewards == [1.0] * 8
    assert metrics["boxed_math/errors"] == 0.0 and metrics["boxed_math/timeouts"] == 0.0
    assert metrics["boxed_math/infra_errors"] == 0.0
    assert pool.respawns >= 2
    again = {}
    assert reward(completions=RIGHT, answer=GOLDS, log_metric=again.__setitem__) == [1.0] * 8  # the next batch
    assert again["boxed_math/errors"] == 0.0 and len(pool._workers) == 2


# ------------------------------------------------------------------------------------------------ code_sandbox
ADD = "def add(a, b):\n    return a + b\n"
SLOW_ADD = "import time\n\ndef add(a, b):\n    time.sleep(3)\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3"]


def test_code_sandbox_worker_killed_while_running_a_sample_costs_that_sample_only(monkeypatch):
    from reward_plugins.code_sandbox import IsolationUnavailable, code_sandbox
    from reward_plugins.code_sandbox.host import pool as sandbox_pool

    try:
        reward = code_sandbox(num_workers=2, timeout=10.0)
        reward.pool.start()
    except IsolationUnavailable as e:
        pytest.skip(f"no sandbox here: {e}")
    try:
        run, killed = sandbox_pool._Worker.run, []

        def kill_tree(pid):  # the worker and everything under it (bwrap's sandboxed process is in its own session)
            for victim in [pid, *_descendants(pid)]:
                try:
                    os.kill(victim, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            killed.append(pid)

        def run_then_killed(self, job, limits):  # the slow sample's worker is SIGKILLed while it runs it
            if "time.sleep" in job.code:
                threading.Timer(0.5, kill_tree, (self.proc.pid,)).start()
            return run(self, job, limits)

        monkeypatch.setattr(sandbox_pool._Worker, "run", run_then_killed)
        metrics = {}
        rewards = reward(prompts=[""] * 4, completions=[ADD, SLOW_ADD, ADD, ADD], tests=[TESTS] * 4,
                         log_metric=metrics.__setitem__)
        # killed on its run and again on its retry on a fresh worker, while the control sample passes: from the
        # host this is a sample that breaks its worker, a wrong answer (code_sandbox.plugin's attribute)
        assert len(killed) == 2
        assert rewards == [1.0, 0.0, 1.0, 1.0]
        assert metrics == {"code_sandbox/timeouts": 0.0, "code_sandbox/errors": 1.0, "code_sandbox/infra_errors": 0.0,
                           "code_sandbox/worker_start_failures": 0.0}
        assert reward.pool.restarts >= 1
        monkeypatch.setattr(sandbox_pool._Worker, "run", run)
        again = {}
        assert reward(prompts=[""] * 4, completions=[ADD] * 4, tests=[TESTS] * 4,
                      log_metric=again.__setitem__) == [1.0] * 4
        assert again["code_sandbox/errors"] == 0.0
    finally:
        reward.close()
