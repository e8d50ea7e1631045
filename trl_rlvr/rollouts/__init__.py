"""What happens inside a rollout, between the model's turns: a turn's tool calls sent to their environments
together (:mod:`.tool_turn`), so a turn costs its slowest call (TRL 1.16 runs one rollout's call after another).

- :mod:`.tool_turn`: the turn's calls sent ahead together (the environment protocol's ``_dispatch_call`` and
  ``_join_tool_turns``);
- :mod:`.error_reply`: ``tool_error_reply`` set on the environments the factory builds (``PythonEnvironment``'s
  ``error_reply``: ToRL's error replies).

The stabilizers that act on a round's scored rollouts (the tool-call cap, void turns, resample-on-correct) are row
rules of the round pipeline: :mod:`trl_rlvr.sampling.row_rules`.
"""

from trl_rlvr.rollouts.tool_turn import ToolTurns, tool_turns

__all__ = ["ToolTurns", "tool_turns"]
