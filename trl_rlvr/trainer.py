"""`RLVRTrainer`: TRL's `GRPOTrainer` with the RLVR switches of `RLVRConfig`, shaped as the pull request we would send.

What is TRL's and what is ours:

- the PPO-clip token loss, clip-higher (``epsilon``/``epsilon_high``) and ``mask_truncated_completions`` are
  TRL's code, used as is (tests hold them to independent references);
- the group advantages are :meth:`RLVRTrainer.compute_advantages`: the population std of the GRPO paper
  (:func:`trl_rlvr.algorithms.advantages.group_advantages`; TRL 1.16 divides by the sample std, 0.87x at G=4),
  RLOO's leave-one-out baseline with ``advantage_baseline="leave_one_out"``; ``advantage_std="sample"`` keeps TRL's,
  and a ``GRPOConfig`` is converted with TRL's behavior (:meth:`trl_rlvr.RLVRConfig.from_grpo_config`);
- ``loss_normalization`` selects TRL's ``loss_type``; for ``per_batch_token`` every micro-batch gets the exact
  token count of its optimizer step (:meth:`RLVRTrainer.optimizer_step_token_counts`); for ``constant``
  ``loss_constant`` replaces ``max_completion_length`` as Dr. GRPO's divisor;
- reward functions may be registry names (``reward_funcs=["boxed_math", "think_format"]``); DAPO's soft overlong
  penalty is the ``overlong`` reward plugin, appended with ``overlong_penalty_factor`` as its reward weight;
- every training round goes through one pipeline (:class:`trl_rlvr.sampling.driver.RoundDriver`): the row rules
  (:mod:`trl_rlvr.sampling.row_rules`: the tool-call cap, void turns, resample-on-correct), dynamic and selective
  sampling, the advantages computed once over the rows kept, the loss's token count written once.

What logged metrics mean: every advantage, reward and length metric TRL logs (``reward``, ``reward_std``,
``frac_reward_zero_std``, ``rewards/*``, ``completions/*`` lengths, and the completions table of ``log_completions``)
is the one of the rows the loss used, with the advantage the loss used; the ``rlvr/`` diagnostics describe what was
generated (every round, before dynamic sampling's filter).

The public methods below are the hooks docs/trainer.md asks TRL for. TRL 1.16 does not call them: the one adapter
:class:`trl_rlvr._compat.grpo_adapter.GRPOAdapter` does, from the private methods it overrides; every private piece of
TRL it touches is declared in :mod:`trl_rlvr._compat.trl_contract`.
"""

from __future__ import annotations

import contextlib
import copy
import logging

import torch
from trl import GRPOConfig, GRPOTrainer

from trl_rlvr._compat.grpo_adapter import GRPOAdapter
from trl_rlvr._compat.notices import silence_trl_generation_notice
from trl_rlvr.algorithms.advantages import group_advantages, require_finite_rewards
from trl_rlvr.algorithms.losses import loss_mask, per_step_num_items
from trl_rlvr.algorithms.metrics import tool_metrics, tool_rollout_rows
from trl_rlvr.algorithms.shaping import overlong_penalty
from trl_rlvr.algorithms.unscorable import mark_unscorable
from trl_rlvr.checks.alarms import RLVRAlarmsCallback
from trl_rlvr.checks.columns import check_dataset_columns
from trl_rlvr.checks.settings import check_tool_settings
from trl_rlvr.checks.shift_monitor import PolicyShiftCallback
from trl_rlvr.config import RLVRConfig
from trl_rlvr.faults import checkpoint_to_resume, sigterm_saves
from trl_rlvr.faults.checkpoints import PROMPT_STREAM_STATE_FILE, load_prompt_stream, save_prompt_stream
from trl_rlvr.rewards.registry import resolve_reward_funcs
from trl_rlvr.rewards.roles import correctness_check_indices, success_reward_index
from trl_rlvr.rollouts.error_reply import with_error_reply
from trl_rlvr.sampling.empty_updates import SkipEmptyUpdatesCallback
from trl_rlvr.sampling.row_rules import ScoredRows, row_rules_of, score_rows
from trl_rlvr.sampling.trained_metrics import loss_metrics_of_trained_tokens

logger = logging.getLogger(__name__)

#: TRL metric -> the rlvr/ name it is re-published under.
_TRL_METRIC_ALIASES = {"clip_ratio/low_mean": "rlvr/clip_low_frac", "clip_ratio/high_mean": "rlvr/clip_high_frac"}


