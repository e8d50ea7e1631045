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
  as its weight;
- with TRL's own rollout worker, a checkpoint records how far the prompt stream was consumed
  (:class:`trl_rlvr.sampling.stream_ledger.StreamLedger`, ``rlvr_async_prompt_stream.json``) and a resumed
  ``train(resume_from_checkpoint=...)`` starts the rollout process there: each prompt's group trained at most once,
  none skipped (docs/dynamic_sampling.md).

Every private piece of TRL it touches is in :mod:`trl_rlvr._compat.async_adapter`, declared with its overrides here
in :data:`trl_rlvr._compat.trl_contract.ASYNC_ADAPTER`.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque

import torch
from transformers import TrainerCallback
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

from trl_rlvr._compat.async_adapter import (
    admit_groups_whole,
    carry_row_versions,
    cpu_constructible,
    packed_forward,
    record_collated_groups,
    record_step_accounting,
    restore_epoch_count,
    row_model_versions,
    set_stream_start,
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
    stale_is_metrics,
    stale_is_sums,
)
from trl_rlvr.algorithms.stale_rows import fresh_tokens, stale_row_count, syncs_read_to_loss
from trl_rlvr.async_grpo.async_config import RLVRAsyncConfig
from trl_rlvr.async_grpo.rescore import GroupScoring
from trl_rlvr.checks.alarms import RLVRAlarmsCallback
from trl_rlvr.faults import checkpoint_to_resume
from trl_rlvr.faults.checkpoints import write_json_atomically
from trl_rlvr.rewards.registry import resolve_reward_funcs
from trl_rlvr.rewards.roles import correctness_check_indices, success_reward_index
from trl_rlvr.sampling.group_filter import GroupFilter
from trl_rlvr.sampling.stream_ledger import StreamLedger, StreamStart

logger = logging.getLogger(__name__)

