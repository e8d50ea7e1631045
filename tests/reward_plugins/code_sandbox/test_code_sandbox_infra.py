"""The sandbox's own machinery failing is not a wrong answer: a sample it failed to judge scores ``None`` (TRL leaves
it out of the group's baseline and gives it no advantage) and counts in ``code_sandbox/infra_errors``; a sample that
fails inside a working sandbox (crashes, times out, raises or prints what looks like an infrastructure failure,
breaks its worker every time) is a wrong answer, scored 0 as before. The attribution is by reproduction (the job
again on a fresh worker, then a control sample), never by what an error says."""

import time

import pytest

from reward_plugins.code_sandbox import code_sandbox
from reward_plugins.code_sandbox.host import launcher
from reward_plugins.code_sandbox.host import pool as sandbox_pool

ADD = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]


def _call(reward, completions, **columns):
    metrics = {}
    columns = columns or {"tests": [TESTS] * len(completions)}
    out = reward(prompts=[""] * len(completions), completions=completions, log_metric=metrics.__setitem__, **columns)
    return out, metrics


@pytest.fixture
def reward():
    f = code_sandbox(num_workers=1, timeout=2.0)
    yield f
    f.close()


def _metrics(timeouts=0.0, errors=0.0, infra=0.0, start_failures=0.0):
    return {"code_sandbox/timeouts": timeouts, "code_sandbox/errors": errors, "code_sandbox/infra_errors": infra,
            "code_sandbox/worker_start_failures": start_failures}


def test_a_sandbox_that_cannot_start_scores_none_and_counts_infra_errors(reward, monkeypatch, caplog):
    starts = []

    def cannot_start(self, *a, **k):
        starts.append(1)
        raise OSError("cgroup: no space left on device")

    monkeypatch.setattr(sandbox_pool._Worker, "__init__", cannot_start)
    with caplog.at_level("WARNING", logger="reward_plugins.code_sandbox"):
        out, metrics = _call(reward, [ADD, WRONG])
    assert out == [None, None]
    # each sample tried, tried again, then the control sample: 2 + 2 + 1 starts, all counted, none raised
    assert len(starts) == 5 and metrics == _metrics(infra=2.0, start_failures=5.0)
    assert "could not start" in caplog.text and "2 of 2 samples not judged" in caplog.text
    # a row without tests is not applicable (None) but no infrastructure failure
    assert reward(prompts=[""], completions=[ADD]) == [None]


