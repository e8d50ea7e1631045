"""The verdict of one sample: the job it runs (one type per path), how what comes back is read, and its score.

A sample takes one of three paths (docs/code_sandbox.md), each a job type:

* :class:`ValuesJob` (value path, ``routing``): one sandboxed process evaluates each test's call and sends its
  value as data; the host judges each value here (:func:`read_values`) against an ``Expect`` that never leaves
  the host.
* :class:`CallJob` (tester path): trusted test code (:class:`Asserts`, MBPP-style, or :class:`Check`,
  HumanEval-style) runs in its own sandboxed process and calls the program; its verdict records are read here
  (:func:`read_records`).
* :class:`IoJob` (io path): the program runs once per stdin case; its stdout is compared here
  (:func:`read_io`), reading no more than a matching output can be.

The pool (``host/pool.py``) only carries a job to a worker and the raw results back; everything that decides
pass or fail is in this module, down to the sample's reward (:func:`score`). Reading what a sample sent never
takes longer than the sample may run (``seconds``) nor more bytes than the pool let through.
"""

from __future__ import annotations

import dataclasses
import os
import time

from .routing import Expect
from .sandbox.protocol import Budget, ProtocolError, decode, parse


# ---------------------------------------------------------------- jobs: one type per path
@dataclasses.dataclass(frozen=True)
class ValuesJob:
    """Value path: evaluate each call in the sandbox; judge each value on the host by its ``Expect``."""

    code: str
    calls: tuple[str, ...]  # one expression a line (``routing._one_line`` guards the framing)
    expects: tuple[Expect, ...]  # never sent: the host applies them
    one_test: bool = False  # the calls form one test (a ``check()``) that passes when all do

    mode = "values"  # on the wire (the worker's ``_RUN``)

    @property
    def n(self) -> int:
        """The number of tests."""
        return 1 if self.one_test else len(self.calls)


@dataclasses.dataclass(frozen=True)
class Asserts:
    """MBPP-style tests: each assert statement is one test, after the setup code."""

    statements: tuple[str, ...]
    setup: str = ""


@dataclasses.dataclass(frozen=True)
class Check:
    """HumanEval-style test code: ``check(candidate)`` is one test; ``prelude``: the trusted definitions it
    reads (``prelude.build_prelude``)."""

    test: str
    entry_point: str
    prelude: str = ""


@dataclasses.dataclass(frozen=True)
class CallJob:
    """Tester path: trusted test code calls the program; only the tester writes the verdict records."""

    code: str
    tests: Asserts | Check

    mode = "call"

    @property
    def n(self) -> int:
        return len(self.tests.statements) if isinstance(self.tests, Asserts) else 1

    def tester_input(self) -> dict:
        """What the tester process reads (``sandbox/worker.run_tests``)."""
        t = self.tests
        if isinstance(t, Asserts):
            return {"kind": "asserts", "setup": t.setup, "asserts": list(t.statements)}
        return {"kind": "check", "test": t.test, "entry_point": t.entry_point, "prelude": t.prelude}


@dataclasses.dataclass(frozen=True)
class IoJob:
    """Io path: run the program on each stdin; compare its stdout with the expected one."""

    code: str
    inputs: tuple[str, ...]
    expected: tuple  # str per case; anything else never passes
    budget: float | None = None  # wall seconds left for its cases (a part of a split sample gets what is left)

    mode = "io"

    @property
    def n(self) -> int:
        return len(self.inputs)

    def parts(self, size: int) -> list[IoJob]:
        """This job in parts of at most ``size`` cases, in order (file descriptors per message are bounded)."""
        return [
            IoJob(self.code, self.inputs[k : k + size], self.expected[k : k + size], self.budget)
            for k in range(0, self.n, size)
        ]


Job = ValuesJob | CallJob | IoJob


@dataclasses.dataclass
class Outcome:
    passed: list
    timeout: bool = False
    #: "program" (did not load / crashed), "void", "verifies nothing" (no test); the host's machinery (``LOST``):
    #: "internal" (the worker failed while running the job), "unstarted" (no worker could start to take it);
    #: "infra": lost twice while a control sample failed too (``plugin.CodeSandboxReward.attribute``)
    error: str | None = None


