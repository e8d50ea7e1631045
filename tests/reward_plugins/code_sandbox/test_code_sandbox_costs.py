"""code_sandbox: what a hostile sample may cost the host is bounded by design, not by ``timeout``.

* Value path: the records one sample sends are capped at ``max_value_bytes`` (default 64 KiB); past it the
  sample is void and the host stops reading, so host parsing is bounded by the cap.
* io path: all cases of one sample share one wall budget, ``sample_timeout`` (default ``timeout``).
* io path: the host reads a case's stdout only up to what could match the expected output.

Each hostile sample runs beside a correct one (1.0), then a correct and a wrong sample on the same worker are
scored exactly. (The costs themselves are measured by ``python -m benchmarks.sandbox_costs``.)
"""

import sys

import pytest

pytest.importorskip("reward_plugins.code_sandbox")
from reward_plugins.code_sandbox import code_sandbox  # noqa: E402
from reward_plugins.code_sandbox.sandbox import protocol  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

TIMEOUT = 1.0
CORRECT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
IO_MAIN = "a, b = map(int, input().split())\nprint(a + b)\n"
IO_WRONG = "a, b = map(int, input().split())\nprint(a - b)\n"
IO_CASES = [{"input": f"{k} {k}\n", "output": f"{2 * k}\n"} for k in range(1, 7)]


@pytest.fixture(scope="module")
def reward():
    f = code_sandbox(num_workers=1, timeout=TIMEOUT)  # one worker: every sample follows the previous one there
    f.pool.start()
    yield f
    f.close()


def _values_then_right(reward):
    assert reward(completions=[CORRECT, WRONG], tests=[TESTS] * 2) == [1.0, 0.0]


def _io_then_right(reward):
    assert reward(completions=[IO_MAIN, IO_WRONG], io_tests=[IO_CASES] * 2) == [1.0, 0.0]


# ---------------------------------------------------------------- value records: capped
OWN_RECORD = """
import os
record = b'{"i":0,"v":[' + b",".join([b"0"] * %d) + b']}\\n{"i":1,"v":3}\\n{"i":2,"v":0}\\n'
for fd in range(3, 64):
    try:
        os.write(fd, record)
    except OSError:
        pass
os._exit(0)
"""


def test_a_value_record_past_the_cap_voids_the_sample(reward):
    """The truthy assert passes with any non-empty list: 100 K zeros pass it, but their record (200 KB) is past
    the cap, so the sample is void and never parsed; 1 K zeros (2 KB) pass."""
    big, small = (f"def f():\n    return [0] * {n}\n" for n in (100_000, 1_000))
    errors = []
    got = reward(completions=[big, small], tests=[["assert f()"]] * 2, log_metric=lambda k, v: errors.append((k, v)))
    assert got == [0.0, 1.0]
    assert ("code_sandbox/errors", 1.0) in errors
    _values_then_right(reward)


@pytest.mark.parametrize("zeros", [40_000, 4_000_000])
def test_a_program_writing_its_own_huge_record_scores_zero(reward, zeros):
    """The candidate holds the value pipe and may write to it what it likes (here records that every test
    would pass): past the cap it is void, and the pool stays exact."""
    hostile = CORRECT + OWN_RECORD % zeros
    assert reward(completions=[hostile, CORRECT], tests=[["assert add(1, 2)", *TESTS]] * 2) == [0.0, 1.0]
    _values_then_right(reward)


def test_the_cap_is_an_option():
    f = code_sandbox(num_workers=1, timeout=TIMEOUT, max_value_bytes=1 << 20)
    try:
        big = "def f():\n    return [0] * 100000\n"
        assert f(completions=[big], tests=[["assert f()"]]) == [1.0]
    finally:
        f.close()
    with pytest.raises(ValueError, match="max_value_bytes"):
        code_sandbox(isolation="rlimits", max_value_bytes=10)


# ---------------------------------------------------------------- io: one wall budget per sample
SLOW_IO = "import time\ntime.sleep(%r)\n" + IO_MAIN


def test_io_cases_share_one_budget_per_sample(reward):
    """Every case sleeps 0.6 x timeout: each would be under a per-case deadline (6 cases: 3.6 x timeout for one
    sample); within one budget the second case is cut off and the sample fails, counted as a timeout."""
    metrics = []
    got = reward(completions=[SLOW_IO % (0.6 * TIMEOUT), IO_MAIN], io_tests=[IO_CASES] * 2, log_metric=lambda k, v: metrics.append((k, v)))
    assert got == [0.0, 1.0]
    assert ("code_sandbox/timeouts", 1.0) in metrics
    _io_then_right(reward)


def test_partial_credit_counts_the_cases_run_within_the_budget():
    f = code_sandbox(num_workers=1, timeout=TIMEOUT, partial_credit=True)
    try:
        (got,) = f(completions=[SLOW_IO % (0.4 * TIMEOUT)], io_tests=[IO_CASES])
        assert 0 < got < 0.5  # the first cases end within the budget, the rest cannot
    finally:
        f.close()


def test_sample_timeout_is_an_option():
    f = code_sandbox(num_workers=1, timeout=TIMEOUT, sample_timeout=6 * TIMEOUT)
    try:
        assert f(completions=[SLOW_IO % (0.6 * TIMEOUT), IO_MAIN], io_tests=[IO_CASES] * 2) == [1.0, 1.0]
    finally:
        f.close()
    with pytest.raises(ValueError, match="sample_timeout"):
        code_sandbox(isolation="rlimits", timeout=2.0, sample_timeout=1.0)


def test_a_split_io_sample_shares_the_budget_across_its_parts():
    """More cases than one request carries are split over workers; the parts share the sample's budget."""
    from reward_plugins.code_sandbox.host import pool as pool_module

    f = code_sandbox(num_workers=2, timeout=TIMEOUT)
    old = pool_module.MAX_IO_CASES_PER_RUN
    pool_module.MAX_IO_CASES_PER_RUN = 2
    try:
        assert f(completions=[SLOW_IO % (0.3 * TIMEOUT), IO_MAIN], io_tests=[IO_CASES] * 2) == [0.0, 1.0]
    finally:
        pool_module.MAX_IO_CASES_PER_RUN = old
        f.close()


# ---------------------------------------------------------------- io: stdout read only as far as it can match
def test_output_past_what_can_match_fails_without_being_read(reward):
    padded = IO_MAIN + "print(' ' * (1 << 20))\n"  # expected output plus 1 MiB of trailing whitespace
    spaced = "a, b = map(int, input().split())\nprint(a + b, end=' \\r\\n')\n"  # trailing blanks within the bound
    assert reward(completions=[padded, spaced, IO_MAIN], io_tests=[IO_CASES] * 3) == [0.0, 1.0, 1.0]
    _io_then_right(reward)


def test_output_bound():
    assert protocol.output_bound("12\n") == 6 + protocol.OUTPUT_SLACK
    assert protocol.output_bound(None) == -1
    assert protocol.same_output(b"12  \r\n\n", "12\n")
