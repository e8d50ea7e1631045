"""Reward shaping that depends only on the answer, not on its correctness (pure functions).

DAPO's soft overlong punishment (Yu et al., 2025, eq. 13), with ``L_max`` the generation budget
and ``L_cache`` the buffer before it::

    R_length(y) = 0                                  if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                = -1                                 if |y| > L_max

scaled by a penalty factor (DAPO uses 1.0). It is *added* to the task reward before the group
baseline is taken. This module is the only implementation: the trainer switch
(``RLVRConfig.overlong_buffer_length``) and the ``overlong`` reward plugin both call it.
"""

from __future__ import annotations

from collections.abc import Sequence


def overlong_penalty(length: int, max_length: int, buffer_length: int, penalty_factor: float = 1.0) -> float:
    """DAPO soft overlong penalty of one answer of ``length`` tokens (see module docstring).

    Returns a value in ``[-penalty_factor, 0]``: 0 up to ``max_length - buffer_length`` tokens,
    falling linearly to ``-penalty_factor`` at ``max_length``, and ``-penalty_factor`` beyond it.
    """
    validate_overlong(max_length, buffer_length, penalty_factor)
    start = max_length - buffer_length
    if length <= start:
        return 0.0
    if length > max_length:
        return -float(penalty_factor)
    return penalty_factor * (start - length) / buffer_length


def overlong_penalties(
    lengths: Sequence[int], max_length: int, buffer_length: int, penalty_factor: float = 1.0
) -> list[float]:
    """:func:`overlong_penalty` for each length of a batch."""
    return [overlong_penalty(n, max_length, buffer_length, penalty_factor) for n in lengths]


def validate_overlong(max_length: int, buffer_length: int, penalty_factor: float, prefix: str = "") -> None:
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