class RLVRTrainer(GRPOAdapter, GRPOTrainer):
    """Drop-in `GRPOTrainer` for RLVR; see :class:`trl_rlvr.RLVRConfig` for the switches.

    Anything that runs with ``GRPOTrainer`` runs with ``RLVRTrainer`` unchanged (the same constructor, argument for
    argument). In addition, entries of ``reward_funcs`` may name reward plugins of the ``trl_rlvr.rewards``
    entry-point group; their options come from ``args.reward_options``.
    """

    _tag_names = ["trl", "grpo", "trl-rlvr"]

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: RLVRConfig | GRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools=None,
        rollout_func=None,
        environment_factory=None,
    ):
        silence_trl_generation_notice()
        args = _rlvr_config(model, args)
        reward_funcs = trainer_reward_funcs(reward_funcs, args)
        check_tool_settings(args, train_dataset, environment_factory)  # pre-load, as the dataset check
        check_dataset_columns(train_dataset, reward_funcs or [], environment_factory=environment_factory)
        environment_factory = with_error_reply(environment_factory, args.tool_error_reply)  # PythonEnvironment's option
        if args.overlong_buffer_length is not None:  # the appended overlong penalty, weighted by its factor
            args = copy.copy(args)  # the caller's config is left as it was
            weights = args.reward_weights if args.reward_weights is not None else [1.0] * (len(reward_funcs) - 1)
            args.reward_weights = [*weights, args.overlong_penalty_factor]
        super().__init__(
            model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
            processing_class=processing_class, reward_processing_classes=reward_processing_classes,
            callbacks=callbacks, optimizers=optimizers, quantization_config=quantization_config,
            peft_config=peft_config, tools=tools, rollout_func=rollout_func, environment_factory=environment_factory,
        )
        self._adapt_to_trl()
        self._success_index = success_reward_index(self.reward_funcs, self.reward_func_names, args.success_reward)
        self._correctness_checks = correctness_check_indices(self.reward_func_names, args.correctness_rewards,
                                                             self._success_index)
        self.row_rules = row_rules_of(self)  # the stabilizers (trl_rlvr.sampling.row_rules)
        self._round_driver = self._make_round_driver()
        self._skip_empty_updates = SkipEmptyUpdatesCallback(self) if args.dynamic_sampling else None
        self._policy_shift = PolicyShiftCallback(self, args.policy_shift_metrics)  # rlvr/shift_* after each step
        for callback, wanted in ((self._skip_empty_updates, args.dynamic_sampling), (RLVRAlarmsCallback(self), args.alarms),
                                 (self._policy_shift, args.policy_shift_metrics)):
            if wanted:
                self.add_callback(callback)

    @property
    def success_reward_index(self) -> int | None:
        """Index (in ``reward_funcs`` and ``reward_func_names``) of the reward that decides whether an answer is right
        (``args.success_reward``, else the first correctness verifier, else the first reward); None without rewards."""
        return self._success_index

    # -- the hooks (docs/trainer.md, "Upstreaming") ------------------------------------------------------------

    def transform_rewards(self, rewards_per_func: torch.Tensor, completions: list, notes: dict | None = None
                          ) -> torch.Tensor:
        """Between the reward functions and the advantages: the round's (N, F) gathered rewards (NaN: a function
        returned None) -> the rewards the advantages are computed from. In training, each row rule's score step
        (:meth:`trl_rlvr.sampling.row_rules.RowRule.score`: it may lower a row's total, never raise it; per-row
        values for its keep step go to ``notes``); then a row a correctness check did not score is unscorable as a
        whole (all NaN: out of every baseline, :mod:`trl_rlvr.algorithms.unscorable`). Logged:
        ``rlvr/unscorable_frac``, and with tools ``rlvr/tool_*``."""
        require_finite_rewards(rewards_per_func, self.reward_func_names)  # gathered: every rank raises alike
        if self.model.training and self.row_rules:
            rows = ScoredRows(rewards_per_func, completions, self.environments, self.reward_weights, self._gather_rows,
                              lambda name, value: self.metrics_to_log("train")[name].append(value),
                              notes if notes is not None else {})
            rewards_per_func = score_rows(self.row_rules, rows)
        rewards_per_func, unscorable = mark_unscorable(rewards_per_func, self._correctness_checks)
        self.metrics_to_log()["rlvr/unscorable_frac"].append(unscorable.float().mean().item())
        if self.tools:  # tool results per rollout (any tool); PythonEnvironment's stats (errors, timeouts, restarts)
            gathered = self._gather_rows(tool_rollout_rows(completions, self.environments or [None] * len(completions)))
            for key, value in tool_metrics(gathered).items():
                self.metrics_to_log()[key].append(value)
        return rewards_per_func

    def compute_advantages(self, rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
        """(N,) advantages of the (N,) total rewards of the rows trained on, group after group of
        ``num_generations``: ``A_i = (r_i - mean(r)) / (std(r) + 1e-4)`` over the group (``scale_rewards``: the
        group's std, the batch's, or none), the std the population's (``advantage_std``), the baseline the group mean
        or RLOO's leave-one-out mean (``advantage_baseline``); an unscorable row (NaN) gets 0
        (:func:`~trl_rlvr.algorithms.advantages.group_advantages`)."""
        return group_advantages(rewards, num_generations, self.scale_rewards, baseline=self.args.advantage_baseline,
                                std=self.args.advantage_std)

    def optimizer_step_token_counts(self, micro_batches: list[dict]) -> list[torch.Tensor] | None:
        """DAPO's exact divisor: for each micro-batch of a generation batch (in TRL's order, after its shuffle), the
        loss-token count of its optimizer step over every process (``token_count_scope="optimizer_step"``, with
        ``per_batch_token``); None keeps TRL's count of the generation batch
        (:func:`~trl_rlvr.algorithms.losses.per_step_num_items`)."""
        args = self.args
        if not (args.loss_normalization == "per_batch_token" and args.token_count_scope == "optimizer_step"
                and args.steps_per_generation % args.gradient_accumulation_steps == 0):
            return None
        local = torch.stack([loss_mask(batch).sum() for batch in micro_batches]).float()
        return per_step_num_items(self.accelerator.reduce(local, reduction="sum"), args.gradient_accumulation_steps)

    def save_prompt_stream(self, checkpoint_folder: str) -> None:
        """Write the prompt stream's position into a checkpoint folder, before its other files."""
        if self._round_driver.stream is not None and self.args.should_save:
            save_prompt_stream(self._round_driver.stream, checkpoint_folder)

    def _gather_rows(self, values: list) -> torch.Tensor:
        """This process's per-row values -> (N,) float32 over every process, in TRL's row order."""
        return self.accelerator.gather(torch.tensor(values, dtype=torch.float32, device=self.accelerator.device))

    # -- Trainer's public methods ------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        # resume_from_checkpoint=True takes the newest *complete* checkpoint (a crash while one was written leaves a
        # partial folder that transformers' get_last_checkpoint would pick); SIGTERM checkpoints the step in progress
        # and raises TrainingPreempted (trl_rlvr.faults, docs/faults.md).
        stream = self._round_driver.stream
        required = [PROMPT_STREAM_STATE_FILE] if stream is not None else []
        checkpoint = checkpoint_to_resume(resume_from_checkpoint, self.args.output_dir, required)
        if checkpoint and stream is not None:
            load_prompt_stream(stream, checkpoint)
        with sigterm_saves(self, enabled=getattr(self.args, "save_on_sigterm", False)):
            return super().train(checkpoint, trial, ignore_keys_for_eval, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        metrics = contextlib.nullcontext()  # with fillers, TRL's loss metrics only of micro-batches with a loss token
        if self.args.dynamic_sampling_partial_batch == "pad" and self.args.dynamic_sampling and self.model.training:
            tokens = self.accelerator.reduce(loss_mask(inputs).sum().float(), reduction="sum")
            metrics = loss_metrics_of_trained_tokens(self.metrics_to_log("train"), has_loss_tokens=bool(tokens > 0))
        with self._policy_shift.recording(inputs), metrics:  # the loss's log-probs: rlvr/shift_* (checks.shift_monitor)
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.args.loss_normalization == "constant" and self.args.loss_constant is not None:
            # TRL's dr_grpo divides by (rows x max_completion_length); Dr. GRPO's constant may be set apart from it
            loss = loss * (self.max_completion_length / self.args.loss_constant)
        return loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        metrics = self.metrics_to_log()
        for trl_name, rlvr_name in _TRL_METRIC_ALIASES.items():
            if trl_name in metrics:
                metrics[rlvr_name] = list(metrics[trl_name])
        super().log(logs, start_time)


def _rlvr_config(model, args) -> RLVRConfig:
    """``args`` as an RLVRConfig: a default one named after the model, or a GRPOConfig converted with TRL's behavior."""
    if args is None:
        name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
        return RLVRConfig(f"{str(name).rstrip('/').split('/')[-1]}-RLVR")
    if isinstance(args, RLVRConfig):
        return args
    args = RLVRConfig.from_grpo_config(args)  # TypeError for anything else
    logger.info(
        "RLVRTrainer: the GRPOConfig was converted to an RLVRConfig that reproduces GRPOTrainer "
        "(advantage_std='sample', token_count_scope='generation_batch'); pass an RLVRConfig for the RLVR "
        "defaults (docs/trainer.md)"
    )
    return args


def trainer_reward_funcs(reward_funcs, args: RLVRConfig):
    """The reward functions RLVRTrainer trains with: registry names -> plugins, DAPO's overlong penalty appended when
    ``overlong_buffer_length`` is set (weighted by ``overlong_penalty_factor``)."""
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [] if reward_funcs is None else [reward_funcs]
    if any(isinstance(f, str) for f in funcs):
        funcs = resolve_reward_funcs(funcs, args.reward_options)
    if args.overlong_buffer_length is not None:
        funcs.append(overlong_penalty(args.max_completion_length, args.overlong_buffer_length))
    return funcs if funcs or reward_funcs is not None else None
