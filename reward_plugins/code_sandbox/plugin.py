"""Plugin face: ``code_sandbox(**options)`` returns a plain TRL reward function.

The program is the last fenced code block of the answer part of the completion (after the last ``</think>``;
``think_tag`` names the tag), or the whole answer part when it has none. The test format follows the dataset
columns, one entry per completion:

* ``tests`` (list of assert statements, MBPP style) with optional ``test_setup_code``;
* ``test`` + ``entry_point`` (HumanEval style: ``check(candidate)``). The candidate gives the test code its
  entry point and nothing else: every other name ``check`` reads (HumanEval's ``poly``, ``encode_cyclic``, a
  constant) comes from the test code, the row's ``prompt_code`` column (HumanEval's raw ``prompt``) or else the
  row's prompt, never from the completion (``prelude``). A row whose ``check`` reads a name none of them
  defines is a configuration error (``ValueError`` naming the row and the names), raised by ``check_rows``
  before training and by the call itself;
* ``io_tests`` (list of ``{"input": str, "output": str}`` over stdin/stdout).

Asserts and ``check`` functions take the value path when their shape allows (``routing``: the
sandbox only evaluates the calls, the host judges), else the worker's tester process runs them.
A ``check`` function is one test, whichever path it takes.

Score: 1.0 when every test ran to its end and passed, else 0.0; with ``partial_credit=True`` the
fraction passed. A row without any test column gets ``None`` (not applicable: TRL turns it into
NaN and ignores it). Broken programs and timeouts score 0 and are counted in the ``code_sandbox/timeouts`` and
``code_sandbox/errors`` metrics through TRL's ``log_metric``. A sample the sandbox's own machinery failed to judge
gets ``None`` too, and only when that is proven each time: its job was lost (its worker failed under it, or no
worker could start), lost again on a fresh worker, and a control sample failed too; counted in
``code_sandbox/infra_errors``: it is not a wrong answer (``CodeSandboxReward.attribute``). Workers that could not
start are counted in ``code_sandbox/worker_start_failures``; the reward never raises for them.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import threading
import weakref

from .._infra import reproduce
from .._text import check_tag_name, completion_text
from . import verdict
from .host.launcher import IsolationUnavailable, ServerDidNotStart, find_bwrap, sandbox_python
from .host.pool import Limits, SandboxPool
from .prelude import build_prelude, prompt_texts
from .routing import check_value_tests, value_tests, verifies_something
from .verdict import Asserts, CallJob, Check, IoJob, ValuesJob

log = logging.getLogger(__package__)  # one logger for the whole package

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_LIVE_POOLS: "weakref.WeakSet[SandboxPool]" = weakref.WeakSet()
_POOL_LOCK = threading.Lock()


@atexit.register
def _close_all():
    for pool in list(_LIVE_POOLS):
        pool.close()


def extract_program(completion, think_tag: str = "think") -> str:
    """The program of a completion: the last fenced code block after the last ``</think_tag>`` (the whole
    completion when it has none), or that whole answer part when it has no fenced block."""
    text = completion_text(completion)
    close = f"</{think_tag}>"
    if close in text:
        text = text.rsplit(close, 1)[1]
    blocks = _FENCE.findall(text)
    if blocks:
        return blocks[-1][1]
    return text


class CodeSandboxReward:
    """The reward function built by :func:`code_sandbox`.

    A callable class rather than a closure: it must pickle (TRL's async rollout worker and ``datasets.map`` ship
    reward functions to other processes), and a pickle carries only its options; the worker pool starts on first
    use (and again after unpickling or in a forked child). The options and their defaults are the factory's.
    """

    #: Scores correctness, not form: RLVRTrainer's default ``success_reward`` (rlvr/accuracy).
    verifies_correctness = True
    reward_kind = "code"  # the corpus `trl-rlvr rewards audit` runs (docs/auditing_rewards.md)
    #: The dataset needs one of the test columns (checked before the model loads, trl_rlvr.checks); a row
    #: whose test cells are all empty still scores None.
    required_columns = (("tests", "test", "io_tests"),)
    __name__ = "code_sandbox"  # TRL logs rewards/code_sandbox/mean

    def __init__(self, *, partial_credit: bool, isolation: str, num_workers: int | None, timeout: float,
                 memory_mb: int, max_output_bytes: int, max_processes: int, max_value_bytes: int,
                 sample_timeout: float | None, prompt_code_column: str, think_tag: str):  # fmt: skip
        if isolation not in ("bwrap", "rlimits"):
            raise ValueError(f"isolation must be 'bwrap' (default) or 'rlimits', not {isolation!r}")
        if timeout <= 0 or memory_mb < 64 or max_output_bytes < 1 or max_processes < 4 or max_value_bytes < 1024:
            raise ValueError(
                "timeout > 0, memory_mb >= 64, max_output_bytes >= 1, max_processes >= 4, max_value_bytes >= 1024 required"
            )
        sample_timeout = float(timeout) if sample_timeout is None else float(sample_timeout)
        if not sample_timeout >= timeout:
            raise ValueError(f"sample_timeout ({sample_timeout}) must be at least timeout ({timeout})")
        if not (isinstance(prompt_code_column, str) and prompt_code_column):
            raise ValueError(f"prompt_code_column must be a column name, not {prompt_code_column!r}")
        check_tag_name("code_sandbox", "think_tag", think_tag)
        self.prompt_code_column = prompt_code_column
        self.think_tag = think_tag
        self.partial_credit = bool(partial_credit)
        self.isolation = isolation
        self.num_workers = num_workers
        self.limits = Limits(
            float(timeout), int(memory_mb), int(max_output_bytes), int(max_processes), int(max_value_bytes), sample_timeout
        )
        self._pool: SandboxPool | None = None
        self.worker_start_failures = 0  # sandbox workers (or pools) that could not start, over this reward's life
        if isolation == "bwrap":
            find_bwrap()  # refuse early, with the install hint, rather than at the first batch
            sandbox_python()
        else:
            log.warning(
                "code_sandbox: isolation='rlimits' was requested: no namespaces (network, pids, filesystem "
                "view); only rlimits plus Landlock/seccomp where available. Do not use on untrusted code you care about."
            )

    # -- pickling: never ship processes or sockets
    def __getstate__(self):
        state = dict(self.__dict__)
        state["_pool"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._pool = None

    @property
    def pool(self) -> SandboxPool:
        with _POOL_LOCK:
            if self._pool is None or self._pool.closed or self._pool.pid != os.getpid():
                self._pool = SandboxPool(self.isolation, self.num_workers, self.limits)
                _LIVE_POOLS.add(self._pool)
            return self._pool

    def close(self):
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def job(self, completion, k: int, columns: dict, prompt=None) -> verdict.Job | None:
        """The job that judges ``completion`` by the tests of row ``k`` of ``columns`` (the reward's keyword
        arguments), on the path its tests allow (``routing``); None when the row has no test column. Tests that
        cannot fail give a job of no tests (it scores 0, counted as an error)."""

        def col(name):
            v = columns.get(name)
            return None if v is None else v[k]

        code = extract_program(completion, self.think_tag)
        tests, io_tests, test = col("tests"), col("io_tests"), col("test")
        if tests is not None:
            tests = [tests] if isinstance(tests, str) else list(tests)
            if not any(verifies_something(str(x)) for x in tests):
                return CallJob(code, Asserts(()))
            fast = value_tests(tests, col("test_setup_code"))
            if fast is not None and tests:
                return ValuesJob(code, tuple(fast[0]), tuple(fast[1]))
            return CallJob(code, Asserts(tuple(str(t) for t in tests), col("test_setup_code") or ""))
        if test is not None:
            entry = col("entry_point")
            if not isinstance(entry, str) or not entry.isidentifier():
                return CallJob(code, Asserts(("assert False",)))
            if not verifies_something(str(test)):
                return CallJob(code, Asserts(()))
            fast = check_value_tests(str(test), entry)
            if fast is not None:
                return ValuesJob(code, tuple(fast[0]), tuple(fast[1]), one_test=True)
            prelude = self.prelude(str(test), entry, col(self.prompt_code_column), prompt, k)
            return CallJob(code, Check(str(test), entry, prelude))
        if io_tests is not None:
            if isinstance(io_tests, str):
                io_tests = json.loads(io_tests)
            cases = [c if isinstance(c, dict) else {} for c in io_tests]
            inputs = tuple(c.get("input") if isinstance(c.get("input"), str) else "" for c in cases)
            return IoJob(code, inputs, tuple(c.get("output") for c in cases))
        return None

    def prelude(self, test: str, entry: str, prompt_code, prompt, row) -> str:
        """The trusted definitions ``check`` needs (``prelude.build_prelude``): from the ``prompt_code`` cell when
        the row has one, else from the prompt. Raises ValueError naming the row when some name is defined by
        neither: such a row is never scored (the candidate would otherwise decide what ``check`` calls)."""
        sources = (str(prompt_code),) if prompt_code is not None else tuple(prompt_texts(prompt))
        found = build_prelude(test, entry, sources)
        if found.missing:
            where = f"the {self.prompt_code_column!r} cell" if prompt_code is not None else "the prompt"
            raise ValueError(
                f"code_sandbox: row {row}: check() reads {', '.join(found.missing)}, which neither the test code nor "
                f"{where} defines (the completion may not). Put the code that defines it (HumanEval's raw 'prompt') "
                f"in a column {self.prompt_code_column!r}, or define it in the 'test' column."
            )
        return found.source

    def check_rows(self, dataset) -> None:
        """Raise ValueError for the first HumanEval-style row (``test`` + ``entry_point``) whose ``check`` reads
        a name that no trusted source of the row defines (see ``prelude``). Called before training (trl_rlvr.checks);
        a dataset without those columns, or whose rows cannot be read by column, is not checked."""
        try:
            names = set(dataset.column_names)
            if not {"test", "entry_point"} <= names:
                return
            tests, entries = dataset["test"], dataset["entry_point"]
            codes = dataset[self.prompt_code_column] if self.prompt_code_column in names else [None] * len(tests)
            prompts = dataset["prompt"] if "prompt" in names else [None] * len(tests)
        except (AttributeError, TypeError, KeyError):
            return
        for k, (test, entry) in enumerate(zip(tests, entries)):
            if test is None or not isinstance(entry, str) or not entry.isidentifier():
                continue
            if not verifies_something(str(test)):
                raise ValueError(
                    f"code_sandbox: row {k}: its 'test' code has no assert, raise or assert...() call, so it passes "
                    "every program; fix the row or drop it"
                )
            if check_value_tests(str(test), entry) is None:
                self.prelude(str(test), entry, codes[k], prompts[k], k)

    #: The control sample of :meth:`attribute`: a program and a test that pass on any working sandbox.
    CONTROL = ("def control():\n    return 2\n", ("assert control() == 2",))

    def control_job(self) -> verdict.Job:
        code, tests = self.CONTROL
        calls, expects = value_tests(list(tests), None)
        return ValuesJob(code, tuple(calls), tuple(expects))

    def attribute(self, jobs: list[verdict.Job]) -> list[verdict.Outcome]:
        """The outcomes of ``jobs``, with each job the host's machinery lost (``verdict.LOST``: its worker failed
        while running it, ``internal``, or no worker could start to take it, ``unstarted``; the pool itself could
        not be built counts as the latter) attributed to the machinery or to the sample by reproduction
        (:func:`reward_plugins._infra.reproduce`), never by the error's text (a program can print or raise
        anything): the job runs again on a fresh worker; lost again, a control sample (:attr:`CONTROL`) runs on a
        fresh worker: when it passes, the sandbox works and this sample broke its worker twice, a wrong answer
        (``program``, scored 0); when the control is lost or fails too, the machinery is failing (``infra``, scored
        ``None``).

        A sample that fails (crashes, times out, prints lies, raises what looks like an infrastructure error)
        inside a working sandbox is always judged as the program it is. Only a server that started and showed
        the isolation missing (``IsolationUnavailable``, not ``ServerDidNotStart``) raises: a configuration the
        reward must not run under."""
        def run(batch):
            pool = None
            try:
                pool = self.pool
                failed = pool.start_failures
                try:
                    return pool.run(batch)
                finally:
                    self.worker_start_failures += pool.start_failures - failed
            except ServerDidNotStart as e:  # raised only by a pool that should count it: never the sample's
                log.warning("code_sandbox: a sandbox worker did not start (%s)", e)
            except IsolationUnavailable:
                raise
            except Exception as e:  # noqa: BLE001 - the pool could not be built or run: no sample was judged
                log.warning("code_sandbox: the sandbox pool failed (%s)", e)
            self.worker_start_failures += pool is None
            return [verdict.failed(j, error="unstarted") for j in batch]

        outcomes, machinery_failed = reproduce(run, jobs, lambda o: o.error in verdict.LOST, self.control_job(),
                                               lambda o: o.error is None and all(o.passed))
        for k, failed in machinery_failed.items():
            outcomes[k] = verdict.failed(jobs[k], error="infra" if failed else "program")
        return outcomes

    def __call__(self, prompts=None, completions=None, **kwargs) -> list:
        completions = list(completions or [])
        prompts = list(prompts) if prompts is not None and len(prompts) == len(completions) else [None] * len(completions)
        jobs = [self.job(c, k, kwargs, prompts[k]) for k, c in enumerate(completions)]
        todo = [(k, j) for k, j in enumerate(jobs) if j is not None and j.n > 0]
        failed_starts = self.worker_start_failures
        outcomes = dict(zip((k for k, _ in todo), self.attribute([j for _, j in todo]))) if todo else {}
        rewards, timeouts, errors, infra = [], 0, 0, 0
        for k, job in enumerate(jobs):
            if job is None:  # no test column: not applicable
                rewards.append(None)
                continue
            out = outcomes.get(k)
            if out is None:  # an empty test list, or tests that cannot fail, verify nothing
                out = verdict.Outcome([], error="verifies nothing")
            if out.error in verdict.INFRA_ERRORS:
                infra += 1
            else:
                timeouts += out.timeout
                errors += out.error is not None
            rewards.append(verdict.score(job, out, self.partial_credit))
        if infra:
            log.warning("code_sandbox: %d of %d samples not judged: the sandbox failed (scored None, counted in "
                        "code_sandbox/infra_errors)", infra, len(jobs))
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric("code_sandbox/timeouts", float(timeouts))
            log_metric("code_sandbox/errors", float(errors))
            log_metric("code_sandbox/infra_errors", float(infra))
            log_metric("code_sandbox/worker_start_failures", float(self.worker_start_failures - failed_starts))
        return rewards


def code_sandbox(
    *,
    partial_credit: bool = False,
    isolation: str = "bwrap",
    num_workers: int | None = None,
    timeout: float = 5.0,
    memory_mb: int = 1024,
    max_output_bytes: int = 8 << 20,
    max_processes: int = 64,
    max_value_bytes: int = 64 << 10,
    sample_timeout: float | None = None,
    prompt_code_column: str = "prompt_code",
    think_tag: str = "think",
) -> CodeSandboxReward:
    """Runs the completion's code against the row's tests in a sandbox: 1.0 when all pass (or the fraction passed).

    Args:
        partial_credit: score the fraction of tests passed instead of all-or-nothing.
        isolation: "bwrap" (default: bubblewrap, uid drop, rlimits, Landlock, seccomp); "rlimits" only on
            explicit request, where no user namespaces are available.
        num_workers: sandboxed worker processes (default: cores + 1, at most 16).
        timeout: wall seconds per execution: one run of a completion's asserts or check(), or one io case.
        memory_mb: address-space limit of a run, in MiB.
        max_output_bytes: bytes of output a run may write.
        max_processes: processes a run may have.
        max_value_bytes: bytes of value records one completion may send on the value path (default 64 KiB: the
            largest of MBPP's and HumanEval's is under 5 KiB); more voids the sample, so reading them on the host
            costs a few milliseconds at most.
        sample_timeout: wall seconds for all io cases of one completion together (default: ``timeout``); a case
            starts only while time is left and is killed when it runs out.
        prompt_code_column: the column holding the code whose helpers and constants check() uses (HumanEval's
            raw ``prompt``) when the ``prompt`` column is a chat; default ``prompt_code``.
        think_tag: name of the reasoning tag (``<think>``); the program is read after the last ``</think_tag>``.

    Test columns (one per row): ``tests`` (assert statements), ``test`` + ``entry_point`` (HumanEval) or
    ``io_tests`` (stdin/stdout pairs); see docs/code_sandbox.md.
    """
    return CodeSandboxReward(
        partial_credit=partial_credit, isolation=isolation, num_workers=num_workers, timeout=timeout,
        memory_mb=memory_mb, max_output_bytes=max_output_bytes, max_processes=max_processes,
        max_value_bytes=max_value_bytes, sample_timeout=sample_timeout, prompt_code_column=prompt_code_column,
        think_tag=think_tag,
    )  # fmt: skip


_READY_MADE: CodeSandboxReward | None = None


def reward(prompts=None, completions=None, **kwargs) -> list:
    """``code_sandbox`` with the default options, for TRL's own CLI:
    ``trl grpo --reward_funcs reward_plugins.code_sandbox.reward``. Built at the first call (building checks
    for bubblewrap, which importing the module must not)."""
    global _READY_MADE
    if _READY_MADE is None:
        _READY_MADE = code_sandbox()
    return _READY_MADE(prompts=prompts, completions=completions, **kwargs)


reward.__name__ = "code_sandbox"  # TRL logs rewards/code_sandbox/mean, as for the registry's code_sandbox
reward.verifies_correctness = True
reward.reward_kind = "code"
reward.required_columns = CodeSandboxReward.required_columns
