"""``overlong``: DAPO's soft overlong punishment as a reward function, in [-penalty_factor, 0].

The same formula as the trainer switch (``RLVRConfig.overlong_buffer_length``): both call
:func:`trl_rlvr.shaping.overlong_penalties`, the one implementation. A vanilla ``GRPOTrainer`` user adds it to
``reward_funcs`` next to the task reward (TRL sums the reward functions). Don't use both the plugin and the
trainer switch, or the penalty counts twice.

Lengths are in tokens, from the ``completion_ids`` TRL passes to reward functions; called without them
(outside a trainer) the length falls back to the number of characters of the completion text.
"""

from __future__ import annotations

from reward_plugins._text import completion_text
from trl_rlvr.shaping import overlong_penalties, validate_overlong


class OverlongReward:
    """The reward function built by :func:`overlong` (picklable: holds only its options)."""

    def __init__(self, max_completion_length: int, buffer_length: int, penalty_factor: float = 1.0):
        validate_overlong(max_completion_length, buffer_length, penalty_factor, prefix="overlong: ")
        self.max_completion_length = int(max_completion_length)
        self.buffer_length = int(buffer_length)
        self.penalty_factor = float(penalty_factor)
        self.__name__ = "overlong"

    def __repr__(self) -> str:
        return (
            f"overlong(max_completion_length={self.max_completion_length}, buffer_length={self.buffer_length}, "
            f"penalty_factor={self.penalty_factor})"
        )

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
        if completion_ids is not None:
            lengths = [len(ids) for ids in completion_ids]
        elif completions is not None:
            lengths = [len(completion_text(c)) for c in completions]
        else:
            raise TypeError("overlong: called without completions or completion_ids")
        return overlong_penalties(lengths, self.max_completion_length, self.buffer_length, self.penalty_factor)


def overlong(max_completion_length: int, buffer_length: int, penalty_factor: float = 1.0) -> OverlongReward:
    """DAPO soft overlong penalty: 0 up to max-buffer tokens, then linearly down to -penalty_factor.

    Args:
        max_completion_length: the generation budget L_max in tokens (required: GRPOConfig's value).
        buffer_length: the soft-punishment buffer L_cache before L_max (required; DAPO: 4096 of 20480).
        penalty_factor: the penalty at and beyond L_max (DAPO: 1.0).
    """
    return OverlongReward(max_completion_length, buffer_length, penalty_factor)