def failed(job: Job, timeout: bool = False, error: str | None = None) -> Outcome:
    """Every test of ``job`` failed (never ran, or its results may not be read)."""
    return Outcome([False] * job.n, timeout=timeout, error=error)


# ---------------------------------------------------------------- reading the records a sample sent
def _indexed_records(raw: bytes, n: int, fields: dict, flag_names: tuple, budget: Budget):
    """The records of ``raw`` for tests 0..n-1 and the flags seen: only complete lines count (a
    record cut off by a kill is dropped). ``fields`` maps each allowed key set to a check of the
    record. A line that is not such a record or a known flag, an index out of range or seen before,
    or reading past ``budget``, makes the list None (the sample is void)."""
    out, seen, flags = [], set(), set()
    for line in raw.split(b"\n")[:-1]:  # the last element is incomplete (or empty)
        try:
            rec = parse(line, budget)
        except ProtocolError:
            return None, flags
        if type(rec) is not dict:
            return None, flags
        if len(rec) == 1 and rec.get("flag") in flag_names:
            flags.add(rec["flag"])
            continue
        i = rec.get("i")
        ok = fields.get(frozenset(rec))
        if ok is None or not ok(rec) or type(i) is not int or not 0 <= i < n or i in seen:
            return None, flags
        seen.add(i)
        out.append(rec)
    return out, flags


_VERDICT_FIELDS = {frozenset(("i", "ok")): lambda r: type(r["ok"]) is bool}


def parse_records(raw: bytes, n_tests: int, seconds: float | None = None):
    """Verdict records ``{"i": k, "ok": bool}`` (``protocol.record``) -> (passed: list[bool] of length n_tests,
    status: "ok" | "void", flags: set[str]). A test without a record failed; a malformed record, or a ``void``
    flag (the tester saw the candidate break the protocol), voids the sample."""
    recs, flags = _indexed_records(raw, n_tests, _VERDICT_FIELDS, ("load_error", "end", "void"), Budget(seconds=seconds))
    if recs is None or "void" in flags:
        return [False] * n_tests, "void", flags
    passed = [False] * n_tests
    for r in recs:
        passed[r["i"]] = r["ok"]
    return passed, "ok", flags


_VALUE_FIELDS = {frozenset(("i", "v")): lambda r: True, frozenset(("i", "x")): lambda r: r["x"] == 1 and type(r["x"]) is int}


def parse_values(raw: bytes, expects, seconds: float | None = None):
    """Return-value records ``{"i": k, "v": value}`` (or ``{"i": k, "x": 1}``: it raised), judged
    here, on the host, by ``expects[k].matches(value)`` (an ``Expect`` of ``routing``: the
    expectation never left the host). Reading and judging all of them may take at most
    ``protocol.MAX_ITEMS`` items and ``seconds`` (past it, the sample is void). -> (passed, status, flags)."""
    n = len(expects)
    budget = Budget(seconds=seconds)
    recs, flags = _indexed_records(raw, n, _VALUE_FIELDS, ("load_error",), budget)
    if recs is None:
        return [False] * n, "void", flags
    passed = [False] * n
    for r in recs:
        if budget.deadline is not None and time.monotonic() > budget.deadline:
            return [False] * n, "void", flags
        if "v" in r:
            try:
                passed[r["i"]] = expects[r["i"]].matches(decode(r["v"]))
            except (ProtocolError, RecursionError, MemoryError):
                passed[r["i"]] = False
    return passed, "ok", flags


def read_records(job: CallJob, raw: bytes, timed_out: bool, seconds: float) -> Outcome:
    """The tester's verdict records for ``job``."""
    passed, status, flags = parse_records(raw, job.n, seconds=seconds)
    return Outcome(passed, timeout=timed_out, error=_error(status, flags))


