"""A tool turn costs the slowest call, not the sum: the turn's calls are sent to their environments together.

TRL 1.16's ``GRPOTrainer._tool_call_loop`` runs a synchronous tool one rollout after another, so a turn of cells
that each wait a second costs the trainer ``batch`` seconds. This module does not copy that loop: it wraps the
batch's synchronous tools (``trainer._sync_tool_dicts``, built per batch before the loop) so that the first call
of each turn first hands every rollout's pending call to its environment (``environment._dispatch_call(name,
arguments)``, for environments that define it: ``PythonEnvironment`` sends the cell to its interpreter and returns
at once). TRL's own calls, in its order, then only collect replies that are ready or on their way.

A rollout's pending call is the first tool call of its last message when that message is the model's and no tool
has answered it yet (``completions[i][-1]``): TRL appends tool results after a rollout's calls have run, so the
rollouts still to run in a turn are exactly those. Only the first call of a message is sent ahead; more calls in
one message run as TRL calls them. Nothing changes what a call returns: an environment without
``_dispatch_call``, or a call it does not take, runs as before.
"""

from __future__ import annotations

import functools


def dispatch_turns_ahead(sync_tool_dicts: list, completions: list) -> None:
    """Wrap, in place, each environment tool of ``sync_tool_dicts`` (TRL's per-rollout ``{name: bound method}``)
    so that a call first sends every rollout's pending call of ``completions`` ahead (once per message)."""
    sent: dict[int, object] = {}  # id(message) -> message, for the messages whose first call was sent ahead
    dispatchers = [{name: _dispatcher(tool) for name, tool in tools.items()} for tools in sync_tool_dicts]

    def send_pending_calls() -> None:
        for i, messages in enumerate(completions):
            last = messages[-1] if messages else None
            if not isinstance(last, dict) or last.get("role") != "assistant" or id(last) in sent:
                continue
            calls = last.get("tool_calls") or []
            sent[id(last)] = last  # held, so that its id is not reused by another message
            call = calls[0] if calls and isinstance(calls[0], dict) else {}
            function = call.get("function") if call.get("type") == "function" else None
            if not isinstance(function, dict) or not isinstance(function.get("arguments"), dict):
                continue
            dispatch = dispatchers[i].get(function.get("name")) if i < len(dispatchers) else None
            if dispatch is not None:
                try:
                    dispatch(function["name"], function["arguments"])
                except Exception:  # noqa: BLE001 - the call itself, in its own rollout, meets the same error
                    pass

    def wrap(tool):
        @functools.wraps(tool)
        def call(*args, **kwargs):
            send_pending_calls()
            return tool(*args, **kwargs)

        return call

    for tools, known in zip(sync_tool_dicts, dispatchers):
        for name, tool in list(tools.items()):
            if known[name] is not None:
                tools[name] = wrap(tool)


def _dispatcher(tool):
    """The ``_dispatch_call`` of the environment whose method ``tool`` is, or None."""
    dispatch = getattr(getattr(tool, "__self__", None), "_dispatch_call", None)
    return dispatch if callable(dispatch) else None
