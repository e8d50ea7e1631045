"""The one adapter between `RLVRTrainer`'s public hooks and TRL's private `GRPOTrainer` internals.

`RLVRTrainer` is written as the pull request we would send TRL: public, documented hooks (``transform_rewards``,
``compute_advantages``, ``optimizer_step_token_counts``, ``save_prompt_stream``; docs/trainer.md, "Upstreaming").
TRL 1.16 does not call them, so this mixin, placed before ``GRPOTrainer`` in ``RLVRTrainer``'s bases, overrides the
private methods at the points where TRL would, each in a few lines, and holds every private piece of TRL (and of
transformers) the package touches: the methods it overrides or calls, the attributes it reads, the state it swaps for
one call, and the round in progress, noted while TRL generates it. All of it is declared, with why, in
:mod:`trl_rlvr._compat.trl_contract`, which checks it against the installed TRL (``pytest -m trl_contract``).
docs/trainer.md says, hook by hook, which of these methods disappears the day TRL calls the hook itself.

One round: ``_generate_and_score_completions`` asks the round driver (:mod:`trl_rlvr.sampling.driver`) for a
generation batch; the driver asks :meth:`GRPOAdapter._score_round` for each round; TRL's own method generates
(``_generate``, ``_tool_call_loop``) and scores (``_calculate_rewards``, which calls the trainer's
``transform_rewards``); the driver then calls the trainer's ``compute_advantages`` once over the rows it keeps.
"""

from __future__ import annotations

import contextlib
import os

import torch
from trl.extras.profiling import profiling_context

from trl_rlvr._compat.gloo_exit import destroy_gloo_process_group_at_exit
from trl_rlvr._compat.logprob_tiles import cpu_logprob_tiles
from trl_rlvr._compat.quantized import keep_4bit_weights_trainable
from trl_rlvr._compat.swaps import swapped, table_held_back
from trl_rlvr._compat.trl_contract import warn_on_contract_violations
from trl_rlvr._compat.vllm_cpu import reloads_on_cpu, sync_weights_on_cpu
from trl_rlvr.algorithms.unscorable import total_rewards
from trl_rlvr.rollouts.tool_turn import tool_turns
from trl_rlvr.sampling.driver import RoundDriver
from trl_rlvr.sampling.rounds import RoundNotes, RoundRecord, gathered_lengths


def metrics_to_log(trainer, mode: str | None = None) -> dict[str, list[float]]:
    """A GRPOTrainer's metrics for its next log, by name (``mode``: "train" or "eval"; default: the model's):
    TRL averages each list when it logs."""
    return trainer._metrics[mode or ("train" if trainer.model.training else "eval")]


def is_new_best_metric(trainer, metrics: dict[str, float]) -> bool:
    """transformers' best-model selection of ``metrics`` (``{"eval_<name>": value}``), as its evaluation does."""
    return trainer._determine_best_metric(metrics=metrics, trial=None)


def sync_vllm_weights_once_per_step(trainer) -> None:
    """Sync a colocated vLLM engine with the policy's weights as TRL does before it generates: once per optimizer
    step (TRL then skips its own sync for this step). An engine on a CPU, where TRL's sync fails, is synced through
    vLLM's reload path instead (:mod:`trl_rlvr._compat.vllm_cpu`)."""
    if trainer.state.global_step != trainer._last_loaded_step:
        generation = trainer.vllm_generation
        if reloads_on_cpu(generation):
            sync_weights_on_cpu(generation)
        else:
            generation.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step


