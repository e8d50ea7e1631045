"""Reward shaping that depends only on the answer, not on its correctness: the parameter checks.

DAPO's soft overlong punishment (Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System
at Scale", eq. 13), with ``L_max`` the generation budget and ``L_cache`` the buffer before it::

    R_length(y) = 0                                  if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                = -1                                 if |y| > L_max

It is *added* to the task reward before the group baseline is taken, with a weight (DAPO: 1.0). TRL
computes it (``trl.rewards.get_soft_overlong_punishment``, the one implementation); :func:`overlong_penalty`
checks its parameters and names it ``overlong``. The trainer switch (``RLVRConfig.overlong_buffer_length``) appends
it with ``overlong_penalty_factor`` as its reward weight; the ``overlong`` reward plugin is the same function.
"""

from __future__ import annotations


def validate_overlong(max_length: int, buffer_length: int, penalty_factor: float = 1.0, prefix: str = "") -> None:
    """Raise ``ValueError`` naming the field when the overlong-penalty parameters make no sense."""
    if not isinstance(buffer_length, int) or isinstance(buffer_length, bool) or buffer_length <= 0:
        raise ValueError(f"{prefix}overlong_buffer_length must be a positive integer, got {buffer_length!r}")
    if max_length is None or max_length <= 0:
        raise ValueError(f"{prefix}max_completion_length must be a positive integer, got {max_length!r}")
    if buffer_length > max_length:
        raise ValueError(
            f"{prefix}overlong_buffer_length ({buffer_length}) must not exceed max_completion_length ({max_length})"
        )
    if not penalty_factor >= 0:
        raise ValueError(f"{prefix}overlong_penalty_factor must be >= 0, got {penalty_factor!r}")


def overlong_penalty(max_completion_length: int, buffer_length: int):
    """TRL's soft overlong punishment (the formula above) as a reward function named ``overlong``, parameters
    checked (:func:`validate_overlong`). Lengths count the tokens the model wrote: with tools, TRL passes a
    ``tool_mask`` (1 = model token, 0 = tool output) and tool output is left out, so a tool's long reply never
    costs the answer. Picklable; reads ``completion_ids``; scale it with its reward weight."""
    from trl.rewards import get_soft_overlong_punishment

    validate_overlong(max_completion_length, buffer_length, prefix="overlong: ")
    return ModelTokenOverlong(get_soft_overlong_punishment(int(max_completion_length), int(buffer_length)))


class ModelTokenOverlong:
    """TRL's soft overlong punishment over the tokens the model wrote (``tool_mask`` 1), or all without a mask."""

    __name__ = "overlong"

    def __init__(self, punishment):
        self.punishment = punishment

    def __call__(self, completion_ids, tool_mask=None, **kwargs):
        if tool_mask is not None:
            pairs = zip(completion_ids, tool_mask, strict=True)
            completion_ids = [[t for t, m in zip(ids, mask, strict=True) if m] for ids, mask in pairs]
        return self.punishment(completion_ids=completion_ids, **kwargs)
