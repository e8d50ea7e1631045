r"""One group's rewards -> its advantages, as the asynchronous trainer's reward process computes them (pure).

TRL's ``AsyncGRPOTrainer`` scores each group in its rollout process (``_AsyncRolloutLoop._score_group``): the reward
functions summed with weight 1 (``nansum``), a row no function scored gets advantage 0, and
``A_i = (r_i - mean(r)) / (std(r) + 1e-8)`` with the population std over the scored rows. :func:`group_scores` is
the same step with the RLVR switches: reward weights (the overlong penalty's factor among them), the unscorable rule
(:mod:`trl_rlvr.algorithms.unscorable`: a row a correctness check scored None leaves the statistics as a whole), the
baseline (group mean or RLOO's leave-one-out), the std (population or sample) and ``scale_rewards`` ``"group"`` or
``"none"`` (:func:`trl_rlvr.algorithms.advantages.group_advantages`). ``"batch"`` has no meaning here: the group is
scored alone, before the batch it will be trained in exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from trl_rlvr.algorithms.advantages import group_advantages, zero_signal_groups
from trl_rlvr.algorithms.unscorable import mark_unscorable, total_rewards

#: ``scale_rewards`` values a group scored alone can take.
GROUP_SCALES = ("group", "none")


class GroupScores(NamedTuple):
    advantages: torch.Tensor  # (G,) float64; 0 for an unscorable row
    rewards: torch.Tensor  # (G,) weighted totals; NaN for an unscorable row
    unscorable: torch.Tensor  # (G,) bool
    informative: bool  # the group's scored totals are not all equal (it carries a gradient)


def group_scores(rewards_per_func: torch.Tensor, weights: Sequence[float], correctness_checks: Sequence[int] = (), *,
                 scale_rewards: str = "group", baseline: str = "group_mean", std: str = "population",
                 eps: float = 1e-4, tolerance: float = 0.0) -> GroupScores:
    """The advantages of one group's (G, F) rewards (NaN: the function returned None), ``weights`` (F,).

    ``informative`` is dynamic sampling's test (:func:`trl_rlvr.algorithms.advantages.zero_signal_groups`: the
    scored totals span more than ``tolerance``, with at least two scored rows)."""
    if scale_rewards not in GROUP_SCALES:
        raise ValueError(f"scale_rewards must be one of {GROUP_SCALES} for a group scored alone, got {scale_rewards!r}")
    rewards_per_func = rewards_per_func.to(torch.float64)
    if rewards_per_func.dim() != 2 or rewards_per_func.shape[1] != len(weights):
        raise ValueError(f"rewards_per_func {tuple(rewards_per_func.shape)} must be (G, {len(weights)})")
    marked, unscorable = mark_unscorable(rewards_per_func, correctness_checks)
    totals = total_rewards(marked, torch.tensor(list(weights), dtype=torch.float64))
    group_size = totals.numel()
    advantages = group_advantages(totals, group_size, scale_rewards, eps=eps, baseline=baseline, std=std)
    informative = not bool(zero_signal_groups(totals, group_size, tolerance)[0])
    return GroupScores(advantages, totals, unscorable, informative)
