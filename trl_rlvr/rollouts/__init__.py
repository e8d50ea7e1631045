"""What happens inside a rollout, between the model's turns: the tool round.

- :mod:`.tool_round`: a round's tool calls sent to their environments together, so a round costs its slowest call
  (TRL 1.16 runs one rollout's call after another).
"""

from trl_rlvr.rollouts.tool_round import dispatch_rounds_ahead

__all__ = ["dispatch_rounds_ahead"]
