"""`RLVRAsyncTrainer`: TRL's `AsyncGRPOTrainer` with the RLVR switches of `RLVRAsyncConfig` (docs/async.md).

What is TRL's and what is ours:

- generation, tools, the rollout queue, packing and weight sync are TRL's, as they are;
- the staleness bound holds at the loss: a group is admitted from the queue only if it will be within
  ``max_staleness`` at its loss (:class:`trl_rlvr.sampling.group_filter.GroupFilter`), and a row over it at the loss
  is weighed out (:mod:`trl_rlvr.algorithms.stale_rows`, ``rlvr/stale_rows_masked_total``);
- the group advantages are computed in TRL's rollout process, then set the RLVR way on the rows it queues
  (:func:`trl_rlvr.async_grpo.rescore.rescore_rows`: reward weights, the unscorable rule, baseline, std,
  ``scale_rewards``; dynamic sampling drops zero-signal groups there);
- the token loss is :func:`trl_rlvr.algorithms.stale_is.corrected_token_loss` (TRL's PPO-clip with the stale-rollout
  importance weight; ``stale_is_mode=None`` is TRL's loss) normalized by
  :func:`trl_rlvr.algorithms.packed_loss.packed_loss`;
- reward functions may be registry names; the overlong penalty is the ``overlong`` plugin, appended with its factor
  as its weight.

Every private piece of TRL it touches is in :mod:`trl_rlvr._compat.async_adapter`.
"""

from __future__ import annotations

import logging

import torch
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

from trl_rlvr._compat.async_adapter import (
    admit_groups_whole,
    carry_row_versions,
    cpu_constructible,
    packed_forward,
    record_step_accounting,
    row_model_versions,
    trained_model_version,
    use_cpu_tree_attention,
    use_rlvr_scoring,
)
from trl_rlvr.algorithms.packed_loss import local_answer_count, packed_loss
from trl_rlvr.algorithms.shaping import overlong_penalty
from trl_rlvr.algorithms.stale_is import (
    STALE_IS_SUMS,
    corrected_token_loss,
    log_importance_ratio,
    stale_is_alarm,
    stale_is_metrics,
    stale_is_sums,
)
from trl_rlvr.algorithms.stale_rows import fresh_tokens, stale_row_count, syncs_read_to_loss
from trl_rlvr.async_grpo.async_config import RLVRAsyncConfig
from trl_rlvr.async_grpo.rescore import GroupScoring
from trl_rlvr.rewards.registry import resolve_reward_funcs
from trl_rlvr.rewards.roles import correctness_check_indices, success_reward_index
from trl_rlvr.sampling.group_filter import GroupFilter

logger = logging.getLogger(__name__)


