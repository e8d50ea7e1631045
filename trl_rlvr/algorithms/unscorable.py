"""Unscorable rows and a row's total reward (pure functions).

TRL 1.16 turns a reward function's ``None`` into NaN and sums the functions with ``nansum``: a row leaves its group's
baseline only when *every* function returned ``None``. With a correctness check and a format reward (both main
jobs), a row whose check failed on the machinery would be trained as a wrong answer with its format score. Here a row
is *unscorable as a whole* when one of its correctness checks (``RLVRConfig.correctness_rewards``; default: the
success reward) returned ``None``, or when every function did (TRL's rule): :func:`mark_unscorable` sets all of its
rewards to NaN, so every later sum (TRL's advantages and logged metrics, :func:`total_rewards`, the round driver's)
gives it a NaN total: it leaves its group's mean and std, its advantage is 0, it is counted in
``rlvr/unscorable_frac``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def unscorable_rows(rewards_per_func: torch.Tensor, checks: Sequence[int]) -> torch.Tensor:
    """(N,) bool: rows of ``rewards_per_func`` (N, F) with a NaN in one of the ``checks`` columns (a correctness
    check that did not score the row), or NaN in every column."""
    nan = torch.isnan(rewards_per_func)
    out = nan.all(dim=1)
    if len(checks):
        out = out | nan[:, list(checks)].any(dim=1)
    return out


def mark_unscorable(rewards_per_func: torch.Tensor, checks: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards with every unscorable row all NaN, the (N,) bool mask of those rows) (:func:`unscorable_rows`)."""
    rows = unscorable_rows(rewards_per_func, checks)
    return rewards_per_func.masked_fill(rows[:, None], torch.nan), rows


def total_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(N,) ``sum_f w_f r_f`` over the functions that scored the row (``nansum``, as TRL); NaN for a row no function
    scored (after :func:`mark_unscorable`: every unscorable row)."""
    rewards = (rewards_per_func * weights.to(rewards_per_func.device)).nansum(dim=1)
    return rewards.masked_fill(torch.isnan(rewards_per_func).all(dim=1), torch.nan)
