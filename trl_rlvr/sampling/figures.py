"""TRL's per-batch reward and length figures, of the rows a batch trains on; its loss figures, of the micro-batches
that have a loss token.

``GRPOTrainer`` logs ``reward``, ``reward_std``, ``frac_reward_zero_std``, ``rewards/<name>/mean|std`` (in
``_generate_and_score_completions``) and ``completions/*`` lengths (in ``_generate``) for every row it generated.
Under dynamic sampling the rows trained on are a subset (the kept groups of several rounds): these are the same
definitions (TRL's ``nanstd``, the sample std), evaluated on the trained rows instead: a copy of TRL's code, declared
with its line ranges in :data:`trl_rlvr._compat.trl_contract.COPIED_PATHS` and its names in
:data:`~trl_rlvr._compat.trl_contract.TRL_ROW_FIGURES` (checked against TRL's source by ``pytest -m trl_contract``).
"""

from __future__ import annotations

import contextlib

import torch
from trl.trainer.utils import nanstd

from trl_rlvr._compat.trl_contract import TRL_STEP_FIGURES


def trained_figures(rewards_per_func: torch.Tensor, weights: torch.Tensor, reward_func_names: list[str],
                    lengths: torch.Tensor, truncated: torch.Tensor, group_size: int, scale_rewards: str
                    ) -> dict[str, float]:
    """TRL's figures of K rows: ``rewards_per_func`` (K, F) (NaN: not scored), ``lengths`` (K,) tokens the model
    wrote, ``truncated`` (K,) bool; rows group after group (a last, partial group counts as a group)."""
    figures = {}
    for i, name in enumerate(reward_func_names):
        figures[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
        figures[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, i]).item()
    rewards = (rewards_per_func * weights.to(rewards_per_func.device)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    figures["reward"] = torch.nanmean(rewards).item()
    figures["reward_std"] = nanstd(rewards).item()
    if scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    else:
        std = torch.cat([
            nanstd(group).expand_as(group) if group.numel() > 1 else torch.zeros_like(group)
            for group in rewards.split(group_size)
        ])
    figures["frac_reward_zero_std"] = torch.isclose(std, torch.zeros_like(std)).float().mean().item()
    lengths = lengths.float()
    figures["completions/mean_length"] = lengths.mean().item()
    figures["completions/min_length"] = lengths.min().item()
    figures["completions/max_length"] = lengths.max().item()
    figures["completions/clipped_ratio"] = truncated.float().mean().item()
    terminated = lengths[~truncated.bool()]
    if terminated.numel() == 0:  # as TRL: no terminated answer -> 0
        terminated = torch.zeros(1)
    figures["completions/mean_terminated_length"] = terminated.mean().item()
    figures["completions/min_terminated_length"] = terminated.min().item()
    figures["completions/max_terminated_length"] = terminated.max().item()
    return figures


@contextlib.contextmanager
def loss_figures_of_trained_tokens(metrics: dict, has_loss_tokens: bool, step_figures=TRL_STEP_FIGURES):
    """Around TRL's loss of one micro-batch: when no process's micro-batch has a loss token (filler rows, an empty
    dynamic-sampling batch), what the loss logged to ``metrics`` is dropped, except ``step_figures`` (a setting
    logged once per optimizer step). TRL's figures of such a micro-batch are means over zero tokens, which it logs as
    0: averaged into the step's, they would pull its entropy and clip ratios towards 0."""
    before = {name: len(values) for name, values in metrics.items()}
    yield
    if has_loss_tokens:
        return
    for name in list(metrics):
        if name not in step_figures:
            del metrics[name][before.get(name, 0):]
            if not metrics[name]:
                del metrics[name]
