"""boxed_math: ``None`` means the checking machinery failed, proven each time. A check the pool lost (its worker died
under it, or no worker could start to take it) runs again on a fresh worker; lost again, a control check decides:
it fails too, the machinery failed (``None``: TRL leaves the answer out of the group's baseline, counted in
``boxed_math/infra_errors``); it passes, the answer broke its worker twice (an error, scored 0). Nothing shared by a
call (its length, how long workers take to start) turns a check into ``None``: answers that are slow to check score
0 on their own deadline and every other answer of the call is still checked. A worker that cannot start is counted
in ``boxed_math/worker_start_failures``, never raised."""

import os
import signal
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_plugins.boxed_math import boxed_math
from reward_plugins.boxed_math import pool as _pool
from reward_plugins.boxed_math.plugin import BoxedMathReward
from tests.harness.processes import wait_gone


def _call(reward, completions, golds):
    metrics = {}
    return reward(None, completions, answer=golds, log_metric=metrics.__setitem__), metrics


@pytest.fixture(scope="module")
def reward():
    return boxed_math(num_workers=1, prestart=False)


def test_workers_that_cannot_start_give_none_and_are_counted(monkeypatch, caplog):
    reward = boxed_math(num_workers=1, prestart=False)
    starts = []

    def cannot_start(self):
        starts.append(1)
        raise OSError("fork: resource temporarily unavailable")

    monkeypatch.setattr(_pool.DeadlinePool, "_new_worker", cannot_start)
    pool = reward._pool()
    for w in list(pool._workers):  # a fresh machine: no worker left from another test
        pool._drop(w)
    with caplog.at_level("WARNING", logger="reward_plugins.boxed_math"):
        out, metrics = _call(reward, [r"\boxed{7}", r"\boxed{8}", "no box"], ["7", "7", "7"])
    assert out == [None, None, 0.0]  # the answer without a box needs no check: a wrong answer still
    # the call, its re-run and the control check each tried start_attempts starts: counted, none raised
    assert len(starts) == 3 * pool.start_attempts
    assert metrics["boxed_math/worker_start_failures"] == 3 * pool.start_attempts
    assert metrics["boxed_math/infra_errors"] == 2 and metrics["boxed_math/errors"] == 0
    assert metrics["boxed_math/no_box"] == 1
    assert "2 of 3 answers not checked" in caplog.text


def _losing(real, loses, status="died"):
    """``_run`` that loses (the pool's ``(status, None)``) the tasks ``loses`` picks."""
    calls = []

    def run(self, tasks):
        calls.append([t[1][1] for t in tasks])
        out = real(self, tasks)
        return [(status, None) if loses(t, len(calls)) else r for t, r in zip(tasks, out)]

    return run, calls


@pytest.mark.parametrize("status", ["died", "unstarted"])
def test_a_check_lost_once_is_run_again(reward, monkeypatch, status):
    run, calls = _losing(BoxedMathReward._run, lambda task, n: n == 1, status)
    monkeypatch.setattr(BoxedMathReward, "_run", run)
    out, metrics = _call(reward, [r"\boxed{7}", r"\boxed{8}"], ["7", "7"])
    assert out == [1.0, 0.0] and len(calls) == 2
    assert metrics["boxed_math/errors"] == 0 and metrics["boxed_math/infra_errors"] == 0


@pytest.mark.parametrize("status", ["died", "unstarted"])
def test_a_check_lost_twice_while_the_control_passes_is_an_error(reward, monkeypatch, status):
    run, calls = _losing(BoxedMathReward._run, lambda task, n: task[1][1] == ("8",), status)
    monkeypatch.setattr(BoxedMathReward, "_run", run)
    out, metrics = _call(reward, [r"\boxed{7}", r"\boxed{8}"], ["7", "7"])
    assert out == [1.0, 0.0] and calls[-1] == [BoxedMathReward.CONTROL[1]]  # the control check ran, and passed
    assert metrics["boxed_math/errors"] == 1 and metrics["boxed_math/infra_errors"] == 0


@pytest.mark.parametrize("status", ["died", "unstarted"])
def test_checks_lost_with_the_control_are_the_machinery(reward, monkeypatch, status):
    run, calls = _losing(BoxedMathReward._run, lambda task, n: True, status)
    monkeypatch.setattr(BoxedMathReward, "_run", run)
    out, metrics = _call(reward, [r"\boxed{7}", r"\boxed{8}"], ["7", "7"])
    assert out == [None, None] and metrics["boxed_math/infra_errors"] == 2 and metrics["boxed_math/errors"] == 0
    assert len(calls) == 3 and calls[-1] == [BoxedMathReward.CONTROL[1]]


