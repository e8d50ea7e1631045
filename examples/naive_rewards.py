"""WHAT NOT TO DO: two deliberately naive reward functions, for ``trl-rlvr rewards audit`` to catch.

Do not train with these. They are written the way rewards often are written first, and each is gamed within a few
hundred steps of RL. Audit them to see how::

    trl-rlvr rewards audit examples.naive_rewards:naive_math_reward
    trl-rlvr rewards audit examples.naive_rewards:naive_code_reward --deadline 5

(run from the repository root). What goes wrong, and what the project's own rewards do instead:

* ``naive_math_reward`` gives 1.0 when the gold appears anywhere in the completion: hedging (``\\boxed{3} or
  \\boxed{4}``), a value that merely contains the gold (``12`` for ``2``), the gold mentioned in passing, a gold
  that is empty (every text contains ``""``). ``boxed_math`` reads one final boxed answer after the reasoning,
  refuses a box that states more than one value and compares with math-verify in a worker under a deadline.
* ``naive_code_reward`` ``exec``s the completion in the trainer's own process and judges there: an object whose
  ``__eq__`` is always True passes every assert, ``sys.exit`` escapes ``except Exception``, ``os._exit`` ends the
  process, an infinite loop hangs it, and the candidate can read or rewrite the test and leave state for the next
  sample; its stdout comparison stops at the shorter output. ``code_sandbox`` runs the program in an isolated
  worker, and the verdict never enters the process the program controls.
"""

from __future__ import annotations

import contextlib
import io
import re

_FENCE = re.compile(r"```(?:python)?\n(.*?)```", re.DOTALL)


def _text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def naive_math_reward(prompts=None, completions=None, solution=None, **kwargs) -> list[float]:
    """DO NOT USE: 1.0 when the gold answer is a substring of the completion."""
    return [1.0 if str(gold).strip() in _text(c) else 0.0 for c, gold in zip(completions, solution)]


naive_math_reward.reward_kind = "math_answer"


def _program(completion) -> str:
    text = _text(completion)
    blocks = _FENCE.findall(text.rsplit("</think>", 1)[-1])
    return blocks[-1] if blocks else text


def _run_io(code: str, cases: list[dict]) -> bool:
    for case in cases:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), _stdin(case["input"]):
            exec(code, {"__name__": "__main__"})  # noqa: S102 - what not to do
        got, want = out.getvalue().splitlines(), case["output"].splitlines()
        if any(g.strip() != w.strip() for g, w in zip(got, want)):  # zip: stops at the shorter one
            return False
    return True


@contextlib.contextmanager
def _stdin(text: str):
    import sys

    old, sys.stdin = sys.stdin, io.StringIO(text)
    try:
        yield
    finally:
        sys.stdin = old


def naive_code_reward(prompts=None, completions=None, tests=None, test=None, entry_point=None, io_tests=None,
                      **kwargs) -> list[float]:
    """DO NOT USE: exec the completion in this process, then its tests; 1.0 when nothing raised an Exception."""
    rewards = []
    for k, completion in enumerate(completions):
        code = _program(completion)
        try:
            if io_tests is not None:
                rewards.append(1.0 if _run_io(code, io_tests[k]) else 0.0)
                continue
            namespace: dict = {}
            exec(code, namespace)  # noqa: S102 - what not to do
            if tests is not None:
                for t in tests[k]:
                    exec(t, namespace)  # noqa: S102
            else:
                exec(test[k], namespace)  # noqa: S102
                namespace["check"](namespace[entry_point[k]])
            rewards.append(1.0)
        except Exception:  # noqa: BLE001 - and SystemExit, KeyboardInterrupt, os._exit, a hang get through
            rewards.append(0.0)
    return rewards


naive_code_reward.reward_kind = "code"
