"""boxed_math: an answer its checking machinery failed to check is not a wrong answer. No worker could start, or its
worker died twice while a control check fails too: ``None`` (TRL leaves it out of the group's baseline), counted in
``boxed_math/infra_errors``. A worker that died once: the check runs again. An answer whose worker dies every time
while the control check passes: an error, scored 0 (as a check that raises, times out or runs out of memory)."""

import pytest

from reward_plugins.boxed_math import boxed_math
from reward_plugins.boxed_math import pool as _pool
from reward_plugins.boxed_math.plugin import BoxedMathReward


def _call(reward, completions, golds):
    metrics = {}
    return reward(None, completions, answer=golds, log_metric=metrics.__setitem__), metrics


@pytest.fixture(scope="module")
def reward():
    return boxed_math(num_workers=1, prestart=False)


def test_workers_that_cannot_start_give_none_and_count_infra_errors(monkeypatch, caplog):
    reward = boxed_math(num_workers=1, prestart=False)

    def cannot_start(self):
        raise OSError("fork: resource temporarily unavailable")

    monkeypatch.setattr(_pool.DeadlinePool, "_ensure_workers", cannot_start)
    with caplog.at_level("WARNING", logger="reward_plugins.boxed_math"):
        out, metrics = _call(reward, [r"\boxed{7}", r"\boxed{8}", "no box"], ["7", "7", "7"])
    assert out == [None, None, 0.0]  # the answer without a box needs no check: a wrong answer still
    assert metrics["boxed_math/infra_errors"] == 2 and metrics["boxed_math/errors"] == 0
    assert metrics["boxed_math/no_box"] == 1
    assert "2 of 3 answers not checked" in caplog.text


def _dying(real, dies):
    """``_run`` whose worker dies (the pool's ``("error", "worker died")``) for the tasks ``dies`` picks."""
    calls = []

    def run(self, tasks):
        calls.append([t[1][1] for t in tasks])
        out = real(self, tasks)
        return [("error", "worker died") if dies(t, len(calls)) else r for t, r in zip(tasks, out)]

    return run, calls


def test_a_worker_that_died_once_is_retried(reward, monkeypatch):
    run, calls = _dying(BoxedMathReward._run, lambda task, n: n == 1)
    monkeypatch.setattr(BoxedMathReward, "_run", run)
    out, metrics = _call(reward, [r"\boxed{7}", r"\boxed{8}"], ["7", "7"])
    assert out == [1.0, 0.0] and len(calls) == 2
    assert metrics["boxed_math/errors"] == 0 and metrics["boxed_math/infra_errors"] == 0


def test_an_answer_that_kills_its_worker_every_time_is_an_error(reward, monkeypatch):
    run, calls = _dying(BoxedMathReward._run, lambda task, n: task[1][1] == ("8",))
    monkeypatch.setattr(BoxedMathReward, "_run", run)
    out, metrics = _call(reward, [r"\boxed{7}", r"\boxed{8}"], ["7", "7"])
    assert out == [1.0, 0.0] and calls[-1] == [BoxedMathReward.CONTROL[1]]  # the control check ran, and passed
    assert metrics["boxed_math/errors"] == 1 and metrics["boxed_math/infra_errors"] == 0


def test_workers_dying_for_every_check_are_the_machinery(reward, monkeypatch):
    run, calls = _dying(BoxedMathReward._run, lambda task, n: True)
    monkeypatch.setattr(BoxedMathReward, "_run", run)
    out, metrics = _call(reward, [r"\boxed{7}", r"\boxed{8}"], ["7", "7"])
    assert out == [None, None] and metrics["boxed_math/infra_errors"] == 2 and metrics["boxed_math/errors"] == 0


def test_answers_that_look_like_infrastructure_failures_are_wrong_answers(reward):
    """Text is never read as the machinery's failure: these are boxes that hold no right answer."""
    out, metrics = _call(reward, [r"\boxed{\text{worker died}}", r"\boxed{\text{reward workers unavailable}}",
                                  "reward workers failed to start", r"\boxed{\text{infra}}"], ["7"] * 4)
    assert out == [0.0] * 4 and metrics["boxed_math/infra_errors"] == 0