def test_answers_that_look_like_infrastructure_failures_are_wrong_answers(reward):
    """Text is never read as the machinery's failure: these are boxes that hold no right answer."""
    out, metrics = _call(reward, [r"\boxed{\text{worker died}}", r"\boxed{\text{reward workers unavailable}}",
                                  "reward workers failed to start", r"\boxed{\text{infra}}", r"\boxed{died}",
                                  r"\boxed{unstarted}"], ["7"] * 6)
    assert out == [0.0] * 6 and metrics["boxed_math/infra_errors"] == 0


# -- the real pool, with faults injected on the trainer's side ---------------------------------------------------
def fake_check(task):
    """A stand-in for math_check.check, run by the workers: ``slow...`` never ends (CPU), ``late<x>`` spins 0.05 CPU
    seconds and is then checked as ``x``; an answer is correct when it is the gold."""
    gold, final = task[0], task[1][-1]
    if final.startswith("slow"):
        while True:
            pass
    if final.startswith("late"):
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass
        final = final[4:]
    return "correct" if final == gold else "wrong"


class Faults:
    """Faults injected into a :class:`DeadlinePool` from the trainer's side, per reward call: ``starts``, consumed one
    per worker start (``fail``: no fork; ``mute``: forked, its hello never reaches the pool; ``slow``: 0.2 s late;
    ``ok``); ``kill_once``/``kill_always``: final answers whose worker is SIGKILLed (and dead) as their check is
    handed to it, the first time or every time."""

    def __init__(self, pool):
        self.starts, self.kill_once, self.kill_always, self.killed = [], set(), set(), set()
        real_new = pool._new_worker

        def new_worker():
            action = self.starts.pop(0) if self.starts else "ok"
            if action == "fail":
                raise OSError("fork: injected failure")
            if action == "slow":
                time.sleep(0.2)
            w = real_new()
            if action == "mute" and w.conn.poll(10):
                w.conn.recv()  # its hello, taken before the pool can read it
            w.tx = _KillingSender(w, self)
            return w

        pool._new_worker = new_worker

    def reset(self, starts=(), kill_once=(), kill_always=()):
        self.starts, self.kill_once, self.kill_always = list(starts), set(kill_once), set(kill_always)
        self.killed = set()


class _KillingSender:
    """A worker's sending end that kills the worker, and waits for its death, before it is sent a check that
    :class:`Faults` picks: the check is lost for certain (never answered)."""

    def __init__(self, worker, faults):
        self.worker, self.faults = worker, faults

    def send(self, msg):
        final = msg[1][1][-1] if isinstance(msg, tuple) else None
        f = self.faults
        if final is not None and (final in f.kill_always or (final in f.kill_once and final not in f.killed)):
            f.killed.add(final)
            os.kill(self.worker.pid, signal.SIGKILL)
            wait_gone(self.worker.pid)
        return self.worker.conn.send(msg)


@pytest.fixture(scope="module")
def faulty():
    """A boxed_math reward (a 0.2 CPU s deadline, 2 workers, a 1 s hello timeout) whose pool runs
    :func:`fake_check`, with :class:`Faults`; ``runs`` records each pool call of the reward (its tasks' final answers
    and results)."""
    pool = _pool.DeadlinePool(fake_check, 2)
    pool.hello_timeout = 1.0
    reward = boxed_math(num_workers=2, timeout=0.2, prestart=False)
    reward._pool = lambda: pool
    runs = []

    def run(tasks):
        out = pool.map(tasks, reward.timeout, reward.batch_timeout)
        runs.append(([t[1][1][-1] for t in tasks], out))
        return out

    reward._run = run
    faults = Faults(pool)
    yield reward, faults, runs
    pool.close()


def test_a_slow_start_after_a_timeout_costs_no_answer(faulty):
    """The attack, in small: a check that times out, and its worker's replacement slow to start (no hello in time,
    then a slow fork). The answers after it are still checked: nothing becomes None."""
    reward, faults, runs = faulty
    pool = reward._pool()
    pool.num_workers = 1  # no other worker to take the checks meanwhile
    for w in pool._workers[1:]:
        pool._drop(w)
    faults.reset(starts=["mute", "slow"])
    runs.clear()
    try:
        out, metrics = _call(reward, [r"\boxed{slow}", r"\boxed{1}", r"\boxed{2}", r"\boxed{4}"], ["0", "1", "2", "3"])
    finally:
        pool.num_workers = 2
    assert out == [0.0, 1.0, 1.0, 0.0]
    assert len(runs) == 1  # no check was lost: none needed a re-run
    assert metrics["boxed_math/timeouts"] == 1 and metrics["boxed_math/infra_errors"] == 0
    assert metrics["boxed_math/worker_start_failures"] == 1  # the mute one