#: The prompt stream's position in a checkpoint folder (:class:`StreamLedger`'s state).
ASYNC_STREAM_STATE_FILE = "rlvr_async_prompt_stream.json"


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
        self.reward_func_names = [getattr(f, "__name__", type(f).__name__) for f in reward_funcs]
        use_cpu_tree_attention()  # without CUDA: TRL's tree attention in plain PyTorch (TRL's needs FlashAttention-3)
        self.uses_rlvr_scoring = use_rlvr_scoring(self.rollout_worker, self.group_scoring)
        self.group_filter = GroupFilter(max_staleness=args.max_staleness, dynamic_sampling=False,
                                        syncs_before_loss=syncs_read_to_loss(args.token_budget))
        self._stale_rows_masked = 0  # rows weighed out at the loss, over every process, this logging window
        # the prompt stream's position (trl_rlvr.sampling.stream_ledger)
        self.stream_ledger = StreamLedger() if keeps_stream_position(self.rollout_worker, rollout_worker) else None
        self._collated_groups: deque[set[int]] = deque()  # rank 0: micro-batches collated, not yet trained
        self._alarms_to_log: list[str] = []
        if self.stream_ledger is not None:
            self.add_callback(_StreamEpochCount(self))
        if args.alarms:  # RLVRTrainer's alarms, with the stale-rollout one (trl_rlvr.checks.alarms)
            self.add_callback(RLVRAlarmsCallback(self))

    def get_train_dataloader(self):
        # TRL's dataloader, its queue read through the group filter: a group is admitted (trained whole) or dropped
        # at its first row, admitted only if within max_staleness at its loss (trl_rlvr.sampling.group_filter); each
        # row's version carried into the packed batch, for the bound at the loss (compute_loss); with the stream
        # ledger, what each micro-batch holds is recorded when it is collated (before it is trained: prefetch)
        dataloader = super().get_train_dataloader()
        admit_groups_whole(self, self.group_filter, self.stream_ledger)
        carry_row_versions(dataloader)
        if self.stream_ledger is not None and self.accelerator.is_main_process:
            record_collated_groups(dataloader, self._collated_groups)
        return dataloader

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.stream_ledger is not None and self._collated_groups:
            # rank 0 collates micro-batches in the order they are trained: this one is the oldest collated; a
            # checkpoint comes after the optimizer step of every micro-batch taken off here
            self.stream_ledger.trained(self._collated_groups.popleft())
        return loss

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        # resume_from_checkpoint=True takes the newest complete checkpoint (trl_rlvr.faults); with the stream ledger,
        # the rollout process starts where the checkpoint's stream position says
        required = [ASYNC_STREAM_STATE_FILE] if self.stream_ledger is not None else []
        checkpoint = checkpoint_to_resume(resume_from_checkpoint, self.args.output_dir, required)
        if self.stream_ledger is not None:
            self.stream_ledger = load_stream_ledger(checkpoint)
            self._collated_groups.clear()
            set_stream_start(self.rollout_worker, self.stream_ledger.start())
        return super().train(checkpoint, trial, ignore_keys_for_eval, **kwargs)

    def _save_checkpoint(self, model, trial):
        # transformers' checkpoint writer: the prompt stream's position first, atomically, as RLVRTrainer does: a
        # checkpoint that has a model, optimizer or trainer state has it
        if self.stream_ledger is not None and self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            write_json_atomically(os.path.join(folder, ASYNC_STREAM_STATE_FILE), self.stream_ledger.state_dict())
        super()._save_checkpoint(model, trial)

    def record_alarm(self, name: str) -> None:
        """``rlvr/alarm/<name> = 1`` in the next training log (the alarms fire while TRL logs, and TRL clears the
        window's metrics after it)."""
        self._alarms_to_log.append(name)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        counts = self.group_filter.counts
        if self.accelerator.is_main_process:
            for name in ("stale", "rows_dropped_stale", "refills_requested"):
                self._metrics["train"][f"rlvr/queue_{name}_total"].append(float(getattr(counts, name)))
            self.group_filter.counts = type(counts)()
            self._metrics["train"]["rlvr/stale_rows_masked_total"].append(float(self._stale_rows_masked))
        self._stale_rows_masked = 0
        for name in self._alarms_to_log:
            self._metrics["train"][f"rlvr/alarm/{name}"].append(1.0)
        self._alarms_to_log = []
        super().log(logs, start_time)  # TRL reduces the window's metrics into logs; the alarms read them (on_log)

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
            self._log_ratio_metrics(fwd)
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

    def _log_ratio_metrics(self, fwd) -> None:
        """TRL's ``ratio``, ``kl`` (k3 estimator) and ``clip_ratio/{low,high,region}_mean``, its formulas over every
        process's tokens (the ratio is ``pi_theta / mu``, vLLM's behaviour policy), and the clipped shares under
        RLVRTrainer's names, ``rlvr/clip_low_frac`` / ``rlvr/clip_high_frac``."""
        with torch.no_grad():
            log_ratio = (fwd.log_probs - fwd.old_log_probs).detach()
            ratio = log_ratio.exp()
            low = (ratio < 1 - self.epsilon_low) & (fwd.advantages < 0)
            high = (ratio > 1 + self.epsilon_high) & (fwd.advantages > 0)
            sums = torch.stack([ratio.sum(), ((ratio - 1) - log_ratio).sum(), low.sum(), high.sum(),
                                (low | high).sum(), torch.tensor(float(ratio.numel()))]).float()
            total = self.accelerator.reduce(sums.to(log_ratio.device), reduction="sum").cpu()
            means = (total[:-1] / total[-1].clamp(min=1)).tolist()
            names = ("ratio", "kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
            for name, value in zip(names, means):
                self._metrics["train"][name].append(value)
                if name in _CLIP_ALIASES:
                    self._metrics["train"][_CLIP_ALIASES[name]].append(value)


class _StreamEpochCount(TrainerCallback):
    """TRL's epoch stop (``num_train_epochs`` passes of trained groups) counts the groups trained before a resume:
    set after TRL's own resume code, which counts them its way."""

    def __init__(self, trainer: RLVRAsyncTrainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer.stream_ledger is not None:
            restore_epoch_count(self.trainer, self.trainer.stream_ledger.groups_trained)


def keeps_stream_position(built_worker, passed_worker) -> bool:
    """Whether the trainer keeps the prompt stream's position: when TRL's own worker spawns
    :class:`RLVRRolloutLoop` (on rank 0: primed at position 0 here), decided alike on every rank (TRL builds its worker
    on rank 0 when none is passed) so that every rank resumes from the same checkpoint. A worker passed in is the
    caller's: no position is kept."""
    if set_stream_start(built_worker, StreamStart()):
        return True
    return passed_worker is None and built_worker is None


#: TRL's own record of the prompt stream in a checkpoint (``AsyncGRPOTrainer._save_checkpoint``).
TRL_ROLLOUT_STATE_FILE = "rollout_state.json"


def load_stream_ledger(checkpoint: str | None) -> StreamLedger:
    """The stream ledger saved in ``checkpoint``; a fresh one without a checkpoint. From a checkpoint without one
    (written by TRL's trainer, or with an injected worker), with a warning: TRL's ``prompt_index`` (its first group
    not collated: dropped groups count as untrained, prefetched ones as trained) when it wrote one, else prompt 0."""
    if checkpoint is None:
        return StreamLedger()
    path = os.path.join(checkpoint, ASYNC_STREAM_STATE_FILE)
    if os.path.exists(path):
        with open(path) as f:
            return StreamLedger.from_state_dict(json.load(f))
    trl_path = os.path.join(checkpoint, TRL_ROLLOUT_STATE_FILE)
    position = 0
    if os.path.exists(trl_path):
        with open(trl_path) as f:
            position = max(int(json.load(f).get("prompt_index", 0)), 0)
    logger.warning("the checkpoint %s has no %s: the prompt stream restarts at prompt %d (%s), so some prompts may be "
                   "trained twice or skipped", checkpoint, ASYNC_STREAM_STATE_FILE, position,
                   f"TRL's {TRL_ROLLOUT_STATE_FILE}" if position else "the beginning of the dataset")
    return StreamLedger(next_position=position)


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
                        dynamic_sampling=args.dynamic_sampling, tolerance=args.dynamic_sampling_tolerance,
                        success=success, success_threshold=args.success_threshold)


#: TRL's names of the clipped shares -> RLVRTrainer's (trl_rlvr.algorithms.metrics).
_CLIP_ALIASES = {"clip_ratio/low_mean": "rlvr/clip_low_frac", "clip_ratio/high_mean": "rlvr/clip_high_frac"}


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