def test_a_pool_that_cannot_be_built_scores_none(reward, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no pool claim")

    monkeypatch.setattr("reward_plugins.code_sandbox.plugin.SandboxPool", broken)
    out, metrics = _call(reward, [ADD])
    assert out == [None] and metrics["code_sandbox/infra_errors"] == 1.0


def test_a_worker_lost_once_is_retried_and_the_sample_judged(reward, monkeypatch):
    run, lost = sandbox_pool._Worker.run, []

    def lose_the_first(self, job, limits):
        if not lost:
            lost.append(job.code)
            raise EOFError("worker closed its channel")
        return run(self, job, limits)

    monkeypatch.setattr(sandbox_pool._Worker, "run", lose_the_first)
    out, metrics = _call(reward, [ADD, WRONG])
    assert lost and out == [1.0, 0.0]
    assert metrics == _metrics()
    assert reward.pool.restarts >= 1


def test_a_worker_failing_for_every_sample_is_the_machinery(reward, monkeypatch):
    def host_timeout(self, job, limits):
        raise TimeoutError("no end of results or no reply before the deadline")

    monkeypatch.setattr(sandbox_pool._Worker, "run", host_timeout)
    out, metrics = _call(reward, [ADD, WRONG])
    assert out == [None, None] and metrics["code_sandbox/infra_errors"] == 2.0 and metrics["code_sandbox/errors"] == 0


def test_a_sample_that_breaks_its_worker_every_time_is_a_wrong_answer(reward, monkeypatch):
    """Indistinguishable from a sample that kills its worker: the control sample passes, so the sandbox works."""
    run, broken = sandbox_pool._Worker.run, []

    def breaks_on_marker(self, job, limits):
        if "BREAKS_ITS_WORKER" in job.code:
            broken.append(1)
            raise EOFError("worker closed its channel")
        return run(self, job, limits)

    monkeypatch.setattr(sandbox_pool._Worker, "run", breaks_on_marker)
    out, metrics = _call(reward, [ADD + "# BREAKS_ITS_WORKER\n", ADD])
    assert len(broken) == 2  # its run and the retry on a fresh worker
    assert out == [0.0, 1.0]
    assert metrics == _metrics(errors=1.0)


def test_a_worker_that_misses_its_hello_is_counted_never_raised(reward, monkeypatch):
    """A worker that sends no hello in time (a loaded machine, or a broken one) is counted in
    ``code_sandbox/worker_start_failures`` and the reward returns, in bounded time: START_ATTEMPTS x num_workers
    starts per pool call (the run, the re-run, the control sample), each at most HELLO_TIMEOUT."""
    monkeypatch.setattr(launcher.SandboxedServer, "HELLO_TIMEOUT", 0.3)
    monkeypatch.setattr(sandbox_pool.launcher, "worker_command", lambda *a, **k: ["/bin/sleep", "30"])
    t = time.monotonic()
    out, metrics = _call(reward, [ADD, WRONG, ADD])
    assert out == [None, None, None]
    assert metrics == _metrics(infra=3.0, start_failures=2.0 + 2.0 + 1.0)
    assert time.monotonic() - t < 5 * (0.3 + 2.0)  # five starts, each its hello timeout plus a kill
    monkeypatch.undo()  # a worker that starts again: the same reward scores as usual
    assert _call(reward, [ADD, WRONG]) == ([1.0, 0.0], _metrics())


@pytest.mark.parametrize("control_starts", [True, False], ids=["control-passes", "control-cannot-start"])
def test_a_rerun_whose_worker_cannot_start_is_decided_by_the_control(reward, monkeypatch, control_starts):
    """The worker is lost while running the sample, and its re-run finds no worker that starts: the control
    sample decides. It passes: the machinery works, so the sample is scored (0, an error: a sample that loses its
    worker and then its replacement). It cannot start either: the machinery failed, None."""
    run, init, events = sandbox_pool._Worker.run, sandbox_pool._Worker.__init__, []

    def lose_the_first(self, job, limits):
        if "lost" not in events:
            events.append("lost")
            raise EOFError("worker closed its channel")
        return run(self, job, limits)

    def start(self, *a, **k):
        if "lost" in events and (events.count("start failed") < 1 or not control_starts):
            events.append("start failed")
            raise OSError("fork: resource temporarily unavailable")
        return init(self, *a, **k)

    monkeypatch.setattr(sandbox_pool._Worker, "run", lose_the_first)
    monkeypatch.setattr(sandbox_pool._Worker, "__init__", start)
    out, metrics = _call(reward, [ADD])
    if control_starts:
        assert events == ["lost", "start failed"] and out == [0.0]
        assert metrics == _metrics(errors=1.0, start_failures=1.0)
    else:
        assert events == ["lost", "start failed", "start failed"] and out == [None]
        assert metrics == _metrics(infra=1.0, start_failures=2.0)


#: Programs that fail in ways that look like the machinery's (exit statuses of a kill, messages and records of the
#: host's protocol): each runs in a working sandbox, so each is a wrong answer.
LOOKALIKES = {
    "timeout-error": "raise TimeoutError('sandbox worker timed out: no reply before the deadline')",
    "worker-lost": "raise ConnectionResetError('worker closed its channel: worker lost')",
    "memory-error": "raise MemoryError()",
    "sigkill-self": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "exit-137": "import sys\nsys.exit(137)",
    "internal-records": ("import os, json\nfor fd in range(3, 64):\n    try:\n        os.write(fd, json.dumps({'internal': "
                         "'worker died', 'timeout': True}).encode() + b'\\n')\n    except OSError:\n        pass\nos._exit(0)"),
    "isolation-unavailable": "raise RuntimeError('IsolationUnavailable: bubblewrap could not start the sandbox')",
}


@pytest.mark.parametrize("path", ["values", "check", "io"])
def test_programs_that_look_like_infrastructure_failures_score_zero(reward, path):
    programs = [code + "\n" + ADD for code in LOOKALIKES.values()]
    if path == "values":
        columns = {"tests": [TESTS] * len(programs)}
    elif path == "check":
        columns = {"test": ["def check(candidate):\n    assert candidate(1, 2) == 3\n"] * len(programs),
                   "entry_point": ["add"] * len(programs)}
    else:
        programs = [code + "\nprint(3)\n" for code in LOOKALIKES.values()]
        columns = {"io_tests": [[{"input": "", "output": "3\n"}]] * len(programs)}
    out, metrics = _call(reward, programs, **columns)
    assert out == [0.0] * len(programs), dict(zip(LOOKALIKES, out))
    assert metrics["code_sandbox/infra_errors"] == 0.0


def test_the_control_sample_passes_on_a_working_sandbox(reward):
    (outcome,) = reward.pool.run([reward.control_job()])
    assert outcome.error is None and outcome.passed == [True]
