"""TRL's asynchronous trainer scores rollouts in a spawned CPU process (``AsyncRolloutWorker``): its reward functions
and environment factory are pickled there. Every built-in reward plugin, resolved by registry name as the trainer
resolves it, and ``PythonEnvironment`` (as the trainer wraps it for ``tool_error_reply``) pickles into a spawned
interpreter and gives there what it gives here."""

import functools
import math
import multiprocessing
import pickle
import sys

import pytest

from tests.async_ import _child
from trl_rlvr.rewards.registry import BUILTIN_REWARDS, resolve_reward_funcs
from trl_rlvr.rollouts.error_reply import with_error_reply


def msg(text):
    return [{"role": "assistant", "content": text}]


RIGHT, WRONG = "<think>2+2</think>The answer is \\boxed{4}.", "<think>hm</think>The answer is \\boxed{5}."
CODE_OK = "```python\ndef add(a, b):\n    return a + b\n```"
CODE_BAD = "```python\ndef add(a, b):\n    return a - b\n```"
BOXED4, BOXED5 = "$\\boxed{4}$", "$\\boxed{5}$"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]

#: name -> (reward_options, the keyword arguments the async rollout loop passes: conversational completions,
#: prompts, completion_ids and the dataset's columns). Each case's scores are not all equal.
CASES = {
    "boxed_math": ({"prestart": False}, {"completions": [msg(RIGHT), msg(WRONG)], "answer": ["4", "4"]}),
    "think_format": ({}, {"completions": [msg(RIGHT), msg("no tags at all")]}),
    "overlong": ({"max_completion_length": 8, "buffer_length": 4}, {"completions": [msg("a"), msg("b"), msg("c")],
                                                                       "completion_ids": [[1] * 3, [1] * 6, [1] * 9]}),
    "code_sandbox": ({"num_workers": 1}, {"completions": [msg(CODE_OK), msg(CODE_BAD)], "tests": [TESTS, TESTS]}),
    "accuracy_reward": ({}, {"completions": [msg(BOXED4), msg(BOXED5)], "solution": ["$4$", "$4$"]}),
    "reasoning_accuracy_reward": ({}, {"completions": [msg("<think>x</think>" + BOXED4), msg("<think>x</think>" + BOXED5)],
                                      "solution": ["$4$", "$4$"]}),
    "cosine_scaled_reward": ({"max_len": 100}, {"completions": [msg(BOXED4), msg(BOXED5)], "solution": ["$4$", "$4$"]}),
    "repetition_penalty_reward": ({"ngram_size": 2}, {"completions": [msg("a b c d e f"), msg("a b a b a b a b")],
                                                      "completion_ids": [[1, 2, 3, 4, 5, 6], [1, 2] * 4]}),
    "soft_overlong_punishment_reward": ({"max_completion_len": 8, "soft_punish_cache": 4},
                                        {"completions": [msg("a"), msg("b")], "completion_ids": [[1] * 3, [1] * 7]}),
    "think_format_reward": ({}, {"completions": [msg("<think>\nx\n</think>\n4"), msg("4")]}),
}


@pytest.fixture(scope="module")
def reward_process():
    """One spawned interpreter, as ``AsyncRolloutWorker`` starts its child (``multiprocessing`` "spawn")."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        yield pool


def test_every_builtin_has_a_case():
    assert set(CASES) == set(BUILTIN_REWARDS)


def same(a, b):
    return len(a) == len(b) and all(x == y or (x is not None and y is not None and math.isnan(x) and math.isnan(y))
                                    for x, y in zip(a, b))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_builtin_reward_scores_the_same_in_the_reward_process(name, reward_process):
    options, kwargs = CASES[name]
    n = len(kwargs["completions"])
    kwargs = {"prompts": [[{"role": "user", "content": "2+2?"}]] * n, "completion_ids": [[7] * 5] * n, **kwargs}
    (func,) = resolve_reward_funcs([name], {name: options} if options else None)
    try:
        here = list(func(**kwargs))
        there = reward_process.apply(_child.score, (pickle.dumps(func), kwargs))
    finally:
        getattr(func, "close", lambda: None)()
    assert len(set(here)) > 1, here  # the case tells answers apart
    assert same(here, there), (here, there)


@pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")
@pytest.mark.parametrize("error_reply", ["full", "last_line"])
def test_python_environment_runs_the_same_in_the_reward_process(error_reply, reward_process):
    from reward_plugins.code_sandbox import PythonEnvironment

    factory = with_error_reply(functools.partial(PythonEnvironment, timeout=2.0, memory_mb=512), error_reply)
    calls = ["x = 6\nx * 7", "print(x + 1)", "1 / 0"]
    here = _child.run_environment(pickle.dumps(factory), calls)
    there = reward_process.apply(_child.run_environment, (pickle.dumps(factory), calls))
    assert here == there
    assert here["replies"][:2] == ["42\n", "7\n"] and here["error_reply"] == error_reply
    assert here["stats"]["errors"] == 1 and "ZeroDivisionError" in here["replies"][2]
