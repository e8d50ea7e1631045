"""`RLVRTrainer`: TRL's `GRPOTrainer` with the RLVR switches of `RLVRConfig`, as thin glue.

What is TRL's and what is ours:

- the PPO-clip token loss, clip-higher (``epsilon``/``epsilon_high``) and ``mask_truncated_completions`` are
  TRL's code, used as is (tests hold them to independent references);
- the group advantages are recomputed with the population std of the GRPO paper
  (:func:`trl_rlvr.algorithms.advantages.group_advantages`): TRL 1.16 divides by the sample std (Bessel), 0.87x at G=4
  (``advantage_std="sample"`` keeps TRL's; a ``GRPOConfig`` is converted with TRL's behaviour, :mod:`.compat`);
  ``advantage_baseline="leave_one_out"`` takes RLOO's baseline instead of the group mean;
- ``loss_normalization`` selects TRL's ``loss_type``; for ``per_batch_token`` we give every micro-batch the exact
  token count of its optimizer step (:func:`trl_rlvr.algorithms.losses.per_step_num_items`); for ``constant`` we let
  ``loss_constant`` replace ``max_completion_length`` as Dr. GRPO's divisor;
- reward functions may be registry names (``reward_funcs=["boxed_math", "think_format"]``);
- DAPO's soft overlong penalty is the ``overlong`` reward plugin (TRL's ``get_soft_overlong_punishment``),
  appended with ``overlong_penalty_factor`` as its reward weight (so it is added to the reward before the group
  baseline and logged, unweighted, as ``rewards/overlong/mean``);
- the ``rlvr/`` diagnostics (:mod:`trl_rlvr.algorithms.metrics`) are computed from the gathered rewards of each batch.

What logged figures mean: every advantage, reward and length figure TRL logs (``reward``, ``reward_std``,
``frac_reward_zero_std``, ``rewards/*``, ``completions/*`` lengths, and the completions table of ``log_completions``)
is the one of the rows the loss used, with the advantage the loss used; the ``rlvr/`` diagnostics describe what was
generated (every round, before dynamic sampling's filter).

A round's data travels in one typed record (:class:`~trl_rlvr.sampling.rounds.RoundRecord`; a generation batch's in a
:class:`~trl_rlvr.sampling.rounds.GenerationRecord`). TRL's hooks cannot be given arguments, so the record of the
round in progress is the one piece of per-round state on ``self`` (``_round``), alongside ``_generation_has_signal``:
whether the generation batch TRL's ``_buffered_inputs`` holds can carry a gradient (the records themselves are not
kept past the round that logs them, so nothing of a generation batch outlives its step).

TRL methods overridden (each calls ``super()`` and forwards TRL's extra keywords), and why:

- ``__init__``: registry names -> reward plugins, the overlong penalty appended, pre-load checks of the dataset and
  tool settings; TRL's arguments taken by keyword, in TRL's order, and forwarded by keyword.
- ``_generate_and_score_completions``: the round driver: one round (advantages replaced), or dynamic / selective
  sampling's rounds; the completions-table entries TRL writes are held back and replaced by the trained rows'.
- ``_generate``: reads the tool mask of the round (into the round's record).
- ``_calculate_rewards``: the tool mask to the reward functions; finite-reward check; total rewards, lengths and the
  ``rlvr/`` diagnostics into the round's record.
- ``_prepare_inputs``: exact per-optimizer-step token counts (DAPO); marks micro-steps of non-empty batches.
- ``_compute_loss``: Dr. GRPO's ``loss_constant`` (``max_completion_length`` swapped for the call).
- ``_generate_single_turn``: vLLM-on-CPU weight sync (:mod:`trl_rlvr._compat.vllm_cpu`).
- ``log``: ``clip_ratio/*`` re-published as ``rlvr/clip_*_frac``.
- transformers ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: the prompt stream's position.

Every private piece of TRL this glue overrides, reads or swaps is listed in :mod:`trl_rlvr._compat.trl_contract`, which a
test checks against the installed TRL.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
from collections import defaultdict

import torch
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from trl_rlvr._compat.notices import silence_trl_generation_notice
from trl_rlvr._compat.quantized import keep_4bit_weights_trainable
from trl_rlvr.algorithms.advantages import group_advantages, require_finite_rewards, zero_signal_groups
from trl_rlvr.algorithms.losses import per_step_num_items
from trl_rlvr.algorithms.metrics import rollout_metrics, tool_metrics
from trl_rlvr.algorithms.shaping import overlong_penalty
from trl_rlvr.checks.alarms import RLVRAlarms
from trl_rlvr.checks.columns import check_dataset_columns
from trl_rlvr.checks.settings import check_tool_settings
from trl_rlvr.config import RLVRConfig
from trl_rlvr.faults import checkpoint_to_resume, sigterm_saves
from trl_rlvr.rewards.registry import resolve_reward_funcs
from trl_rlvr.sampling.dynamic import (
    ROW_KEYS,
    PromptStream,
    informative_rows,
    prompts_for_round,
    rows_per_process,
    write_json_atomically,
)
from trl_rlvr.sampling.figures import trained_figure_names, trained_figures
from trl_rlvr.sampling.redistribute import destinations, exchange_rows, pad_pieces
from trl_rlvr.sampling.rounds import GenerationRecord, RoundRecord
from trl_rlvr.sampling.selective import PromptHistory, record_groups
from trl_rlvr.sampling.tool_rounds import dispatch_rounds_ahead

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
        for trained_or_reference in (self.model, self.ref_model):
            keep_4bit_weights_trainable(trained_or_reference)  # QLoRA on AVX512-BF16 CPUs (see quantized.py)
        self._success_index = self._find_success_reward(args.success_reward)
        self._prompt_stream = self._make_prompt_stream() if args.dynamic_sampling or args.selective_sampling else None
        self._round: RoundRecord | None = None  # the round TRL is generating: filled by _generate, _calculate_rewards
        self._generation_has_signal: bool | None = None  # of the generation batch TRL's _buffered_inputs holds
        self._skip_empty_updates = _SkipEmptyUpdates(self) if args.dynamic_sampling else None
        if self._skip_empty_updates is not None:
            self.add_callback(self._skip_empty_updates)
        if args.alarms:
            self.add_callback(RLVRAlarms(self))  # warnings when a run goes quietly wrong (trl_rlvr.checks.alarms)

    @property
    def success_reward_index(self) -> int | None:
        """Index (in ``reward_funcs`` and ``reward_func_names``) of the reward that decides whether an answer is right
        (``args.success_reward``, else the first correctness verifier, else the first reward); None without rewards."""
        return self._success_index

    # -- construction -------------------------------------------------------------------------------------------

    @staticmethod
    def _resolve_reward_funcs(reward_funcs, args: RLVRConfig):
        """Registry names -> plugins; append the overlong penalty when ``overlong_buffer_length`` is set."""
        if reward_funcs is None:
            funcs = []
        elif isinstance(reward_funcs, (list, tuple)):
            funcs = list(reward_funcs)
        else:
            funcs = [reward_funcs]
        if any(isinstance(f, str) for f in funcs):
            funcs = resolve_reward_funcs(funcs, args.reward_options)
        if args.overlong_buffer_length is not None:
            funcs.append(overlong_penalty(args.max_completion_length, args.overlong_buffer_length))
        return funcs if funcs or reward_funcs is not None else None

    def _make_prompt_stream(self) -> PromptStream:
        from torch.utils.data import IterableDataset

        if self.train_dataset is None or isinstance(self.train_dataset, IterableDataset):
            raise ValueError(
                "dynamic_sampling / selective_sampling need a map-style (indexable) train_dataset to draw prompts from"
            )
        history = None
        if self.args.selective_sampling:
            history = PromptHistory(self.args.selective_sampling_window, self.args.revisit_probability, self.args.seed)
        return PromptStream(
            len(self.train_dataset),
            prompts_per_round=self.args.generation_batch_size // self.num_generations,
            group_size=self.num_generations,
            seed=self.args.seed,
            shuffle=self.shuffle_dataset,
            history=history,
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

    # -- one round: TRL's generation and scoring, recorded ------------------------------------------------------

    def _generate_and_score_completions(self, inputs, **kwargs):
        if self.model.training and self.args.dynamic_sampling:
            batch, generation = self._generate_informative_batch(inputs)
        elif self.model.training and self.args.selective_sampling:
            batch, generation = self._generate_selected_round()
        else:
            batch, record = self._score_round(inputs, **kwargs)
            generation = GenerationRecord.whole(record)
            self._log_trained_rows(generation)
        if self.model.training:
            self._generation_has_signal = generation.has_signal
        return batch

    def _score_round(self, inputs, prompt_indices: list[int] | None = None, **kwargs) -> tuple[dict, RoundRecord]:
        """One round of TRL's generation and scoring: this process's rows (TRL's batch dict, with our advantages)
        and the round's record. TRL calls ``_generate`` and ``_calculate_rewards`` from inside, which fill the
        record; the completions-table entries TRL writes are held in the record until the trained rows are known."""
        record = self._round = RoundRecord(prompt_indices=prompt_indices)
        try:
            with _table_held_back(self) as table:
                output = super()._generate_and_score_completions(inputs, **kwargs)
        finally:
            self._round = None
        record.table = table
        mode = "train" if self.model.training else "eval"
        trls_own = self.args.advantage_std == "sample" and self.args.advantage_baseline == "group_mean"
        if self.multi_objective_aggregation == "sum_then_normalize" and not trls_own:  # else TRL's are kept
            group_size = self.num_generations if mode == "train" else self.num_generations_eval
            record.advantages = group_advantages(
                record.rewards, group_size, self.scale_rewards, baseline=self.args.advantage_baseline,
                std=self.args.advantage_std,
            )
            rows = len(output["advantages"])
            start = self.accelerator.process_index * rows
            output["advantages"] = record.advantages[start : start + rows].to(output["advantages"].dtype)
        else:  # TRL's, exactly as it computed (and logged) them for every process
            record.advantages = torch.tensor(table["advantages"], dtype=torch.float32)
        return output, record

    def _generate(self, prompts, **kwargs):
        output = super()._generate(prompts, **kwargs)
        if self._round is not None:
            self._round.tool_mask = output[2]  # per completion, 1 = written by the model, 0 = a tool's result; or None
        return output

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, *rest, **kwargs):
        # the round's calls go to their environments together; TRL's sequential calls then collect (tool_rounds)
        dispatch_rounds_ahead(self._sync_tool_dicts, completions)
        return super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions, *rest, **kwargs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list, **kwargs):
        record = self._round if self._round is not None else RoundRecord()
        tool_mask = record.tool_mask
        if tool_mask is not None:  # every reward function gets it (TRL passes row fields as keyword arguments):
            inputs = [{**row, "tool_mask": mask} for row, mask in zip(inputs, tool_mask, strict=True)]  # overlong
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list, **kwargs)
        require_finite_rewards(rewards_per_func, self.reward_func_names)  # gathered: every rank raises alike
        record.rewards_per_func = rewards_per_func
        record.rewards = self._total_rewards(rewards_per_func)
        model_lengths = [len(ids) for ids in completion_ids_list] if tool_mask is None else [sum(m) for m in tool_mask]
        record.lengths, record.truncated = self._gathered_lengths(completion_ids_list, model_lengths)
        self._log_rollout_metrics(record)
        if self.tools:
            self._log_tool_metrics(completions)
        return rewards_per_func

    def _total_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """Weighted sum over reward functions, NaN where no function scored the answer (as TRL does)."""
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return rewards

    def _gathered_lengths(self, completion_ids_list, model_lengths) -> tuple[torch.Tensor, torch.Tensor]:
        """(N,) tokens the model wrote (tool results not counted, as TRL's ``completions/mean_length``) and (N,)
        truncation flags (no stop token at the end), gathered over processes."""
        stop_ids = {*self.eos_token_ids, self._tokenizer.pad_token_id}
        local = torch.tensor(
            [[n, float(bool(ids) and ids[-1] not in stop_ids)]
             for ids, n in zip(completion_ids_list, model_lengths, strict=True)],
            dtype=torch.float32,
            device=self.accelerator.device,
        )
        lengths, truncated = self.accelerator.gather(local).unbind(dim=1)
        return lengths, truncated.bool()

    def _filter_rewards(self, record: RoundRecord) -> torch.Tensor:
        """What a group must vary in to have signal (``dynamic_sampling_metric``): the total reward or the success
        reward alone."""
        if self.args.dynamic_sampling_metric == "success":
            return record.rewards_per_func[:, self._success_index]
        return record.rewards

    # -- what is logged: the rows trained on --------------------------------------------------------------------

    def _log_rollout_metrics(self, record: RoundRecord) -> None:
        """The rlvr/ diagnostics of the round's generation (every row generated, before any filtering)."""
        if self._success_index is None:
            return
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        metrics = rollout_metrics(
            record.rewards,
            record.rewards_per_func[:, self._success_index],
            record.lengths,
            record.truncated,
            group_size,
            success_threshold=self.args.success_threshold,
            tolerance=self.args.dynamic_sampling_tolerance,
        )
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)

    def _log_tool_metrics(self, completions) -> None:
        """``rlvr/tool_*`` of the gathered batch: tool results per rollout (any tool), and the figures of
        environments that keep ``stats`` (``PythonEnvironment``: errors, timeouts, restarts)."""
        environments = self.environments or [None] * len(completions)
        local = []
        for completion, env in zip(completions, environments, strict=True):
            calls = sum(1 for m in completion if isinstance(m, dict) and m.get("role") == "tool")
            stats = getattr(env, "stats", None)
            if isinstance(stats, dict):
                local.append([1.0, calls, stats.get("errors", 0), stats.get("timeouts", 0), stats.get("restarts", 0)])
            else:
                local.append([0.0, calls, 0.0, 0.0, 0.0])
        device = self.accelerator.device
        gathered = self.accelerator.gather(torch.tensor(local, dtype=torch.float32, device=device))
        mode = "train" if self.model.training else "eval"
        for key, value in tool_metrics(gathered).items():
            self._metrics[mode][key].append(value)

    def _log_trained_rows(self, generation: GenerationRecord) -> None:
        """The completions table gets the rows trained on, each with the advantage the loss uses (TRL wrote its
        own advantages, before ours replaced them, and every row of every round)."""
        logs = self._logs
        logs["prompt"].extend(generation.table_entries("prompt"))
        logs["completion"].extend(generation.table_entries("completion"))
        logs["images"].extend(generation.table_entries("images"))
        for name in self.reward_func_names:
            logs["rewards"][name].extend(generation.table_entries("rewards", name))
        columns = {column for record in generation.rounds for column in record.table["extra"]}
        for column in sorted(columns):
            logs["extra"][column].extend(generation.table_entries("extra", column))
        if generation.advantages is not None:
            logs["advantages"].extend(generation.advantages.tolist())

    def _trained_figure_marks(self) -> dict[str, int]:
        """Where TRL's per-round reward and length figures of this generation batch start (train metrics)."""
        metrics = self._metrics["train"]
        return {name: len(metrics[name]) for name in trained_figure_names(self.reward_func_names)}

    def _log_trained_figures(self, marks: dict[str, int], generation: GenerationRecord | None) -> None:
        """Replace TRL's reward and length figures of every round since ``marks`` (all rows generated) by one
        value each over the rows trained on (none for an empty batch)."""
        metrics = self._metrics["train"]
        for name, mark in marks.items():
            del metrics[name][mark:]
            if not metrics[name]:
                del metrics[name]  # not logged as None
        if generation is None:
            return
        figures = trained_figures(
            generation.column("rewards_per_func"), self.reward_weights, self.reward_func_names,
            generation.column("lengths"), generation.column("truncated"), self.num_generations, self.scale_rewards,
        )
        for name, value in figures.items():
            metrics[name].append(value)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        for trl_name, rlvr_name in _TRL_METRIC_ALIASES.items():
            if trl_name in self._metrics[mode]:
                self._metrics[mode][rlvr_name] = list(self._metrics[mode][trl_name])
        super().log(logs, start_time)

    # -- dynamic sampling ---------------------------------------------------------------------------------------

    def _generate_informative_batch(self, inputs) -> tuple[dict, GenerationRecord]:
        """DAPO dynamic sampling: rounds of generation until the batch is full of groups with signal.

        Every rank runs the same rounds (the decision comes from the gathered rewards) and keeps its own rows of
        the informative groups; the kept rows are then handed to the ranks that train them, in the order an
        all-gather would give (:mod:`trl_rlvr.sampling.redistribute`), so ranks stay in lockstep, groups may span
        processes, and each rank holds and moves O(its own rows). The dataloader's batch only sets the size: every
        round, the first included, draws its prompts from one :class:`PromptStream`.
        """
        target = len(inputs)
        group_size, num_processes = self.num_generations, self.accelerator.num_processes
        max_rounds = self.args.max_sampling_rounds or self._prompt_stream.rounds_per_pass  # 0: one full pass at most
        marks = self._trained_figure_marks()
        kept_rounds, pieces, revisits = [], [], [0, 0]
        kept_rows, groups_seen, rounds = 0, 0, 0
        with _swapped(self, "beta", 0.0):  # reference log-probs are computed below, for kept rows only
            while True:
                rounds += 1
                missing_groups = -(-(target * num_processes - kept_rows) // group_size)
                prompts = prompts_for_round(missing_groups, self._prompt_stream.prompts_per_round,
                                            self.args.dynamic_sampling_oversample, group_size, num_processes)
                output, record = self._score_round(*self._next_prompts(prompts))
                revisits = [a + b for a, b in zip(revisits, self._record_round(record), strict=True)]
                record.keep = informative_rows(self._filter_rewards(record), group_size,
                                               self.args.dynamic_sampling_tolerance)
                groups_seen += len(record.keep) // group_size
                if record.keep.any():
                    pieces.append(self._own_kept_rows(output, record))
                    kept_rounds.append(record)
                    kept_rows += int(record.keep.sum())
                if kept_rows >= target * num_processes or rounds >= max_rounds:
                    break
        rows = rows_per_process(kept_rows, num_processes, self.args.steps_per_generation, target)
        mode_metrics = self._metrics["train"]
        mode_metrics["rlvr/sampling_rounds"].append(rounds)
        mode_metrics["rlvr/prompts_sampled"].append(groups_seen)
        mode_metrics["rlvr/kept_groups_frac"].append(kept_rows / group_size / groups_seen)
        self._log_selection_metrics(groups_seen * group_size, rows * num_processes, revisits)
        if rows < target:
            logger.warning(
                "dynamic sampling: %d rounds found %d informative groups of the %d wanted; training on %d rows "
                "per process", rounds, kept_rows // group_size, target * num_processes // group_size, rows,
            )
        if rows == 0:
            self._log_trained_figures(marks, None)
            return self._empty_update(output), GenerationRecord([], [], None, has_signal=False)
        batch = self._hand_over_kept_rows(pieces, kept_rounds, rows)
        kept = [record.keep.nonzero().flatten() for record in kept_rounds]
        advantages = torch.cat([record.advantages[rows_t] for record, rows_t in zip(kept_rounds, kept, strict=True)])
        start = self.accelerator.process_index * rows
        if self.scale_rewards == "batch":  # the batch std of the groups trained on, not of those dropped (as verl)
            kept_rewards = torch.cat([r.rewards[rows_t] for r, rows_t in zip(kept_rounds, kept, strict=True)])
            advantages = group_advantages(
                kept_rewards, group_size, "batch", baseline=self.args.advantage_baseline, std=self.args.advantage_std
            )
            batch["advantages"] = advantages[start : start + rows].to(batch["advantages"])
        generation = GenerationRecord(kept_rounds, _first_rows(kept, rows * num_processes),
                                      advantages[: rows * num_processes])
        # the loss tokens of every process's trained rows, from the gathered lengths (no reduction of the rows)
        loss_tokens = generation.column("lengths")
        if self.mask_truncated_completions:  # TRL zeroes a truncated answer's completion mask
            loss_tokens = loss_tokens * ~generation.column("truncated")
        batch["num_items_in_batch"] = torch.tensor(int(loss_tokens.sum().item()), device=self.accelerator.device)
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = self._reference_logps(batch)
        self._log_trained_rows(generation)
        self._log_trained_figures(marks, generation)
        return batch, generation

    def _own_kept_rows(self, output: dict, record: RoundRecord) -> dict:
        """This process's rows of the round's informative groups; records the round's widest width of every 2-D
        row tensor over the processes (one small gather), to which the kept rows are later padded."""
        unsupported = [k for k, v in output.items() if k not in ROW_KEYS and k != "num_items_in_batch"]
        if unsupported:
            raise ValueError(f"dynamic_sampling does not support batches with {unsupported} (e.g. multimodal inputs)")
        present = [key for key in ROW_KEYS if output.get(key) is not None]
        wide = [key for key in present if output[key].dim() >= 2]
        local_widths = torch.tensor([output[key].size(1) for key in wide], device=self.accelerator.device)
        widest = self.accelerator.gather(local_widths).view(-1, len(wide)).amax(dim=0).tolist()
        record.widths = dict(zip(wide, widest, strict=True))
        rows = len(output["advantages"])
        start = self.accelerator.process_index * rows
        keep = record.keep[start : start + rows]
        return {key: output[key][keep.to(output[key].device)] for key in present}

    def _hand_over_kept_rows(self, pieces: list[dict], kept_rounds: list[RoundRecord], rows: int) -> dict:
        """Every process's ``rows`` rows to train on: the kept rows in round order, process r taking positions
        ``[r*rows, (r+1)*rows)``; only rows that change process are sent (point to point)."""
        widths = {key: max(record.widths[key] for record in kept_rounds) for key in kept_rounds[0].widths}
        local = pad_pieces(pieces, widths, self._pad_values())
        num_processes, rank = self.accelerator.num_processes, self.accelerator.process_index
        if num_processes == 1:
            return {key: value[:rows] for key, value in local.items()}
        per_round = []
        for record in kept_rounds:
            per_process = record.keep.view(num_processes, -1).sum(dim=1)
            per_round.append(per_process.tolist())
        plan = destinations(per_round, rows, num_processes)
        return exchange_rows(local, plan, rows, rank, num_processes)

    def _pad_values(self) -> dict:
        pad = self._tokenizer.pad_token_id
        return {"prompt_ids": pad, "completion_ids": pad, "tool_mask": 1}

    def _next_prompts(self, prompts: int | None = None) -> tuple[list[dict], list[int]]:
        """This process's share of the next round of prompts from the stream (``prompts`` of them in all; default
        a full generation batch), and the dataset row of each group of the round (all processes)."""
        indices = self._prompt_stream.next_indices(prompts)
        per_process = len(indices) // self.accelerator.num_processes
        start = self.accelerator.process_index * per_process
        return [self.train_dataset[i] for i in indices[start : start + per_process]], indices[:: self.num_generations]

    def _empty_update(self, output: dict) -> dict:
        """No informative group at all: a batch that carries no gradient, and the optimizer steps it alone feeds
        skipped (:class:`_SkipEmptyUpdates`)."""
        logger.warning("dynamic sampling: no informative group in this batch; skipping the update")
        rows = self.args.steps_per_generation
        batch = {k: v[:rows].clone() for k, v in output.items() if k in ROW_KEYS and v is not None}
        batch["completion_mask"] = torch.zeros_like(batch["completion_mask"])
        batch["advantages"] = torch.zeros_like(batch["advantages"])
        batch["num_items_in_batch"] = torch.zeros((), device=batch["advantages"].device)
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = torch.zeros_like(batch["completion_ids"], dtype=torch.float32)
        return batch

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

    # -- selective sampling -------------------------------------------------------------------------------------

    def _generate_selected_round(self) -> tuple[dict, GenerationRecord]:
        """Selective sampling without dynamic sampling: one round from the stream (skipping predicted zero-signal
        prompts), trained on whole."""
        output, record = self._score_round(*self._next_prompts())
        revisits = self._record_round(record)
        rows = informative_rows(self._filter_rewards(record), self.num_generations,
                                self.args.dynamic_sampling_tolerance)
        self._log_selection_metrics(len(rows), int(rows.sum()), revisits)
        generation = GenerationRecord.whole(record)
        self._log_trained_rows(generation)
        return output, generation

    def _record_round(self, record: RoundRecord) -> tuple[int, int]:
        """Every group of the round into the prompt history, from the gathered rewards, so that every rank holds the
        same history and takes the same skip decisions; returns (revisited prompts, revisits with no signal)."""
        history = self._prompt_stream.history
        if history is None:
            return 0, 0
        group_size = self.num_generations
        zero = zero_signal_groups(self._filter_rewards(record), group_size, self.args.dynamic_sampling_tolerance)
        success = record.rewards_per_func[:, self._success_index] >= self.args.success_threshold
        rates = success.float().view(-1, group_size).mean(dim=1)
        return record_groups(history, record.prompt_indices, rates.tolist(), zero.tolist())

    def _log_selection_metrics(self, answers: int, informative_rows_trained: int, revisits) -> None:
        metrics = self._metrics["train"]
        if informative_rows_trained:
            metrics["rlvr/answers_per_informative_row"].append(answers / informative_rows_trained)
        if self._prompt_stream.history is None:
            return
        metrics["rlvr/prompts_skipped"].append(self._prompt_stream.skipped)
        self._prompt_stream.skipped = 0
        revisited, held = revisits
        if revisited:
            metrics["rlvr/skipped_would_have_been_zero_signal"].append(held / revisited)

    # -- checkpoints --------------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        # resume_from_checkpoint=True takes the newest *complete* checkpoint (a crash while one was written leaves a
        # partial folder that transformers' get_last_checkpoint would pick); SIGTERM checkpoints the step in progress
        # and raises TrainingPreempted (trl_rlvr.faults, docs/faults.md).
        required = [PROMPT_STREAM_STATE_FILE] if self._prompt_stream is not None else []
        checkpoint = checkpoint_to_resume(resume_from_checkpoint, self.args.output_dir, required)
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
        if self._prompt_stream is not None and self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            write_json_atomically(os.path.join(folder, PROMPT_STREAM_STATE_FILE), self._prompt_stream.state_dict())
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if self._prompt_stream is None or not checkpoint:
            return
        path = os.path.join(checkpoint, PROMPT_STREAM_STATE_FILE)
        if os.path.exists(path):
            with open(path) as f:
                self._prompt_stream.load_state_dict(json.load(f))
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

    def _compute_loss(self, model, inputs, **kwargs):
        if self.args.loss_normalization != "constant" or self.args.loss_constant is None:
            return super()._compute_loss(model, inputs, **kwargs)
        # TRL's dr_grpo divides by (rows x max_completion_length); Dr. GRPO's constant may be set apart from it.
        with _swapped(self, "max_completion_length", self.args.loss_constant):
            return super()._compute_loss(model, inputs, **kwargs)

    # -- generation engines -------------------------------------------------------------------------------------

    def _generate_single_turn(self, *args, **kwargs):
        # TRL's vLLM weight sync fails when vLLM runs on a CPU; route it through vLLM's reload path (vllm_cpu).
        if self.use_vllm:
            from trl_rlvr._compat.vllm_cpu import adapt_weight_sync

            adapt_weight_sync(self.vllm_generation)
        return super()._generate_single_turn(*args, **kwargs)


class _SkipEmptyUpdates(TrainerCallback):
    """An optimizer step whose micro-batches all came from empty dynamic-sampling batches is skipped.

    Running it at learning rate 0 would not leave the optimizer alone: AdamW still decays its moments
    (``exp_avg``, ``exp_avg_sq``) and counts the step. So for that step ``optimizer.step`` and the scheduler's
    ``step`` are no-ops, the way transformers' ``Trainer`` treats a step that mixed precision skipped (no
    update, learning-rate schedule not advanced); ``global_step`` still counts it. The decision comes from the
    gathered rewards, so every process skips the same steps. Under DeepSpeed the engine steps its optimizer inside
    ``backward``, which this does not reach (its zero gradient then moves the moments as before).
    """

    def __init__(self, trainer: RLVRTrainer):
        self.trainer, self.restore = trainer, []
        self.step_has_signal = False  # set by the trainer's _prepare_inputs for a micro-batch that can carry one

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        has_signal, self.step_has_signal = self.step_has_signal, False
        if not has_signal:
            self.restore = [_shadow(self.trainer.optimizer, "step"), _shadow(self.trainer.lr_scheduler, "step")]

    def on_step_end(self, args, state, control, **kwargs):  # after Trainer's scheduler step
        for restore in self.restore:
            restore()
        self.restore = []


def _shadow(obj, name: str):
    """Replace the method ``obj.name`` by a no-op on this instance; returns the function that undoes it (an
    instance attribute already there, such as torch's step-counting wrapper, is put back)."""
    had, old = name in vars(obj), vars(obj).get(name)
    setattr(obj, name, lambda *args, **kwargs: None)

    def restore():
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)

    return restore


def _loss_mask(batch: dict) -> torch.Tensor:
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask


@contextlib.contextmanager
def _swapped(obj, name: str, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def _table_held_back(trainer):
    """Within the block, TRL's completions-table entries go to a fresh table (yielded), not to ``trainer._logs``."""
    logs = trainer._logs
    table = {"images": [], "prompt": [], "completion": [], "rewards": defaultdict(list), "advantages": [],
             "extra": defaultdict(list)}
    trainer._logs = table
    try:
        yield table
    finally:
        trainer._logs = logs


def _first_rows(kept: list[torch.Tensor], count: int) -> list[torch.Tensor]:
    """The first ``count`` of the kept row indices, round after round."""
    out = []
    for rows in kept:
        out.append(rows[:count])
        count -= len(out[-1])
    return out
