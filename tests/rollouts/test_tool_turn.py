"""The tool turn through the environment protocol (``_join_tool_turns``, ``_dispatch_call``): each rollout's pending
call goes to its own environment at most once, only when it names one of that environment's tools, and no
environment holds the batch's turns after the loop, however it ends."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.rollouts.tool_turn import tool_turns


class Joining:
    """An environment that sends calls ahead: one tool, ``python``; records what was sent to it."""

    def __init__(self):
        self.sent, self.turns = [], None

    def reset(self, **row):
        return None

    def python(self, code: str) -> str:
        if self.turns is not None:
            self.turns.send_pending_calls()
        return code

    def _join_tool_turns(self, turns):
        self.turns = turns

    def _dispatch_call(self, name, arguments):
        self.sent.append((name, arguments))


class Plain:
    """An environment without the protocol."""

    def python(self, code: str) -> str:
        return code


# mostly well-formed pending python calls, with every kind of malformed or foreign one mixed in
NAMES = st.sampled_from(["python"] * 4 + ["reset", "get_reward", "_dispatch_call", "calculator", None])
ARGUMENTS = st.one_of(*[st.fixed_dictionaries({"code": st.text(max_size=3)})] * 3, st.just("x"))
CALL = st.fixed_dictionaries({"type": st.sampled_from(["function"] * 3 + ["other"]),
                              "function": st.fixed_dictionaries({"name": NAMES, "arguments": ARGUMENTS})})
MESSAGE = st.one_of(
    *[st.fixed_dictionaries({"role": st.just("assistant"), "tool_calls": st.lists(CALL, min_size=1, max_size=2)})] * 3,
    st.fixed_dictionaries({"role": st.sampled_from(["assistant", "tool", "user"]), "tool_calls": st.lists(CALL, max_size=1)}),
    st.just("not a message"))


def first_function(messages):
    last = messages[-1] if messages else None
    if not isinstance(last, dict) or last.get("role") != "assistant" or not last.get("tool_calls"):
        return None
    call = last["tool_calls"][0]
    return call["function"] if call["type"] == "function" else None


@settings(max_examples=200, deadline=None)
@given(rollouts=st.lists(st.tuples(st.booleans(), st.lists(MESSAGE, max_size=3)), min_size=1, max_size=6),
       calls=st.lists(st.integers(0, 5), max_size=6), raises=st.booleans())
def test_each_pending_call_goes_to_its_own_environment_at_most_once(rollouts, calls, raises):
    environments = [Joining() if joins else Plain() for joins, _ in rollouts]
    completions = [messages for _, messages in rollouts]
    with pytest.raises(RuntimeError) if raises else _nothing():
        with tool_turns(environments, completions):
            for i in calls:  # TRL's calls, in any order, several per turn
                if i < len(environments):
                    environments[i].python("")
            if raises:
                raise RuntimeError("the tool loop failed")
    joined_and_called = any(isinstance(environments[i], Joining) for i in calls if i < len(environments))
    for environment, messages in zip(environments, completions, strict=True):
        if not isinstance(environment, Joining):
            continue
        assert environment.turns is None  # nothing kept after the loop
        function = first_function(messages)
        expected = ([(function["name"], function["arguments"])] if joined_and_called and function is not None
                    and function["name"] == "python" and isinstance(function["arguments"], dict) else [])
        assert environment.sent == expected


def test_without_joining_environments_nothing_is_held():
    with tool_turns(None, []) as turns:
        assert turns is None
    with tool_turns([Plain()], [[]]) as turns:
        assert turns is None


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