class RLVRAsyncTrainer(AsyncGRPOTrainer):
    """`AsyncGRPOTrainer` for RLVR; the same constructor. Entries of ``reward_funcs`` may name reward plugins
    (options from ``args.reward_options``); ``args`` must be an :class:`RLVRAsyncConfig` (or None)."""

    _tag_names = ["trl", "async-grpo", "trl-rlvr"]

    def __init__(self, model: str, reward_funcs=None, args: RLVRAsyncConfig | None = None, train_dataset=None,
                 processing_class=None, callbacks=None, optimizers=(None, None), peft_config=None, tools=None,
                 environment_factory=None, rollout_worker=None, weight_transfer=None):
        args = _rlvr_async_config(model, args)
        reward_funcs, weights = async_reward_funcs(reward_funcs, args)
        self.group_scoring = group_scoring_of(reward_funcs, weights, args)
        with cpu_constructible():
            super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                             processing_class=processing_class, callbacks=callbacks, optimizers=optimizers,
                             peft_config=peft_config, tools=tools, environment_factory=environment_factory,
                             rollout_worker=rollout_worker, weight_transfer=weight_transfer)
        self.reward_funcs = reward_funcs
        use_cpu_tree_attention()  # without CUDA: TRL's tree attention in plain PyTorch (TRL's needs FlashAttention-3)
        self.uses_rlvr_scoring = use_rlvr_scoring(self.rollout_worker, self.group_scoring)
        self.group_filter = GroupFilter(max_staleness=args.max_staleness, dynamic_sampling=False,
                                        syncs_before_loss=syncs_read_to_loss(args.token_budget))
        self._stale_rows_masked = 0  # rows weighed out at the loss, over every process, this logging window

    def get_train_dataloader(self):
        # TRL's dataloader, its queue read through the group filter: a group is admitted (trained whole) or dropped
        # at its first row, admitted only if within max_staleness at its loss (trl_rlvr.sampling.group_filter); each
        # row's version carried into the packed batch, for the bound at the loss (compute_loss)
        dataloader = super().get_train_dataloader()
        admit_groups_whole(self, self.group_filter)
        carry_row_versions(dataloader)
        return dataloader

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        counts = self.group_filter.counts
        if self.accelerator.is_main_process:
            for name in ("stale", "rows_dropped_stale", "refills_requested"):
                self._metrics["train"][f"rlvr/queue_{name}_total"].append(float(getattr(counts, name)))
            self.group_filter.counts = type(counts)()
            self._metrics["train"]["rlvr/stale_rows_masked_total"].append(float(self._stale_rows_masked))
        self._stale_rows_masked = 0
        super().log(logs, start_time)  # TRL reduces the window's metrics into logs
        alarm = stale_is_alarm(logs) if self.args.stale_is_mode is not None else None
        if alarm and self.accelerator.is_main_process:
            logger.warning("step %s: %s", self.state.global_step, alarm)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        args = self.args
        fwd, stale_rows = self._weigh_out_stale_rows(packed_forward(self, model, inputs), inputs)
        per_token, weights = corrected_token_loss(
            fwd.log_probs, fwd.old_log_probs, fwd.advantages, fwd.segment_id, epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high, mode=args.stale_is_mode, clip_min=args.stale_is_clip_min,
            clip_max=args.stale_is_clip_max)
        # the kept tokens and completions over every process: the normalization counts only those
        tokens, answers, stale_rows = self.accelerator.reduce(torch.tensor(
            [float(fwd.log_probs.numel()), float(local_answer_count(fwd.segment_id)), float(stale_rows)],
            device=per_token.device), reduction="sum").tolist()
        self._stale_rows_masked += int(stale_rows)
        loss = packed_loss(per_token, fwd.segment_id, args.loss_normalization, global_tokens=tokens,
                           global_answers=answers, num_processes=self.accelerator.num_processes,
                           loss_constant=args.loss_constant)
        loss = loss / self.current_gradient_accumulation_steps
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * fwd.outputs.aux_loss / self.current_gradient_accumulation_steps
        if tokens:  # a micro-batch weighed out whole trains nothing: no stale_is/entropy value (NaN) for its window
            self._log_loss_metrics(fwd, weights)
        record_step_accounting(self, inputs)
        return loss

    def _weigh_out_stale_rows(self, fwd, inputs: dict):
        """``fwd`` restricted to the tokens of rows within ``max_staleness`` of the weights being trained
        (:func:`trl_rlvr.algorithms.stale_rows.fresh_tokens`), and how many rows of this process it weighed out."""
        versions = row_model_versions(inputs).to(fwd.segment_id.device)
        keep = fresh_tokens(fwd.segment_id, versions, trained_model_version(self), self.args.max_staleness)
        stale = stale_row_count(fwd.segment_id, keep)
        if stale:
            fwd = fwd._replace(**{name: getattr(fwd, name)[keep] for name in
                                  ("log_probs", "entropy", "old_log_probs", "advantages", "segment_id")})
        return fwd, stale

    def _log_loss_metrics(self, fwd, weights: torch.Tensor) -> None:
        """``stale_is/*`` (the ratio's spread and what the correction changed, :func:`stale_is_metrics`) and TRL's
        ``entropy``, over every process."""
        with torch.no_grad():
            log_ratio = (fwd.log_probs - fwd.old_log_probs).detach()
            log_rho = log_importance_ratio(log_ratio, fwd.segment_id, self.args.stale_is_mode or "token_truncate")
            sums = stale_is_sums(log_rho, weights)
            n_add = len(STALE_IS_SUMS) - 2
            added = self.accelerator.reduce(sums[:n_add].to(log_ratio.device), reduction="sum")
            extremes = self.accelerator.gather(sums[n_add:].to(log_ratio.device)).view(-1, 2)
            total = torch.cat([added.cpu(), extremes[:, 0].nan_to_num(-torch.inf).max().reshape(1).cpu(),
                               extremes[:, 1].nan_to_num(torch.inf).min().reshape(1).cpu()])
            for key, value in stale_is_metrics(total).items():
                self._metrics["train"][key].append(value)
            entropy = self.accelerator.reduce(torch.stack([fwd.entropy.sum(), torch.tensor(
                float(fwd.entropy.numel()), device=fwd.entropy.device)]), reduction="sum")
            self._metrics["train"]["entropy"].append((entropy[0] / entropy[1].clamp(min=1)).item())


def async_reward_funcs(reward_funcs, args: RLVRAsyncConfig) -> tuple[list, tuple[float, ...]]:
    """(the reward functions, their weights): registry names resolved with ``args.reward_options``, the ``overlong``
    penalty appended with ``overlong_penalty_factor`` as its weight when ``overlong_buffer_length`` is set."""
    funcs = resolve_reward_funcs(reward_funcs, args.reward_options)
    weights = list(args.reward_weights) if args.reward_weights is not None else [1.0] * len(funcs)
    if len(weights) != len(funcs):
        raise ValueError(f"reward_weights has {len(weights)} entries for {len(funcs)} reward functions")
    if args.overlong_buffer_length is not None:
        funcs.append(overlong_penalty(args.max_completion_length, args.overlong_buffer_length))
        weights.append(float(args.overlong_penalty_factor))
    return funcs, tuple(float(w) for w in weights)


def group_scoring_of(reward_funcs: list, weights: tuple[float, ...], args: RLVRAsyncConfig) -> GroupScoring:
    """What the reward process needs to score groups the RLVR way (:class:`GroupScoring`); the correctness checks
    are ``correctness_rewards``, else the success reward (:mod:`trl_rlvr.rewards.roles`)."""
    names = [getattr(f, "__name__", type(f).__name__) for f in reward_funcs]
    success = success_reward_index(reward_funcs, names, args.success_reward)
    checks = correctness_check_indices(names, args.correctness_rewards, success)
    return GroupScoring(weights=weights, correctness_checks=tuple(checks), scale_rewards=args.scale_rewards,
                        baseline=args.advantage_baseline, std=args.advantage_std,
                        dynamic_sampling=args.dynamic_sampling, tolerance=args.dynamic_sampling_tolerance)


def _rlvr_async_config(model, args) -> RLVRAsyncConfig:
    if args is None:
        name = str(model).rstrip("/").split("/")[-1]
        return RLVRAsyncConfig(f"{name}-RLVR-Async")
    if isinstance(args, RLVRAsyncConfig):
        return args
    if isinstance(args, AsyncGRPOConfig):
        raise TypeError("RLVRAsyncTrainer takes an RLVRAsyncConfig (an AsyncGRPOConfig subclass); for TRL's loss and "
                        "advantages exactly, use AsyncGRPOTrainer, or RLVRAsyncConfig(stale_is_mode=None)")
    raise TypeError(f"args must be an RLVRAsyncConfig, got {type(args).__name__}")
