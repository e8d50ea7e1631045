"""`RLVRTrainer`: TRL's `GRPOTrainer` with the RLVR switches of `RLVRConfig`, as thin glue.

What is TRL's and what is ours:

- the PPO-clip token loss, clip-higher (``epsilon``/``epsilon_high``) and ``mask_truncated_completions`` are
  TRL's code, used as is (tests hold them to independent references);
- the group advantages are recomputed with the population std of the GRPO paper
  (:func:`trl_rlvr.algorithms.advantages.group_advantages`): TRL 1.16 divides by the sample std (Bessel), 0.87x at G=4
  (``advantage_std="sample"`` keeps TRL's; a ``GRPOConfig`` is converted with TRL's behaviour,
  :meth:`trl_rlvr.RLVRConfig.from_grpo_config`); ``advantage_baseline="leave_one_out"`` takes RLOO's baseline;
- ``loss_normalization`` selects TRL's ``loss_type``; for ``per_batch_token`` every micro-batch gets the exact
  token count of its optimizer step (:func:`trl_rlvr.algorithms.losses.per_step_num_items`); for ``constant``
  ``loss_constant`` replaces ``max_completion_length`` as Dr. GRPO's divisor;
- reward functions may be registry names (``reward_funcs=["boxed_math", "think_format"]``); DAPO's soft overlong
  penalty is the ``overlong`` reward plugin, appended with ``overlong_penalty_factor`` as its reward weight;
- dynamic and selective sampling are :class:`trl_rlvr.sampling.driver.RoundDriver`'s: this class gives it one round
  of TRL's generation and scoring (:meth:`RLVRTrainer._score_round`) and hands its batch to TRL's training loop.

What logged figures mean: every advantage, reward and length figure TRL logs (``reward``, ``reward_std``,
``frac_reward_zero_std``, ``rewards/*``, ``completions/*`` lengths, and the completions table of ``log_completions``)
is the one of the rows the loss used, with the advantage the loss used; the ``rlvr/`` diagnostics describe what was
generated (every round, before dynamic sampling's filter).

A round's data travels in one immutable record (:mod:`trl_rlvr.sampling.rounds`); TRL's hooks cannot be given
arguments, so what they see of the round in progress is noted in ``self._round`` (a ``RoundNotes``). Every private
piece of TRL this glue overrides, calls, reads or swaps, and why TRL's public API does not do it, is listed in
:mod:`trl_rlvr._compat.trl_contract`, checked when the trainer is built and by ``pytest -m trl_contract``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from contextlib import nullcontext

import torch
from trl import GRPOConfig, GRPOTrainer

from trl_rlvr._compat.gloo_exit import destroy_gloo_process_group_at_exit
from trl_rlvr._compat.logprob_tiles import cpu_logprob_tiles
from trl_rlvr._compat.notices import silence_trl_generation_notice
from trl_rlvr._compat.quantized import keep_4bit_weights_trainable
from trl_rlvr._compat.swaps import swapped, table_held_back
from trl_rlvr._compat.trl_contract import warn_on_contract_violations
from trl_rlvr.algorithms.advantages import group_advantages, require_finite_rewards
from trl_rlvr.algorithms.losses import per_step_num_items
from trl_rlvr.algorithms.metrics import rollout_metrics, tool_metrics, tool_rollout_rows
from trl_rlvr.algorithms.shaping import overlong_penalty
from trl_rlvr.algorithms.unscorable import mark_unscorable, total_rewards
from trl_rlvr.checks.alarms import RLVRAlarms
from trl_rlvr.checks.columns import check_dataset_columns
from trl_rlvr.checks.settings import check_tool_settings
from trl_rlvr.checks.shift_monitor import PolicyShiftMonitor
from trl_rlvr.config import RLVRConfig
from trl_rlvr.faults import checkpoint_to_resume, sigterm_saves, write_json_atomically
from trl_rlvr.rewards.registry import resolve_reward_funcs
from trl_rlvr.rollouts.error_reply import with_error_reply
from trl_rlvr.rollouts.stabilisers import RoundStabilisers
from trl_rlvr.rollouts.tool_round import dispatch_rounds_ahead
from trl_rlvr.sampling.driver import RoundDriver, filter_rewards
from trl_rlvr.sampling.empty_updates import SkipEmptyUpdates
from trl_rlvr.sampling.figures import loss_figures_of_trained_tokens
from trl_rlvr.sampling.rounds import GenerationRecord, RoundNotes, RoundRecord, gathered_lengths

logger = logging.getLogger(__name__)
PROMPT_STREAM_STATE_FILE = "rlvr_prompt_stream.json"

#: TRL metric -> the rlvr/ name it is re-published under.
_TRL_METRIC_ALIASES = {"clip_ratio/low_mean": "rlvr/clip_low_frac", "clip_ratio/high_mean": "rlvr/clip_high_frac"}


class RLVRTrainer(GRPOTrainer):
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
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = RLVRConfig(f"{str(name).rstrip('/').split('/')[-1]}-RLVR")
        elif not isinstance(args, RLVRConfig):
            args = RLVRConfig.from_grpo_config(args)  # TypeError for anything else
            logger.info(
                "RLVRTrainer: the GRPOConfig was converted to an RLVRConfig that reproduces GRPOTrainer "
                "(advantage_std='sample', token_count_scope='generation_batch'); pass an RLVRConfig for the RLVR "
                "defaults (docs/trainer.md)"
            )
        reward_funcs = self._resolve_reward_funcs(reward_funcs, args)
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
        warn_on_contract_violations(self)  # the private pieces of TRL this glue relies on (trl_contract)
        if self.accelerator.num_processes > 1:  # a gloo group left to finalisation can abort a finished rank
            destroy_gloo_process_group_at_exit()
        for trained_or_reference in (self.model, self.ref_model):
            keep_4bit_weights_trainable(trained_or_reference)  # QLoRA on AVX512-BF16 CPUs (see quantized.py)
        if self.use_vllm:  # TRL's vLLM weight sync fails when vLLM runs on a CPU: vLLM's reload path (vllm_cpu)
            from trl_rlvr._compat.vllm_cpu import adapt_weight_sync

            adapt_weight_sync(self.vllm_generation)
        self._success_index = self._find_success_reward(args.success_reward)
        self._correctness_checks = self._find_correctness_checks(args.correctness_rewards)
        self._driver = self._make_driver() if RoundDriver.needed(args) else None
        self._round: RoundNotes | None = None  # the round TRL is generating: noted by _generate, _calculate_rewards
        self._generation_has_signal: bool | None = None  # of the generation batch TRL's _buffered_inputs holds
        self._skip_empty_updates = SkipEmptyUpdates(self) if args.dynamic_sampling else None
        if self._skip_empty_updates is not None:
            self.add_callback(self._skip_empty_updates)
        if args.alarms:
            self.add_callback(RLVRAlarms(self))  # warnings when a run goes quietly wrong (trl_rlvr.checks.alarms)
        self._stabilisers = RoundStabilisers.of(self)  # the multi-turn switches (trl_rlvr.rollouts.stabilisers)
        self._policy_shift = PolicyShiftMonitor(self, args.policy_shift_metrics)  # rlvr/shift_* after each step
        if args.policy_shift_metrics:
            self.add_callback(self._policy_shift)

    @property
    def success_reward_index(self) -> int | None:
        """Index (in ``reward_funcs`` and ``reward_func_names``) of the reward that decides whether an answer is right
        (``args.success_reward``, else the first correctness verifier, else the first reward); None without rewards."""
        return self._success_index

    # -- construction -------------------------------------------------------------------------------------------

    @staticmethod
    def _resolve_reward_funcs(reward_funcs, args: RLVRConfig):
        """Registry names -> plugins; append the overlong penalty when ``overlong_buffer_length`` is set."""
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [] if reward_funcs is None else [reward_funcs]
        if any(isinstance(f, str) for f in funcs):
            funcs = resolve_reward_funcs(funcs, args.reward_options)
        if args.overlong_buffer_length is not None:
            funcs.append(overlong_penalty(args.max_completion_length, args.overlong_buffer_length))
        return funcs if funcs or reward_funcs is not None else None

    def _make_driver(self) -> RoundDriver:
        return RoundDriver(
            self.args, self.train_dataset, group_size=self.num_generations, accelerator=self.accelerator,
            score_round=lambda rows, prompt_indices: self._score_round(rows, prompt_indices), metrics=self._metrics,
            success_index=self._success_index, reward_weights=self.reward_weights,
            reward_func_names=self.reward_func_names, scale_rewards=self.scale_rewards,
            mask_truncated_completions=self.mask_truncated_completions,
            pad_token_id=self._tokenizer.pad_token_id, shuffle=self.shuffle_dataset,
        )

    def _find_success_reward(self, name: str | None) -> int | None:
        """Index of the reward that decides "right": ``success_reward`` by name, else the first reward function
        that declares ``verifies_correctness = True`` (``boxed_math``, ``code_sandbox``), else the first one."""
        if not self.reward_func_names:
            return None
        if name is None:
            verifiers = [i for i, f in enumerate(self.reward_funcs) if getattr(f, "verifies_correctness", False)]
            return verifiers[0] if verifiers else 0
        if name not in self.reward_func_names:
            raise ValueError(f"success_reward={name!r} is not a reward function here; known: {self.reward_func_names}")
        return self.reward_func_names.index(name)

    def _find_correctness_checks(self, names: list[str] | None) -> list[int]:
        """Indices of the rewards whose ``None`` makes a row unscorable (``correctness_rewards``; default: the
        success reward); :mod:`trl_rlvr.algorithms.unscorable`."""
        if names is None:
            return [] if self._success_index is None else [self._success_index]
        unknown = [n for n in names if n not in (self.reward_func_names or [])]
        if unknown:
            raise ValueError(f"correctness_rewards names {unknown}, not reward functions here; known: "
                             f"{self.reward_func_names}")
        return [self.reward_func_names.index(n) for n in names]

    # -- a generation batch: one round, or the driver's rounds --------------------------------------------------

    def _generate_and_score_completions(self, inputs, **kwargs):
        if self.model.training and (self.args.dynamic_sampling or self.args.resample_on_correct):
            batch, generation = self._generate_informative_batch(inputs)
        elif self.model.training and self.args.selective_sampling:
            batch, generation = self._driver.selected_round()
        else:
            batch, record = self._score_round(inputs, **kwargs)
            generation = GenerationRecord.whole(record)
        generation.write_table(self._logs, self.reward_func_names)
        if self.model.training:
            self._generation_has_signal = generation.has_signal
        return batch

    def _generate_informative_batch(self, inputs) -> tuple[dict, GenerationRecord]:
        """Dynamic sampling (:meth:`RoundDriver.informative_batch`); the dataloader's batch only sets the size.
        Its rounds generate with ``beta=0`` (no reference log-probs of rows it drops); the kept rows' are computed
        here (TRL's path, :data:`~trl_rlvr._compat.trl_contract.COPIED_PATHS`)."""
        with swapped(self, "beta", 0.0):
            batch, generation = self._driver.informative_batch(len(inputs))
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = (self._reference_logps(batch) if generation.has_signal else
                                            torch.zeros_like(batch["completion_ids"], dtype=torch.float32))
        return batch, generation

    def _score_round(self, inputs, prompt_indices: list[int] | None = None, **kwargs) -> tuple[dict, RoundRecord]:
        """One round of TRL's generation and scoring: this process's rows (TRL's batch dict, with our advantages)
        and the round's record. TRL calls ``_generate`` and ``_calculate_rewards`` from inside, which note what they
        see; the completions-table entries TRL writes are held in the record until the trained rows are known."""
        notes = self._round = RoundNotes(prompt_indices=prompt_indices)
        try:
            with table_held_back(self) as table:
                output = super()._generate_and_score_completions(inputs, **kwargs)
        finally:
            self._round = None
        trls_own = self.args.advantage_std == "sample" and self.args.advantage_baseline == "group_mean"
        if self.multi_objective_aggregation == "sum_then_normalize" and not trls_own:  # else TRL's are kept
            group_size = self.num_generations if self.model.training else self.num_generations_eval
            advantages = group_advantages(notes.rewards, group_size, self.scale_rewards,
                                          baseline=self.args.advantage_baseline, std=self.args.advantage_std)
            rows = len(output["advantages"])
            start = self.accelerator.process_index * rows
            output["advantages"] = advantages[start : start + rows].to(output["advantages"].dtype)
        else:  # TRL's, exactly as it computed (and logged) them for every process
            advantages = torch.tensor(table["advantages"], dtype=torch.float32)
        advantages = self._stabilisers.void_turns(output, advantages, notes.void)  # void_turn_action
        return output, notes.finish(advantages, table)

    def _generate(self, prompts, **kwargs):
        output = super()._generate(prompts, **kwargs)
        if self._round is not None:
            self._round.tool_mask = output[2]  # per completion, 1 = written by the model, 0 = a tool's result; or None
        return output

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, *rest, **kwargs):
        # the round's calls go to their environments together; TRL's sequential calls then collect (tool_round)
        dispatch_rounds_ahead(self._sync_tool_dicts, completions)
        return super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions, *rest, **kwargs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list, **kwargs):
        notes = self._round if self._round is not None else RoundNotes()
        tool_mask = notes.tool_mask
        if tool_mask is not None:  # every reward function gets it (TRL passes row fields as keyword arguments):
            inputs = [{**row, "tool_mask": mask} for row, mask in zip(inputs, tool_mask, strict=True)]  # overlong
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list, **kwargs)
        require_finite_rewards(rewards_per_func, self.reward_func_names)  # gathered: every rank raises alike
        if self.model.training:  # the tool-call cap, void turns, tool errors (trl_rlvr.rollouts.stabilisers)
            rewards_per_func = self._stabilisers.score(notes, rewards_per_func, completions, self.environments)
        # a row a correctness check did not score is all NaN: out of every sum, TRL's included (algorithms.unscorable)
        rewards_per_func, unscorable = mark_unscorable(rewards_per_func, self._correctness_checks)
        self._metrics["train" if self.model.training else "eval"]["rlvr/unscorable_frac"].append(
            unscorable.float().mean().item())
        notes.rewards_per_func = rewards_per_func
        notes.rewards = self._total_rewards(rewards_per_func)
        notes.reward_metrics = tuple(self._pending_metrics)  # log_metric counters, flushed by TRL after this
        model_lengths = [len(ids) for ids in completion_ids_list] if tool_mask is None else [sum(m) for m in tool_mask]
        notes.lengths, notes.truncated = gathered_lengths(self.accelerator, completion_ids_list, model_lengths,
                                                          {*self.eos_token_ids, self._tokenizer.pad_token_id})
        self._log_rollout_metrics(notes)
        if self.tools:
            self._log_tool_metrics(completions)
        return rewards_per_func

    def _total_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """Weighted sum over reward functions, NaN for an unscorable row (:func:`~trl_rlvr.algorithms.unscorable.
        total_rewards`, after ``mark_unscorable``)."""
        return total_rewards(rewards_per_func, self.reward_weights)

    def _filter_rewards(self, record: RoundRecord) -> torch.Tensor:
        """What a group must vary in to have signal (``dynamic_sampling_metric``)."""
        return filter_rewards(record, self.args.dynamic_sampling_metric, self._success_index)

    # -- what is logged -----------------------------------------------------------------------------------------

    def _log_rollout_metrics(self, notes: RoundNotes) -> None:
        """The rlvr/ diagnostics of the round's generation (every row generated, before any filtering)."""
        if self._success_index is None:
            return
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        metrics = rollout_metrics(
            notes.rewards, notes.rewards_per_func[:, self._success_index], notes.lengths, notes.truncated,
            group_size, success_threshold=self.args.success_threshold, tolerance=self.args.dynamic_sampling_tolerance,
        )
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)

    def _log_tool_metrics(self, completions) -> None:
        """``rlvr/tool_*`` of the gathered batch: tool results per rollout (any tool), and the figures of
        environments that keep ``stats`` (``PythonEnvironment``: errors, timeouts, restarts)."""
        local = tool_rollout_rows(completions, self.environments or [None] * len(completions))
        gathered = self.accelerator.gather(torch.tensor(local, dtype=torch.float32, device=self.accelerator.device))
        mode = "train" if self.model.training else "eval"
        for key, value in tool_metrics(gathered).items():
            self._metrics[mode][key].append(value)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        for trl_name, rlvr_name in _TRL_METRIC_ALIASES.items():
            if trl_name in self._metrics[mode]:
                self._metrics[mode][rlvr_name] = list(self._metrics[mode][trl_name])
        super().log(logs, start_time)

    def _reference_logps(self, batch: dict) -> torch.Tensor:
        """Reference-model log-probs of the kept rows (TRL's path: the ref model, or the PEFT base)."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        kwargs = dict(logits_to_keep=batch["completion_ids"].size(1), batch_size=self.args.per_device_train_batch_size)
        with torch.no_grad():
            if self.ref_model is not None:
                return self._get_per_token_logps_and_entropies(self.ref_model, input_ids, attention_mask, **kwargs)[0]
            from trl.trainer.utils import use_adapter

            model = self.accelerator.unwrap_model(self.model)
            with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                return self._get_per_token_logps_and_entropies(self.model, input_ids, attention_mask, **kwargs)[0]

    # -- checkpoints --------------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        # resume_from_checkpoint=True takes the newest *complete* checkpoint (a crash while one was written leaves a
        # partial folder that transformers' get_last_checkpoint would pick); SIGTERM checkpoints the step in progress
        # and raises TrainingPreempted (trl_rlvr.faults, docs/faults.md).
        required = [PROMPT_STREAM_STATE_FILE] if self._driver is not None else []
        checkpoint = checkpoint_to_resume(resume_from_checkpoint, self.args.output_dir, required)
        if checkpoint and self._driver is not None:
            self._load_prompt_stream(checkpoint)
        with sigterm_saves(self, enabled=getattr(self.args, "save_on_sigterm", False)):
            return super().train(checkpoint, trial, ignore_keys_for_eval, **kwargs)

    def _save_rng_state(self, output_dir):
        super()._save_rng_state(output_dir)
        # Every process's files (its RNG state, the last one it writes; its weight and optimizer shards under FSDP
        # or DeepSpeed, written before) exist before process 0 writes trainer_state.json, the mark of a complete
        # checkpoint (trl_rlvr.faults.checkpoints).
        self.accelerator.wait_for_everyone()

    def _save_checkpoint(self, model, trial):
        # The prompt stream's position is written first, atomically: a checkpoint whose model, optimizer or
        # trainer state exists (and which rotation may keep as the last one) always has it.
        if self._driver is not None and self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            write_json_atomically(os.path.join(folder, PROMPT_STREAM_STATE_FILE), self._driver.stream.state_dict())
        super()._save_checkpoint(model, trial)

    def _load_prompt_stream(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, PROMPT_STREAM_STATE_FILE)
        if os.path.exists(path):
            with open(path) as f:
                self._driver.stream.load_state_dict(json.load(f))
        else:
            logger.warning(
                "dynamic sampling: the checkpoint %s has no %s (written without dynamic or selective sampling, or "
                "not by RLVRTrainer): the prompt stream restarts from the beginning of the dataset, so prompts already "
                "trained on are drawn again", checkpoint, PROMPT_STREAM_STATE_FILE,
            )

    # -- loss normalisation -------------------------------------------------------------------------------------

    def _prepare_inputs(self, generation_batch, **kwargs):
        buffered_before = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch, **kwargs)
        if not self.model.training:
            return inputs
        if self._skip_empty_updates is not None and self._generation_has_signal is not False:
            self._skip_empty_updates.step_has_signal = True  # this micro-step's batch can carry a gradient
        if self._buffered_inputs is not buffered_before and self._sets_exact_token_counts():
            self._set_exact_token_counts(self._buffered_inputs)
        return inputs

    def _sets_exact_token_counts(self) -> bool:
        """Whether every micro-batch gets its optimizer step's exact token count (in ``_prepare_inputs``)."""
        return (
            self.args.loss_normalization == "per_batch_token"
            and self.args.token_count_scope == "optimizer_step"
            and self.args.steps_per_generation % self.args.gradient_accumulation_steps == 0
        )

    def _set_exact_token_counts(self, micro_batches: list[dict]) -> None:
        """Give each buffered micro-batch the token count of its optimizer step's global batch (DAPO, exact)."""
        local = torch.stack([_loss_mask(batch).sum() for batch in micro_batches]).float()
        global_counts = self.accelerator.reduce(local, reduction="sum")
        for batch, num_items in zip(
            micro_batches, per_step_num_items(global_counts, self.args.gradient_accumulation_steps), strict=True
        ):
            batch["num_items_in_batch"] = num_items

    def training_step(self, model, inputs, num_items_in_batch=None):
        # TRL's LM-head tiles sized for a CPU, around the step's forward and backward (_compat.logprob_tiles)
        with cpu_logprob_tiles(self.args.cpu_logprob_tile_tokens, self.accelerator.device):
            return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # TRL's dr_grpo divides by (rows x max_completion_length); Dr. GRPO's constant may be set apart from it.
        constant = self.args.loss_normalization == "constant" and self.args.loss_constant is not None
        divisor = swapped(self, "max_completion_length", self.args.loss_constant) if constant else nullcontext()
        figures = nullcontext()  # with fillers, TRL's loss figures only of the micro-batches that have a loss token
        if self.args.dynamic_sampling_partial_batch == "pad" and self.args.dynamic_sampling and self.model.training:
            tokens = self.accelerator.reduce(_loss_mask(inputs).sum().float(), reduction="sum")
            figures = loss_figures_of_trained_tokens(self._metrics["train"], has_loss_tokens=bool(tokens > 0))
        with self._policy_shift.recording(inputs), divisor, figures:  # the loss's log-probs: rlvr/shift_* (checks.shift_monitor)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def _loss_mask(batch: dict) -> torch.Tensor:
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask
