"""What happens inside a rollout, between the model's turns (the tool round), and to a round's rollouts once
scored (the multi-turn stabilisers).

- :mod:`.tool_round`: a round's tool calls sent to their environments together, so a round costs its slowest call
  (TRL 1.16 runs one rollout's call after another).
- :mod:`.error_reply`: ``tool_error_reply`` set on the environments the factory builds (``PythonEnvironment``'s
  ``error_reply``: ToRL's error replies).
- :mod:`.stabilisers`: the tool-call cap and void-turn rollouts applied to a round while TRL scores it
  (``max_tool_calls_per_answer``, ``void_turn_action``), and each rollout's tool errors for resample-on-correct.
"""

from trl_rlvr.rollouts.tool_round import dispatch_rounds_ahead

__all__ = ["dispatch_rounds_ahead"]
