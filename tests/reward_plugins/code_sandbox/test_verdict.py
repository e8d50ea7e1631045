"""verdict: the host's reading of what a sample sent never raises and never passes a test it did not prove, and the
score is the fraction (or all-or-nothing) of the tests a job holds."""

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from reward_plugins.code_sandbox import verdict
from reward_plugins.code_sandbox.routing import Expect
from reward_plugins.code_sandbox.sandbox import protocol

RECORD_LINES = st.lists(
    st.one_of(
        st.builds(lambda i, ok: protocol.record(i, ok), st.integers(-2, 5), st.booleans()),
        st.sampled_from([b'{"flag":"void"}\n', b'{"flag":"load_error"}\n', b'{"flag":"end"}\n', b"\n", b"{}\n"]),
        st.binary(max_size=40),
    ),
    max_size=12,
).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(raw=RECORD_LINES, n=st.integers(0, 4))
def test_records_of_any_bytes_are_read_without_error(raw, n):
    passed, status, flags = verdict.parse_records(raw, n, seconds=5.0)
    assert len(passed) == n and all(type(p) is bool for p in passed) and status in ("ok", "void")
    if status == "void":
        assert not any(passed)
    out = verdict.read_records(verdict.CallJob("", verdict.Asserts(("assert 1",) * n)), raw, False, 5.0)
    assert out.passed == passed and (out.error == "void") == (status == "void")


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(st.binary(max_size=200), RECORD_LINES), one=st.booleans())
def test_values_of_any_bytes_pass_only_what_the_host_judged(raw, one):
    expects = (Expect("==", 1), Expect("truthy"))
    job = verdict.ValuesJob("", ("f()", "g()"), expects, one_test=one)
    out = verdict.read_values(job, raw, False, 5.0)
    assert len(out.passed) == job.n and all(type(p) is bool for p in out.passed)
    good = b"".join(protocol.dumps({"i": i, "v": protocol.encode(v)}) + b"\n" for i, v in ((0, 1), (1, [0])))
    assert verdict.read_values(job, good, False, 5.0).passed == ([True] if one else [True, True])


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("stdout")
    os.write(fd, data)
    return fd


@settings(max_examples=200, deadline=None)
@given(outputs=st.lists(st.binary(max_size=30), min_size=1, max_size=4), codes=st.lists(st.integers(-9, 2), min_size=4, max_size=4))
def test_io_passes_a_case_only_when_it_exited_cleanly_with_the_expected_output(outputs, codes):
    expected = tuple(o.decode("utf-8", "replace") for o in outputs)
    job = verdict.IoJob("", ("",) * len(outputs), expected)
    fds = [_memfd(o) for o in outputs]
    try:
        cases = [[c, False] for c in codes[: len(outputs)]]
        out = verdict.read_io(job, cases, fds, False, 1 << 20)
        assert out.passed == [c == 0 for c in codes[: len(outputs)]]
        assert (out.error == "program") == any(c != 0 for c in codes[: len(outputs)])
    finally:
        for fd in fds:
            os.close(fd)


def test_a_bad_io_reply_is_an_error_of_the_worker():
    job = verdict.IoJob("", ("", ""), ("1", "2"))
    for bad in (None, [], [[0, False]], "cases"):
        try:
            verdict.read_io(job, bad, [], False, 1 << 20)
        except ValueError:
            continue
        raise AssertionError(bad)


def test_parts_keep_order_and_merge_back():
    job = verdict.IoJob("p", tuple(str(k) for k in range(250)), tuple(str(k) for k in range(250)), budget=3.0)
    parts = job.parts(100)
    assert [p.n for p in parts] == [100, 100, 50] and all(p.code == "p" and p.budget == 3.0 for p in parts)
    assert sum((p.inputs for p in parts), ()) == job.inputs
    outs = [verdict.Outcome([True] * 100), verdict.Outcome([False] * 100, timeout=True), verdict.Outcome([True] * 50, error="program")]
    merged = verdict.merge(outs)
    assert merged.passed == [True] * 100 + [False] * 100 + [True] * 50 and merged.timeout and merged.error == "program"


def test_score():
    job = verdict.CallJob("", verdict.Asserts(("assert a", "assert b", "assert c", "assert d")))
    some = verdict.Outcome([True, True, True, False])
    assert verdict.score(job, some, partial_credit=False) == 0.0 and verdict.score(job, some, partial_credit=True) == 0.75
    assert verdict.score(job, verdict.Outcome([True] * 4), partial_credit=False) == 1.0
    assert verdict.score(job, verdict.Outcome([True] * 4, error="void"), partial_credit=True) == 0.0
    nothing = verdict.CallJob("", verdict.Asserts(()))
    assert nothing.n == 0 and verdict.score(nothing, verdict.Outcome([]), partial_credit=True) == 0.0
    check = verdict.CallJob("", verdict.Check("def check(c):\n    assert c()\n", "f"))
    assert check.n == 1 and check.tester_input()["kind"] == "check"