@pytest.mark.parametrize("control_lost", [False, True], ids=["control-passes", "control-lost"])
def test_a_worker_killed_under_its_check(faulty, control_lost):
    """Killed once: the check runs again on a fresh worker and is scored. Killed every time: the control check
    decides (passes: an error, 0; killed too: the machinery, None)."""
    reward, faults, runs = faulty
    control = BoxedMathReward.CONTROL[1][-1]
    faults.reset(kill_once={"11"}, kill_always={"12", control} if control_lost else {"12"})
    runs.clear()
    out, metrics = _call(reward, [r"\boxed{11}", r"\boxed{12}", r"\boxed{13}"], ["11", "12", "13"])
    assert faults.killed >= {"11", "12"} and out[0] == 1.0 and out[2] == 1.0
    assert out[1] == (None if control_lost else 0.0)
    # the run, the re-run of what it lost (on this loaded machine a late hello may lose "13" too), the control
    assert len(runs) == 3 and runs[0][0] == ["11", "12", "13"] and {"11", "12"} <= set(runs[1][0])
    assert runs[2][0] == [control]
    assert metrics["boxed_math/infra_errors"] == int(control_lost) and metrics["boxed_math/errors"] == int(not control_lost)


_KINDS = ("right", "wrong", "slow", "late")


def _answer(kind: str, gold: str) -> str:
    return {"right": gold, "wrong": gold + "0", "slow": "slow" + gold, "late": "late" + gold}[kind]


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    kinds=st.lists(st.sampled_from(_KINDS), min_size=1, max_size=6).filter(lambda ks: ks.count("slow") <= 2),
    starts=st.lists(st.sampled_from(["ok", "fail", "mute", "slow"]), max_size=5),
    kills=st.lists(st.sampled_from(["none", "once", "always"]), min_size=6, max_size=6),
)
def test_none_only_when_the_machinery_is_proven_failing(faulty, kinds, starts, kills):
    """Random mixes of right, wrong, slow (past the deadline) and late (slow but within it) answers, with worker
    starts that fail, stay mute or are slow, and workers killed under a check once or every time. Always: the reward
    returns; a wrong or slow answer never scores 1.0; an answer is None only when its check was lost twice and the
    control check failed, and a right one scores 0.0 only when lost twice while the control passed. When fewer
    starts fail than a call may try and no check is killed every time, every answer scores exactly as it should."""
    reward, faults, runs = faulty
    golds = [str(10 + i) for i in range(len(kinds))]
    answers = [_answer(k, g) for k, g in zip(kinds, golds)]
    faults.reset(starts, {a for a, k in zip(answers, kills) if k == "once"},
                 {a for a, k in zip(answers, kills) if k == "always"})
    runs.clear()
    out, metrics = _call(reward, [rf"\boxed{{{a}}}" for a in answers], golds)

    lost_twice = {f for f, r in zip(*runs[1]) if r[0] in BoxedMathReward.LOST} if len(runs) > 1 else set()
    control = runs[2][1] if len(runs) > 2 else None  # the control check's result, when one ran
    control_passed = control == [("ok", "correct")]
    for kind, answer, score in zip(kinds, answers, out):
        expected = 1.0 if kind in ("right", "late") else 0.0
        if score is None:
            assert answer in lost_twice and control is not None and not control_passed
        elif score != expected:
            assert expected == 1.0 and score == 0.0 and answer in lost_twice and control_passed
    assert metrics["boxed_math/infra_errors"] == out.count(None)
    consumed = starts[: len(starts) - len(faults.starts)]
    assert metrics["boxed_math/worker_start_failures"] >= consumed.count("fail")  # a mute one may end in a later call
    # fewer failed starts than one pool call may try (injected, or a hello late on this loaded machine): no call ran
    # out of workers, so a check killed once is lost once
    if metrics["boxed_math/worker_start_failures"] < reward._pool().start_attempts and "always" not in kills[: len(kinds)]:
        assert out == [1.0 if k in ("right", "late") else 0.0 for k in kinds], (runs, metrics)


# -- the attack, at full size ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_many_answers_slow_to_check_then_right_ones_are_all_scored():
    """70 wrong answers that are slow to check, then 4 right ones, on 1 worker with a 1 s deadline: the call runs
    well past a minute. Every wrong one scores 0 (its own deadline), every right one 1.0, none None (an earlier
    pool turned the checks left after 60 s without a ready worker into None)."""
    reward = boxed_math(num_workers=1, timeout=1.0)
    roots = [k for k in range(2, 90) if int(k**0.5) ** 2 != k][:70]  # \sqrt{4} = 2 is told apart at once
    golds = [rf"\sqrt{{{k}}}" for k in roots] + ["7", "8", "9", "10"]
    completions = [r"\boxed{\sqrt{10^{10^{10}}}}"] * 70 + [rf"\boxed{{{g}}}" for g in golds[70:]]
    t = time.monotonic()
    out, metrics = _call(reward, completions, golds)
    assert out == [0.0] * 70 + [1.0] * 4, (out.count(None), time.monotonic() - t)
    assert metrics["boxed_math/infra_errors"] == 0 and metrics["boxed_math/errors"] == 0
    assert metrics["boxed_math/timeouts"] >= 60  # each on its own deadline (a few may be told apart in time)