class GRPOAdapter:
    """Mixin for a ``GRPOTrainer`` subclass with the public hooks of :class:`trl_rlvr.RLVRTrainer`."""

    _round_notes: RoundNotes | None = None  # the round TRL is generating: noted by _generate, _calculate_rewards
    _generation_has_signal: bool | None = None  # of the generation batch TRL's _buffered_inputs holds
    _loss_logps_observer = None  # observing_loss_logprobs's callback, while its block runs
    _vllm_reloads_on_cpu = False  # a colocated vLLM engine on a CPU: synced by _generate (_compat.vllm_cpu)

    def __init__(self, *args, **kwargs):
        # TRL's server mode opens an NCCL group with the vLLM server while GRPOTrainer.__init__ runs; a trainer
        # without CUDA gets TRL's client with a file-based weight push instead (_compat.vllm_server)
        from trl_rlvr._compat.vllm_server import server_client_without_nccl

        with server_client_without_nccl(kwargs.get("args")):
            super().__init__(*args, **kwargs)

    def _adapt_to_trl(self) -> None:
        """After ``GRPOTrainer.__init__``: the contract checked, the back-ends TRL runs on a CPU adapted."""
        warn_on_contract_violations(self)
        if self.accelerator.num_processes > 1:  # a gloo group left to finalization can abort a finished rank
            destroy_gloo_process_group_at_exit()
        for trained_or_reference in (self.model, self.ref_model):
            keep_4bit_weights_trainable(trained_or_reference)  # QLoRA on AVX512-BF16 CPUs (see quantized.py)
        # TRL's colocate weight sync fails when vLLM runs on a CPU: _generate syncs through vLLM's reload path first
        self._vllm_reloads_on_cpu = self.use_vllm and reloads_on_cpu(self.vllm_generation)

    # -- what the package reads of TRL's state ------------------------------------------------------------------

    def metrics_to_log(self, mode: str | None = None) -> dict[str, list[float]]:
        """The metrics TRL averages into its next log, by name (``mode``: "train" or "eval"; default: the model's)."""
        return metrics_to_log(self, mode)

    @property
    def _pad_token_id(self) -> int:
        return self._tokenizer.pad_token_id

    # -- one generation batch: the round driver's rounds --------------------------------------------------------

    def _make_round_driver(self) -> RoundDriver:
        """The round driver of every round, wired to TRL's state: its metrics sink, its pad token, its settings."""
        args = self.args
        trl_advantages = (self.multi_objective_aggregation != "sum_then_normalize"
                          or (args.advantage_std == "sample" and args.advantage_baseline == "group_mean"))
        return RoundDriver(
            args, self.train_dataset, group_sizes=(self.num_generations, self.num_generations_eval),
            score_round=self._score_round, compute_advantages=self.compute_advantages, accelerator=self.accelerator,
            metrics=self._metrics, success_index=self.success_reward_index, reward_weights=self.reward_weights,
            reward_func_names=self.reward_func_names, scale_rewards=self.scale_rewards,
            mask_truncated_completions=self.mask_truncated_completions, pad_token_id=self._pad_token_id,
            shuffle=self.shuffle_dataset, rules=self.row_rules, trl_advantages=trl_advantages,
        )

    def _generate_and_score_completions(self, inputs, **kwargs):
        driver = self._round_driver
        if self.model.training:
            batch, generation = driver.generation_batch(inputs)
            self._generation_has_signal = generation.has_signal
            if driver.drops_rows and self.beta != 0.0:  # generated with beta=0: the kept rows' reference log-probs
                batch["ref_per_token_logps"] = (self._reference_logps(batch) if generation.has_signal else
                                                torch.zeros_like(batch["completion_ids"], dtype=torch.float32))
        else:
            batch, generation = driver.one_round(inputs, None, training=False)
        generation.write_table(self._logs, self.reward_func_names)
        return batch

    def _score_round(self, inputs, prompt_indices: list[int] | None = None, drops_rows: bool = False
                     ) -> tuple[dict, RoundRecord]:
        """One round of TRL's generation and scoring: this process's rows (TRL's batch dict) and the round's record.
        TRL's completions-table entries are held in the record until the rows trained on are known; a round whose
        rows may be dropped (``drops_rows``) is generated with ``beta=0`` (no reference log-probs of dropped rows)."""
        notes = self._round_notes = RoundNotes(prompt_indices=prompt_indices)
        no_reference = swapped(self, "beta", 0.0) if drops_rows else contextlib.nullcontext()
        try:
            with table_held_back(self) as table, no_reference:
                output = super()._generate_and_score_completions(inputs)
        finally:
            self._round_notes = None
        return output, notes.finish(torch.tensor(table["advantages"], dtype=torch.float32), table)

    def _generate(self, prompts, **kwargs):
        if self._vllm_reloads_on_cpu and self.state.global_step != self._last_loaded_step:
            with profiling_context(self, "sync_weights"):  # as TRL's sync; TRL then finds this step synced
                sync_vllm_weights_once_per_step(self)
        output = super()._generate(prompts, **kwargs)
        if self._round_notes is not None:
            self._round_notes.tool_mask = output[2]  # per completion, 1 = written by the model, 0 = a tool's result; or None
        return output

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, *rest, **kwargs):
        # each turn's calls go to their environments together; TRL's sequential calls then collect (tool_turn)
        with tool_turns(self.environments, completions):
            return super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions, *rest, **kwargs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list, **kwargs):
        notes = self._round_notes if self._round_notes is not None else RoundNotes()
        if notes.tool_mask is not None:  # every reward function gets it, as TRL passes completion_ids (overlong)
            inputs = [{**row, "tool_mask": mask} for row, mask in zip(inputs, notes.tool_mask, strict=True)]
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list, **kwargs)
        model_written = ([len(ids) for ids in completion_ids_list] if notes.tool_mask is None
                         else [sum(mask) for mask in notes.tool_mask])
        notes.lengths, notes.truncated = gathered_lengths(self.accelerator, completion_ids_list, model_written,
                                                          {*self.eos_token_ids, self._pad_token_id})
        notes.rewards_per_func = self.transform_rewards(rewards_per_func, completions, notes.notes)
        notes.rewards = total_rewards(notes.rewards_per_func, self.reward_weights)  # summed once
        notes.reward_metrics = tuple(self._pending_metrics)  # log_metric counters, flushed by TRL after this
        return notes.rewards_per_func

    def _reference_logps(self, batch: dict) -> torch.Tensor:
        """Reference-model log-probs of the kept rows (TRL's path: the ref model, or the PEFT base)."""
        if self.ref_model is not None:
            return self.completion_logps(batch, self.ref_model)
        from trl.trainer.utils import use_adapter

        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self.completion_logps(batch, self.model)

    def completion_logps(self, batch: dict, model) -> torch.Tensor:
        """(B, T) log-probabilities of a batch's completion tokens under ``model``, without gradients (TRL's scorer,
        in micro-batches of ``per_device_train_batch_size``)."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with torch.no_grad():
            return self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep=batch["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size)[0]

    # -- a training step --------------------------------------------------------------------------------------

    def _prepare_inputs(self, generation_batch, **kwargs):
        buffered_before = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch, **kwargs)
        if not self.model.training:
            return inputs
        if self._skip_empty_updates is not None and self._generation_has_signal is not False:
            self._skip_empty_updates.step_has_signal = True  # this micro-step's batch can carry a gradient
        if self._buffered_inputs is not buffered_before:  # a new generation batch, split into micro-batches
            counts = self.optimizer_step_token_counts(self._buffered_inputs)
            if counts is not None:
                for batch, num_items in zip(self._buffered_inputs, counts, strict=True):
                    batch["num_items_in_batch"] = num_items
        return inputs

    def training_step(self, model, inputs, num_items_in_batch=None):
        # TRL's LM-head tiles sized for a CPU, around the step's forward and backward (_compat.logprob_tiles)
        with cpu_logprob_tiles(self.args.cpu_logprob_tile_tokens, self.accelerator.device):
            return super().training_step(model, inputs, num_items_in_batch)

    @contextlib.contextmanager
    def observing_loss_logprobs(self, observe):
        """Within the block, ``observe(per_token_logps)`` sees the log-probabilities TRL's loss computes with
        gradients (the policy's forward of the loss; a reference model's runs without): TRL has no hook between its
        forward and its loss, and a second forward would cost as much again."""
        self._loss_logps_observer = observe
        try:
            yield
        finally:
            self._loss_logps_observer = None

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        # TRL's scorer, as TRL calls it; within observing_loss_logprobs, its log-probs with gradients are observed
        output = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._loss_logps_observer is not None and torch.is_grad_enabled():
            self._loss_logps_observer(output[0].detach())
        return output

    # -- checkpoints (transformers) ---------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial):
        # The prompt stream's position is written first, atomically: a checkpoint whose model, optimizer or
        # trainer state exists (and which rotation may keep as the last one) always has it.
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        self.save_prompt_stream(folder)
        super()._save_checkpoint(model, trial)

    def _save_rng_state(self, output_dir):
        super()._save_rng_state(output_dir)
        # Every process's files (its RNG state, the last one it writes; its weight and optimizer shards under FSDP
        # or DeepSpeed, written before) exist before process 0 writes trainer_state.json, the mark of a complete
        # checkpoint (trl_rlvr.faults.checkpoints).
        self.accelerator.wait_for_everyone()
