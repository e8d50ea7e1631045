"""boxed_math's worker pool: a call interrupted while tasks are in flight (an exception raised in the calling
thread by a trace point, another thread, or a signal handler) leaves the pool exactly as healthy as before, and
every worker runs under a memory bound (a check that exhausts it scores 0, is counted, and the pool survives)."""

import ctypes
import itertools
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_plugins.boxed_math import boxed_math
from reward_plugins.boxed_math import pool as _pool
from reward_plugins.boxed_math.pool import DeadlinePool


class Interrupt(BaseException):
    """What a signal handler or a trainer's timeout raises: not an Exception."""


def echo(payload):
    """The pool handler of these tests: ``(value, seconds)`` -> ``value * 2`` after sleeping."""
    value, seconds = payload
    time.sleep(seconds)
    return value * 2


_values = itertools.count(1)


def batch(n=5, seconds=0.02):
    """Tasks with values never used before (a stale reply can never look right), and their expected results."""
    values = [next(_values) for _ in range(n)]
    tasks = [(v % 2, (v, seconds * (1 + v % 3))) for v in values]
    return tasks, [("ok", 2 * v) for v in values]


def zygote_children(pool):
    zygote = pool._zygote.proc.pid
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == zygote and fields[0] != "Z":
                kids.append(int(entry))
    return kids


def assert_healthy(pool):
    """The next calls give exactly what a fresh pool gives, and no worker beyond num_workers is left running."""
    for _ in range(2):
        tasks, expected = batch()
        assert pool.map(tasks, deadline=5.0) == expected
    assert len(pool._workers) == pool.num_workers
    give_up = time.monotonic() + 5
    while len(zygote_children(pool)) > pool.num_workers and time.monotonic() < give_up:
        time.sleep(0.05)
    assert sorted(zygote_children(pool)) == sorted(w.pid for w in pool._workers)


@pytest.fixture(scope="module")
def pool():
    p = DeadlinePool(echo, 2)
    tasks, expected = batch()
    assert p.map(tasks, deadline=5.0) == expected  # up and warm
    yield p
    p.close()


#: Where an interruption can land: the pool, and the framing and socket code it calls (a message half read).
_TRACED = {_pool.__file__, multiprocessing.connection.__file__, socket.__file__}


#: ``DeadlinePool.map`` itself: it only takes the lock and runs the call in ``try/finally``. A trace function
#: that raises on one of its own lines can leave a ``with`` block without ``__exit__`` (the exception is
#: attributed outside the block), which a signal or an asynchronous exception cannot: since CPython 3.10
#: pending exceptions are checked only after calls and on backward jumps, so that ``__exit__`` always runs
#: once ``__enter__`` succeeded (bpo-29988). Its lines are covered by the thread and signal tests below; every
#: line it calls into is fuzzed here.
_MAP_CODE = DeadlinePool.map.__code__


def _interrupt_at_line(pool, tasks, nth, again):
    """Run ``pool.map(tasks)`` raising Interrupt at the ``nth`` line executed in :data:`_TRACED` (and, if
    ``again``, once more ``again`` lines later, e.g. inside the clean-up). Returns whether it was interrupted."""
    count, raised = 0, []

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if count == nth or (again and raised and count == nth + again):
                raised.append(count)
                raise Interrupt(f"line {count}")
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename in _TRACED and frame.f_code is not _MAP_CODE else None


    sys.settrace(tracer)
    try:
        pool.map(tasks, deadline=5.0)
    except Interrupt:
        pass
    finally:
        sys.settrace(None)
    return bool(raised), count


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.integers(1, 1000), st.one_of(st.none(), st.integers(1, 80)))  # a whole call: about 700 lines
def test_interrupted_at_any_line_the_next_calls_are_those_of_a_fresh_pool(pool, nth, again):
    tasks, _ = batch(seconds=0.01)
    _interrupt_at_line(pool, tasks, nth, again)
    assert_healthy(pool)


def test_an_interruption_right_after_dispatch_leaves_no_reply_for_the_next_call(pool):
    """The deterministic form: interrupted just after the first tasks were sent; the next call's results are
    its own (on the old pool, the late replies were taken as the next call's results at the same index)."""
    tasks, _ = batch(seconds=0.3)
    _interrupted_in_flight(lambda: pool.map(tasks, deadline=5.0))
    assert_healthy(pool)


def _interrupted_in_flight(call) -> None:
    """Run ``call()`` raising Interrupt in the pool's wait loop (:func:`_wake_line`), once the first tasks are
    out; fails unless the interruption reached the caller."""
    wake = _wake_line()

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == wake:
            raise Interrupt("tasks in flight")
        return local

    sys.settrace(lambda frame, event, arg: local if frame.f_code.co_name == "_run" else None)
    try:
        with pytest.raises(Interrupt):
            call()
    finally:
        sys.settrace(None)


def _wake_line() -> int:
    """The line of the pool's wait loop: reached once the first tasks have been sent."""
    with open(_pool.__file__) as f:
        (line,) = [i for i, text in enumerate(f, 1) if "while remaining:" in text]
    return line


def _async_raise(thread_id: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(Interrupt))


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.floats(0.0, 0.25))
def test_interrupted_from_another_thread(pool, delay):
    tasks, _ = batch(seconds=0.05)
    target = threading.get_ident()
    timer = threading.Timer(delay, _async_raise, (target,))
    try:
        timer.start()
        try:
            pool.map(tasks, deadline=5.0)
            timer.join()
            time.sleep(0.01)  # the exception lands at the next bytecode if the call was already over
        except Interrupt:
            pass
    except Interrupt:
        pass
    finally:
        timer.cancel()
    assert_healthy(pool)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread only")
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.floats(0.001, 0.25))
def test_interrupted_by_a_signal_handler(pool, delay):
    def handler(signum, frame):
        raise Interrupt("SIGALRM")

    old = signal.signal(signal.SIGALRM, handler)
    tasks, _ = batch(seconds=0.05)
    try:
        signal.setitimer(signal.ITIMER_REAL, delay)
        try:
            pool.map(tasks, deadline=5.0)
            time.sleep(delay + 0.01)
        except Interrupt:
            pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert_healthy(pool)


def test_a_reply_with_another_token_is_never_taken(pool):
    """A reply is matched to its task by the (call, task) token the worker echoes, not by its position."""
    tasks, expected = batch(n=1)
    w = pool._workers[0]
    w.task, w.token = 0, (-1, 0)  # pretend the worker is busy with a task of another call
    w.tx.send(((-1, 0), (10**9, 0.0)))  # whose reply (2e9) then arrives first
    w.task = w.token = None
    stale = pool.stale_replies
    assert pool.map(tasks, deadline=5.0) == expected
    assert pool.stale_replies == stale + 1  # read during this call, discarded, never taken as a result
    assert_healthy(pool)


# -- boxed_math: an interrupted call, then a wrong answer at the same index ---------------------------------
def test_boxed_math_interrupted_call_does_not_leak_its_verdicts():
    reward = boxed_math(num_workers=2, timeout=5.0)
    assert reward(None, [r"\boxed{1}"], answer=["1"]) == [1.0]
    right = [r"\boxed{(x^2+2x+1)^{3}}", r"\boxed{0.5}", r"\boxed{(x+1)^{2}(x+1)}"]
    golds = [r"(x+1)^{6}", r"\frac12", r"(x+1)^3"]
    _interrupted_in_flight(lambda: reward(None, right, answer=golds))
    wrong = [r"\boxed{(x^2+2x+1)^{4}}", r"\boxed{\frac{3}{4}}", r"\boxed{(x+1)^{2}}"]
    assert reward(None, wrong, answer=golds) == [0.0, 0.0, 0.0]
    assert reward(None, right, answer=golds) == [1.0, 1.0, 1.0]


# -- the memory bound ---------------------------------------------------------------------------------------
#: Expands into ever larger coefficients: on a 2-core machine it passes 500 MB within 5 CPU seconds and
#: 1 GB before 30 (unbounded), while every form rule reads it as one answer.
HOSTILE = r"\boxed{(x^2+2x+1)^{50000}}"
HOSTILE_GOLD = r"(x+1)^{100000}"


def _rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def test_an_answer_that_exhausts_the_memory_bound_scores_0_and_the_pool_survives():
    bound = 256
    reward = boxed_math(num_workers=1, timeout=60.0, memory_limit_mb=bound)
    assert reward(None, [r"\boxed{3}"], answer=["3"]) == [1.0]
    pool = reward._pool()
    peaks: dict[int, float] = {}
    total = [0.0]
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            pids = pool.pids()
            rss = {p: _rss_mib(p) for p in pids}
            for p, r in rss.items():
                peaks[p] = max(peaks.get(p, 0.0), r)
            total[0] = max(total[0], sum(rss.values()))
            time.sleep(0.01)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    metrics = {}
    try:
        out = reward(None, [HOSTILE, r"\boxed{\frac{1}{2}}", r"\boxed{(x+1)^{100000}}"],
                     answer=[HOSTILE_GOLD, r"0.5", HOSTILE_GOLD], log_metric=metrics.__setitem__)
    finally:
        stop.set()
        watcher.join()
    assert out == [0.0, 1.0, 1.0]  # the correct answers beside it still score 1.0
    assert metrics["boxed_math/oom"] == 1 and metrics["boxed_math/timeouts"] == 0
    zygote = pool._zygote.proc.pid
    workers = {p: r for p, r in peaks.items() if p != zygote}
    assert max(workers.values()) > bound / 2  # it did allocate up to the bound ...
    assert all(r < bound for r in workers.values())  # ... and no further
    assert total[0] < pool.num_workers * bound + peaks[zygote] + 1
    # the pool survives: the next samples, on the worker that replaced it, are scored as usual
    assert reward(None, [r"\boxed{2}", r"\boxed{3}"], answer=["3", "3"]) == [0.0, 1.0]


def test_memory_bound_option_is_validated():
    for bad in (0, 100, -1, 512.0, True, "1024"):
        with pytest.raises(ValueError, match="memory_limit_mb"):
            boxed_math(memory_limit_mb=bad, prestart=False)
    assert boxed_math(memory_limit_mb=2048, prestart=False).memory_limit_mb == 2048
