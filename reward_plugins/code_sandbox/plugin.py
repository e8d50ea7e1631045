"""Plugin face: ``code_sandbox(**options)`` returns a plain TRL reward function.

The program is the last fenced code block of the completion (```python ... ```), or the whole
answer part (after the last ``</think>``) when there is none. The test format follows the dataset
columns, one entry per completion:

* ``tests`` (list of assert statements, MBPP style) with optional ``test_setup_code``;
* ``test`` + ``entry_point`` (HumanEval style: ``check(candidate)``); helper functions that the
  prompt defines (HumanEval's ``poly``, ``encode_cyclic``) are taken from the prompt, not from the
  completion, when ``check`` runs (``prelude``);
* ``io_tests`` (list of ``{"input": str, "output": str}`` over stdin/stdout).

Asserts and ``check`` functions take the value path when their shape allows (``routing``: the
sandbox only evaluates the calls, the host judges), else the worker's tester process runs them.
A ``check`` function is one test, whichever path it takes.

Score: 1.0 when every test ran to its end and passed, else 0.0; with ``partial_credit=True`` the
fraction passed. A row without any test column gets ``None`` (not applicable: TRL turns it into
NaN and ignores it). Broken programs, timeouts and internal errors score 0 and are counted in the
``code_sandbox/timeouts`` and ``code_sandbox/errors`` metrics through TRL's ``log_metric``.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import re
import threading
import weakref

from .._text import completion_text
from .pool import Job, Limits, SandboxPool
from .prelude import prompt_helpers
from .routing import check_value_tests, value_tests

log = logging.getLogger(__package__)  # one logger for the whole package

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_LIVE_POOLS: "weakref.WeakSet[SandboxPool]" = weakref.WeakSet()
_POOL_LOCK = threading.Lock()


@atexit.register
def _close_all():
    for pool in list(_LIVE_POOLS):
        pool.close()


def extract_program(completion) -> str:
    text = completion_text(completion)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    blocks = _FENCE.findall(text)
    if blocks:
        return blocks[-1][1]
    return text


class CodeSandboxReward:
    """A picklable reward function; its worker pool starts on first use (and again after
    unpickling or in a forked child)."""

    #: Scores correctness, not form: RLVRTrainer's default ``success_reward`` (rlvr/accuracy).
    verifies_correctness = True
    #: The dataset needs one of the test columns (checked before the model loads, trl_rlvr.checks); a row
    #: whose test cells are all empty still scores None.
    required_columns = (("tests", "test", "io_tests"),)

    def __init__(
        self,
        *,
        partial_credit: bool = False,
        isolation: str = "bwrap",
        num_workers: int | None = None,
        timeout: float = 5.0,
        memory_mb: int = 1024,
        max_output_bytes: int = 8 << 20,
        max_processes: int = 64,
    ):
        if isolation not in ("bwrap", "rlimits"):
            raise ValueError(f"isolation must be 'bwrap' (default) or 'rlimits', not {isolation!r}")
        if timeout <= 0 or memory_mb < 64 or max_output_bytes < 1 or max_processes < 4:
            raise ValueError("timeout > 0, memory_mb >= 64, max_output_bytes >= 1, max_processes >= 4 required")
        self.__name__ = "code_sandbox"
        self.partial_credit = bool(partial_credit)
        self.isolation = isolation
        self.num_workers = num_workers
        self.limits = Limits(float(timeout), int(memory_mb), int(max_output_bytes), int(max_processes))
        self._pool: SandboxPool | None = None
        if isolation == "bwrap":
            from .isolation import find_bwrap, sandbox_python

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

    def _job(self, completion, k: int, kwargs: dict, prompt=None) -> Job | None:
        def col(name):
            v = kwargs.get(name)
            return None if v is None else v[k]

        code = extract_program(completion)
        tests, io_tests, test = col("tests"), col("io_tests"), col("test")
        if tests is not None:
            tests = [tests] if isinstance(tests, str) else list(tests)
            fast = value_tests(tests, col("test_setup_code"))
            if fast is not None and tests:
                return Job("values", code, len(tests), spec={"exprs": fast[0]}, expected=fast[1])
            spec = {"kind": "asserts", "setup": col("test_setup_code") or "", "asserts": [str(t) for t in tests]}
            return Job("call", code, len(tests), spec=spec)
        if test is not None:
            entry = col("entry_point")
            if not isinstance(entry, str) or not entry.isidentifier():
                return Job("call", code, 1, spec={"kind": "asserts", "setup": "", "asserts": ["assert False"]})
            fast = check_value_tests(str(test), entry)
            if fast is not None:
                return Job("values", code, 1, spec={"exprs": fast[0]}, expected=fast[1], one_test=True)
            spec = {"kind": "check", "test": str(test), "entry_point": entry, "prelude": prompt_helpers(prompt, entry)}
            return Job("call", code, 1, spec=spec)
        if io_tests is not None:
            if isinstance(io_tests, str):
                import json

                io_tests = json.loads(io_tests)
            cases = [c if isinstance(c, dict) else {} for c in io_tests]
            inputs = [c.get("input") if isinstance(c.get("input"), str) else "" for c in cases]
            return Job("io", code, len(cases), inputs=inputs, expected=[c.get("output") for c in cases])
        return None

    def __call__(self, prompts=None, completions=None, **kwargs) -> list:
        completions = list(completions or [])
        prompts = list(prompts) if prompts is not None and len(prompts) == len(completions) else [None] * len(completions)
        jobs = [self._job(c, k, kwargs, prompts[k]) for k, c in enumerate(completions)]
        todo = [(k, j) for k, j in enumerate(jobs) if j is not None and j.n > 0]
        outcomes = dict(zip((k for k, _ in todo), self.pool.run([j for _, j in todo]))) if todo else {}
        rewards, timeouts, errors = [], 0, 0
        for k, job in enumerate(jobs):
            if job is None:
                rewards.append(None)
                continue
            out = outcomes.get(k)
            if out is None:  # an empty test list verifies nothing
                rewards.append(0.0)
                errors += 1
                continue
            timeouts += out.timeout
            errors += out.error is not None
            frac = sum(out.passed) / job.n if out.error != "void" else 0.0
            rewards.append(frac if self.partial_credit else float(frac == 1.0))
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric("code_sandbox/timeouts", float(timeouts))
            log_metric("code_sandbox/errors", float(errors))
        return rewards


def code_sandbox(**options) -> CodeSandboxReward:
    """Runs the completion's code against the row's tests in a sandbox: 1.0 when all pass (or the fraction passed).

    Args:
        partial_credit: score the fraction of tests passed instead of all-or-nothing.
        isolation: "bwrap" (default: bubblewrap, uid drop, rlimits, Landlock, seccomp); "rlimits" only on
            explicit request, where no user namespaces are available.
        num_workers: sandboxed worker processes (default: cores + 1, at most 16).
        timeout: wall seconds per run of one completion's tests.
        memory_mb: address-space limit of a run, in MiB.
        max_output_bytes: bytes of output a run may write.
        max_processes: processes a run may have.

    Test columns (one per row): ``tests`` (assert statements), ``test`` + ``entry_point`` (HumanEval) or
    ``io_tests`` (stdin/stdout pairs); see docs/code_sandbox.md.
    """
    return CodeSandboxReward(**options)


# The registry (``trl-rlvr rewards show``, option checking in ``load_reward``) reads the options from the
# factory's signature: it is the class's, so that it is written once.
code_sandbox.__signature__ = inspect.signature(CodeSandboxReward).replace(return_annotation=CodeSandboxReward)


_READY_MADE: CodeSandboxReward | None = None


def reward(prompts=None, completions=None, **kwargs) -> list:
    """``code_sandbox`` with the default options, for TRL's own CLI:
    ``trl grpo --reward_funcs reward_plugins.code_sandbox.reward``. Built at the first call (building checks
    for bubblewrap, which importing the module must not)."""
    global _READY_MADE
    if _READY_MADE is None:
        _READY_MADE = CodeSandboxReward()
    return _READY_MADE(prompts=prompts, completions=completions, **kwargs)


reward.__name__ = "code_sandbox"  # TRL logs rewards/code_sandbox/mean, as for the registry's code_sandbox
reward.verifies_correctness = True
reward.required_columns = CodeSandboxReward.required_columns
