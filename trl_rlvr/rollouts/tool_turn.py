"""A tool turn costs the slowest call, not the sum: the turn's calls are sent to their environments together.

TRL 1.16's ``GRPOTrainer._tool_call_loop`` runs a synchronous tool one rollout after another, so a turn of cells
that each wait a second costs the trainer ``batch`` seconds. This module does not copy that loop, and changes
nothing of TRL's: it extends the environment protocol (``reset``, ``get_reward``, public methods as tools) with two
private methods, which TRL does not offer to the model as tools (its discovery skips names with a leading
underscore):

- ``_dispatch_call(name, arguments)``: send the tool call that will come ahead, and return at once
  (``PythonEnvironment`` sends the cell to its interpreter; the call itself then collects the reply);
- ``_join_tool_turns(turns)``: for the batch's tool loop, the environment keeps ``turns`` (a :class:`ToolTurns`;
  None after the loop) and each of its tools calls ``turns.send_pending_calls()`` before it runs.

So the first call of each turn first hands every rollout's pending call to its environment; TRL's own calls, in
its order, then only collect replies that are ready or on their way. :func:`tool_turns` joins a batch's
environments for the block (the trainer's tool loop).

A rollout's pending call is the first tool call of its last message when that message is the model's and no tool
has answered it yet (``completions[i][-1]``): TRL appends tool results after a rollout's calls have run, so the
rollouts still to run in a turn are exactly those. Only the first call of a message is sent ahead; more calls in
one message run as TRL calls them. Nothing changes what a call returns: an environment without these methods, a
standalone tool, or a call the environment does not take, runs as before.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator


class ToolTurns:
    """One batch's tool turns: ``environments[i]`` is rollout ``i``'s (TRL's ``trainer.environments``),
    ``completions[i]`` its messages so far (the list TRL's tool loop appends to)."""

    def __init__(self, environments: list, completions: list):
        self.environments, self.completions = environments, completions
        self.sent: dict[int, object] = {}  # id(message) -> message, for the messages whose first call was sent ahead

    def send_pending_calls(self) -> None:
        """Hand every rollout's pending call that was not sent yet to its environment's ``_dispatch_call``."""
        for i, messages in enumerate(self.completions):
            last = messages[-1] if messages else None
            if not isinstance(last, dict) or last.get("role") != "assistant" or id(last) in self.sent:
                continue
            calls = last.get("tool_calls") or []
            self.sent[id(last)] = last  # held, so that its id is not reused by another message
            call = calls[0] if calls and isinstance(calls[0], dict) else {}
            function = call.get("function") if call.get("type") == "function" else None
            if not isinstance(function, dict) or not isinstance(function.get("arguments"), dict):
                continue
            dispatch = _dispatcher(self.environments[i], function.get("name")) if i < len(self.environments) else None
            if dispatch is not None:
                try:
                    dispatch(function["name"], function["arguments"])
                except Exception:  # noqa: BLE001 - the call itself, in its own rollout, meets the same error
                    pass


@contextlib.contextmanager
def tool_turns(environments: list | None, completions: list) -> Iterator[ToolTurns | None]:
    """Within the block (a batch's tool loop), each environment of ``environments`` that joins tool turns
    (``_join_tool_turns``) holds the batch's :class:`ToolTurns`; after it, none does (no state between batches)."""
    joining = [e for e in environments or () if callable(getattr(e, "_join_tool_turns", None))]
    if not joining:
        yield None
        return
    turns = ToolTurns(environments, completions)
    try:
        for environment in joining:
            environment._join_tool_turns(turns)
        yield turns
    finally:
        for environment in joining:
            environment._join_tool_turns(None)


def _dispatcher(environment, name):
    """The ``_dispatch_call`` of ``environment`` when ``name`` is one of its synchronous tools (as TRL finds them:
    its public methods but ``reset`` and ``get_reward``), or None."""
    dispatch = getattr(environment, "_dispatch_call", None)
    tool = getattr(type(environment), name, None) if isinstance(name, str) else None
    if (not callable(dispatch) or not inspect.isfunction(tool) or name.startswith("_")
            or name in ("reset", "get_reward") or inspect.iscoroutinefunction(tool)):
        return None
    return dispatch