def read_values(job: ValuesJob, raw: bytes, timed_out: bool, seconds: float) -> Outcome:
    """The value records of ``job``, each judged by its ``Expect``."""
    passed, status, flags = parse_values(raw, job.expects, seconds=seconds)
    if job.one_test:
        passed = [all(passed)]
    return Outcome(passed, timeout=timed_out, error=_error(status, flags))


def _error(status: str, flags: set) -> str | None:
    return "void" if status != "ok" else ("program" if "load_error" in flags else None)


# ---------------------------------------------------------------- comparing stdout (io path)
def _lines(text: str):
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and lines[-1] == "":
        lines.pop()
    return lines


#: Bytes of stdout a matching output may have beyond twice the expected one's (trailing spaces, CRLF line ends).
OUTPUT_SLACK = 4096


def output_bound(expected) -> int:
    """The most bytes of stdout that ``same_output`` can accept for ``expected``: ``2 * len + OUTPUT_SLACK``
    (each line may carry trailing whitespace and a ``\\r``), -1 for a non-string expectation. The host reads and
    compares no more, so its cost per case follows the expected output, not what the program printed."""
    if not isinstance(expected, str):
        return -1
    return 2 * len(expected.encode("utf-8", errors="replace")) + OUTPUT_SLACK


def same_output(actual: bytes, expected) -> bool:
    """Exact comparison modulo trailing whitespace on each line (and trailing blank lines).
    Every line counts: a missing or extra line fails. A non-string expectation never passes."""
    if not isinstance(expected, str):
        return False
    return _lines(actual.decode("utf-8", errors="replace")) == _lines(expected)


def read_io(job: IoJob, cases, stdout_fds, timed_out: bool, max_output_bytes: int) -> Outcome:
    """The worker's per-case ``(exit code, timed out)`` (None: not run, an earlier case timed out) and each
    case's stdout (a memfd) -> the outcome. Only what a matching output can be is read (the size from the memfd,
    not its bytes): comparing costs the host time in the expected output's size, never in what the program
    chose to print. Raises ValueError for a reply that is not one entry per case (the worker is broken)."""
    if type(cases) is not list or len(cases) != job.n:
        raise ValueError("bad io reply")
    passed, crashed = [], False
    for case, fd, want in zip(cases, stdout_fds, job.expected):
        if case is None:
            passed.append(False)
            continue
        code, case_timed_out = case
        crashed |= code != 0 and not case_timed_out
        size = os.fstat(fd).st_size
        if code != 0 or case_timed_out or size > min(max_output_bytes, output_bound(want)):
            passed.append(False)
            continue
        os.lseek(fd, 0, os.SEEK_SET)
        passed.append(same_output(os.read(fd, size), want))
    return Outcome(passed, timeout=timed_out, error="program" if crashed else None)


def merge(outcomes: list[Outcome]) -> Outcome:
    """The outcome of a sample run in parts (``IoJob.parts``), in order."""
    errors = [o.error for o in outcomes if o.error]
    return Outcome([p for o in outcomes for p in o.passed], any(o.timeout for o in outcomes), errors[0] if errors else None)


# ---------------------------------------------------------------- the reward
#: The pool's errors for a job its machinery lost, not yet judged: the plugin runs it again, then a control sample.
LOST = ("internal", "unstarted")
#: Errors of the host's machinery, proven by a failing control sample: the reward is ``None`` (not a wrong answer).
INFRA_ERRORS = ("infra",)


def score(job: Job, outcome: Outcome, partial_credit: bool) -> float | None:
    """The sample's reward: 1.0 when every test ran to its end and passed, else 0.0; with ``partial_credit`` the
    fraction passed. A void sample (it broke the protocol or sent more than it may) scores 0. A sample the
    machinery failed to judge (``INFRA_ERRORS``) scores ``None``: it was not judged, so it is neither right nor
    wrong (TRL gives it no advantage and leaves it out of the group's baseline)."""
    if outcome.error in INFRA_ERRORS:
        return None
    if outcome.error == "void" or job.n == 0:
        return 0.0
    frac = sum(outcome.passed) / job.n
    return frac if partial_credit else float(frac == 1.0)
