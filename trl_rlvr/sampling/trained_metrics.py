"""TRL's per-batch reward and length metrics, of the rows a batch trains on; its loss metrics, of the micro-batches
that have a loss token; what dynamic sampling's rounds logged, merged.

``GRPOTrainer`` logs ``reward``, ``reward_std``, ``frac_reward_zero_std``, ``rewards/<name>/mean|std`` (in
``_generate_and_score_completions``) and ``completions/*`` lengths (in ``_generate``) for every row it generated.
Under dynamic sampling the rows trained on are a subset (the kept groups of several rounds): these are the same
definitions (TRL's ``nanstd``, the sample std), evaluated on the trained rows instead: a copy of TRL's code, declared
with its line ranges in :data:`trl_rlvr._compat.trl_contract.COPIED_PATHS`. The names of what TRL logs, by what they
describe, are listed here and checked against TRL's source by the contract (``pytest -m trl_contract``).
"""

from __future__ import annotations

import contextlib
import logging

import torch
from trl.trainer.utils import nanstd

logger = logging.getLogger(__name__)

#: What TRL logs of every generated row of a round (``{name}``: each reward function's name): recomputed here on the
#: rows trained on (:func:`trained_metrics`).
TRAINED_ROW_METRICS = (
    "reward", "reward_std", "frac_reward_zero_std", "rewards/{name}/mean", "rewards/{name}/std",
    "completions/mean_length", "completions/min_length", "completions/max_length", "completions/clipped_ratio",
    "completions/mean_terminated_length", "completions/min_terminated_length", "completions/max_terminated_length",
)
#: What TRL logs of a round's generation as a whole (passed through): tokens seen, tool calls, vLLM's sampling
#: mismatch. ``num_tokens`` is set, not appended (a running total).
GENERATION_METRICS = (
    "num_tokens", "tools/call_frequency", "tools/failure_frequency", "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max", "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean", "sampling/importance_sampling_ratio/max",
)
ASSIGNED_METRICS = ("num_tokens",)
#: What TRL's loss logs once per optimizer step, not of the micro-batch (a setting): kept when a micro-batch has no
#: loss token (:func:`loss_metrics_of_trained_tokens`); the rest of what it logs describes the micro-batch.
STEP_METRICS = ("entropy_coef",)
#: The variable TRL logs reward functions' ``log_metric`` counters under (``self._metrics[mode][name]``).
REWARD_METRIC_VARIABLE = "name"
_warned_generated: set[str] = set()


def trained_row_metric_names(reward_func_names) -> list[str]:
    """:data:`TRAINED_ROW_METRICS` with each reward function's name filled in."""
    return [n.format(name=r) for n in TRAINED_ROW_METRICS for r in (reward_func_names if "{name}" in n else [None])]


def trained_metrics(rewards_per_func: torch.Tensor, weights: torch.Tensor, reward_func_names: list[str],
                    lengths: torch.Tensor, truncated: torch.Tensor, group_size: int, scale_rewards: str
                    ) -> dict[str, float]:
    """TRL's metrics of K rows: ``rewards_per_func`` (K, F) (NaN: not scored), ``lengths`` (K,) tokens the model
    wrote, ``truncated`` (K,) bool; rows group after group (a last, partial group counts as a group)."""
    metrics = {}
    for i, name in enumerate(reward_func_names):
        metrics[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
        metrics[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, i]).item()
    rewards = (rewards_per_func * weights.to(rewards_per_func.device)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    metrics["reward"] = torch.nanmean(rewards).item()
    metrics["reward_std"] = nanstd(rewards).item()
    if scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    else:
        std = torch.cat([
            nanstd(group).expand_as(group) if group.numel() > 1 else torch.zeros_like(group)
            for group in rewards.split(group_size)
        ])
    metrics["frac_reward_zero_std"] = torch.isclose(std, torch.zeros_like(std)).float().mean().item()
    lengths = lengths.float()
    metrics["completions/mean_length"] = lengths.mean().item()
    metrics["completions/min_length"] = lengths.min().item()
    metrics["completions/max_length"] = lengths.max().item()
    metrics["completions/clipped_ratio"] = truncated.float().mean().item()
    terminated = lengths[~truncated.bool()]
    if terminated.numel() == 0:  # as TRL: no terminated answer -> 0
        terminated = torch.zeros(1)
    metrics["completions/mean_terminated_length"] = terminated.mean().item()
    metrics["completions/min_terminated_length"] = terminated.min().item()
    metrics["completions/max_terminated_length"] = terminated.max().item()
    return metrics


@contextlib.contextmanager
def loss_metrics_of_trained_tokens(metrics: dict, has_loss_tokens: bool, step_metrics=STEP_METRICS):
    """Around TRL's loss of one micro-batch: when no process's micro-batch has a loss token (filler rows, an empty
    dynamic-sampling batch), what the loss logged to ``metrics`` is dropped, except ``step_metrics`` (a setting
    logged once per optimizer step). TRL's metrics of such a micro-batch are means over zero tokens, which it logs as
    0: averaged into the step's, they would pull its entropy and clip ratios towards 0."""
    before = {name: len(values) for name, values in metrics.items()}
    yield
    if has_loss_tokens:
        return
    for name in list(metrics):
        if name not in step_metrics:
            del metrics[name][before.get(name, 0):]
            if not metrics[name]:
                del metrics[name]


def merge_generation_metrics(held: dict, sink: dict, recomputed: set[str], reward_metrics: set[str]) -> None:
    """What dynamic sampling's rounds logged (``held``), into ``sink``: TRL's per-row metrics dropped
    (``recomputed`` on the trained rows), the generation's metrics as logged, any other as ``generated/<name>``
    (a metric a newer TRL logs of every generated row, which this layer does not recompute), with a warning once."""
    for name, values in held.items():
        if name in recomputed:
            continue
        if name in ASSIGNED_METRICS:  # TRL sets these (a running total), it does not append
            sink[name] = values
        elif name.startswith("rlvr/") or name in GENERATION_METRICS or name in reward_metrics:
            sink[name].extend(values)
        else:
            if name not in _warned_generated:
                _warned_generated.add(name)
                logger.warning(
                    "dynamic sampling: %r, a metric TRL logs of every generated row, is not one trl-rlvr recomputes on "
                    "the rows trained on; logged as 'generated/%s' (declare it in trl_rlvr/sampling/trained_metrics.py)",
                    name, name,
                )
            sink[f"generated/{name}"].extend(values)
