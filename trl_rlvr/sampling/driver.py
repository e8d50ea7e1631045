"""The round driver: which generated rows a generation batch trains on, round after round.

Given a ``score_round(rows, prompt_indices) -> (batch, RoundRecord)`` callable (one round of TRL's generation and
scoring: this process's rows as TRL's batch dict, and the round's global record), the accelerator and the trainer's
metrics, :class:`RoundDriver` runs

- DAPO dynamic sampling (Yu et al., 2025), :meth:`RoundDriver.informative_batch`: rounds until the batch is full of
  groups with signal, the kept rows handed to the processes that train them (:mod:`.redistribute`), the advantages
  re-scaled over the kept groups under ``scale_rewards="batch"`` (as verl), the exact loss-token count of the rows
  trained on;
- selective sampling (GRESO, Zheng et al., 2025), :meth:`RoundDriver.selected_round`: one round from the prompt
  stream, predicted zero-signal prompts skipped (:mod:`.selective`);
- resample-on-correct (rStar2-Agent's GRPO-RoC, Shang et al., 2025; ``resample_on_correct``), in
  :meth:`RoundDriver.kept_rows`: each prompt of a round is sampled ``k x G`` times (``k`` =
  ``resample_on_correct_oversample``) and ``G`` of them are kept
  (:func:`~trl_rlvr.algorithms.multi_turn.resample_on_correct`: the right answers with the fewest tool errors, a
  uniform draw of the wrong ones) before dynamic sampling judges the kept groups; the advantages are then those of
  the kept groups of ``G``; the tool errors are those each rollout shows
  (:func:`~trl_rlvr.algorithms.metrics.shown_tool_errors`). Without dynamic sampling, one round of ``k x`` the
  generation batch's rollouts is drawn and every group is kept. The draws come from one ``torch.Generator``
  seeded with ``seed``, drawn in lockstep on every process (a resumed run draws afresh);

and returns, with the batch, an immutable :class:`~trl_rlvr.sampling.rounds.GenerationRecord` of the rows trained on.
Every decision is taken from gathered tensors, so every process runs the same rounds (lockstep).

A row's total reward is the round record's (``rewards``, the trainer's
:func:`~trl_rlvr.algorithms.unscorable.total_rewards` of rewards already marked by
:func:`~trl_rlvr.algorithms.unscorable.mark_unscorable`): an unscorable row's is NaN here too, in the advantages
recomputed over kept groups and in the trained rows' figures; no switch changes it here (resample-on-correct and
dynamic sampling only choose rows).

What is logged (the metrics sink, ``metrics["train"]``): while dynamic sampling's rounds run, what the rounds log goes
to a held-back sink. Then TRL's per-row figures (:data:`~trl_rlvr._compat.trl_contract.TRL_ROW_FIGURES`: reward,
lengths) are logged once, computed on the rows trained on (:func:`.figures.trained_figures`); the figures that
describe the generation (ours, ``rlvr/``; TRL's :data:`~trl_rlvr._compat.trl_contract.TRL_GENERATION_FIGURES`; a
reward function's ``log_metric`` counters) pass through as logged; any other (a figure a newer TRL added, which this
layer cannot recompute on the trained rows) is logged as ``generated/<name>``, saying what it describes, with a
warning once.

Seams: ``row_filters`` (each ``RoundRecord -> (N,) bool``, from global tensors so every process agrees) drop rows of
a round before the hand-over, after the informative-group filter: the place for per-rollout filters (a rollout
whose tool turns produced nothing, a rollout over a tool-call cap). The advantages a round gives its rows are the
record's (``score_round`` computes them); ``informative_batch`` only re-scales them under batch scaling.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence

import torch

from trl_rlvr._compat.trl_contract import TRL_ASSIGNED_FIGURES, TRL_GENERATION_FIGURES, trl_row_figure_names
from trl_rlvr.algorithms.advantages import group_advantages, zero_signal_groups
from trl_rlvr.algorithms.multi_turn import VOID_TURN_ADVANTAGE_ACTIONS, resample_on_correct
from trl_rlvr.sampling.dynamic import (
    ROW_KEYS,
    PromptStream,
    filler_rows,
    informative_rows,
    prompts_for_round,
    rows_per_process,
)
from trl_rlvr.sampling.figures import trained_figures
from trl_rlvr.sampling.redistribute import destinations, exchange_rows, pad_pieces
from trl_rlvr.sampling.rounds import GenerationRecord, RoundRecord
from trl_rlvr.sampling.selective import PromptHistory, record_groups

logger = logging.getLogger(__name__)

ScoreRound = Callable[[list, "list[int] | None"], "tuple[dict, RoundRecord]"]
RowFilter = Callable[[RoundRecord], torch.Tensor]
_warned_generated: set[str] = set()


def filter_rewards(record: RoundRecord, metric: str, success_index: int | None) -> torch.Tensor:
    """(N,) what a group must vary in to have signal (``dynamic_sampling_metric``): the total reward, or the success
    reward alone."""
    return record.rewards_per_func[:, success_index] if metric == "success" else record.rewards


class RoundDriver:
    """Dynamic and selective sampling over one prompt stream (see the module docstring).

    ``args``: the trainer's :class:`~trl_rlvr.RLVRConfig`; ``dataset``: the map-style train dataset the stream draws
    from; ``metrics``: the trainer's ``{"train": defaultdict(list), ...}``; ``reward_weights`` (F,),
    ``reward_func_names`` (F names) and ``scale_rewards``: TRL's, for the trained rows' figures.
    """

    @staticmethod
    def needed(args) -> bool:
        """Whether the trainer's rounds go through a driver (a switch that picks the rows or prompts trained on)."""
        return bool(args.dynamic_sampling or args.selective_sampling or args.resample_on_correct)

    def __init__(self, args, dataset, *, group_size: int, score_round: ScoreRound, accelerator, metrics: dict,
                 success_index: int | None, reward_weights: torch.Tensor, reward_func_names: list[str],
                 scale_rewards: str, mask_truncated_completions: bool, pad_token_id: int, shuffle: bool = True,
                 row_filters: Sequence[RowFilter] = ()):
        from torch.utils.data import IterableDataset

        if dataset is None or isinstance(dataset, IterableDataset):
            raise ValueError(
                "dynamic_sampling / selective_sampling need a map-style (indexable) train_dataset to draw prompts from"
            )
        history = None
        if args.selective_sampling:
            history = PromptHistory(args.selective_sampling_window, args.revisit_probability, args.seed)
        # resample-on-correct samples k x G answers per prompt (the sampled group) and trains on G of them
        self.resample = args.resample_on_correct_oversample if args.resample_on_correct else None
        if self.resample and success_index is None:
            raise ValueError("resample_on_correct needs a reward that says which answers are right (success_reward)")
        self.sampled_group = group_size * (self.resample or 1)
        self.stream = PromptStream(len(dataset), prompts_per_round=args.generation_batch_size // group_size,
                                   group_size=self.sampled_group, seed=args.seed, shuffle=shuffle, history=history)
        self.generator = torch.Generator().manual_seed(args.seed)  # resample-on-correct's draws, in lockstep
        self.args, self.dataset, self.group_size, self.score_round = args, dataset, group_size, score_round
        self.accelerator, self.metrics, self.success_index = accelerator, metrics, success_index
        self.reward_weights, self.reward_func_names, self.scale_rewards = reward_weights, reward_func_names, scale_rewards
        self.mask_truncated_completions, self.pad_token_id = mask_truncated_completions, pad_token_id
        self.row_filters = tuple(row_filters)

    # -- prompts and decisions -----------------------------------------------------------------------------------

    def next_prompts(self, prompts: int | None = None) -> tuple[list[dict], list[int]]:
        """This process's share of the next round of prompts from the stream (``prompts`` of them in all; default
        a full generation batch), and the dataset row of each group of the round (all processes)."""
        indices = self.stream.next_indices(prompts)
        per_process = len(indices) // self.accelerator.num_processes
        start = self.accelerator.process_index * per_process
        return [self.dataset[i] for i in indices[start : start + per_process]], indices[:: self.sampled_group]

    def filter_rewards(self, record: RoundRecord) -> torch.Tensor:
        return filter_rewards(record, self.args.dynamic_sampling_metric, self.success_index)

    def kept_rows(self, record: RoundRecord) -> torch.Tensor:
        """(N,) bool: rows of the round's groups with signal (with dynamic sampling; else every group), less what
        the row filters drop; with resample-on-correct, of the G rows kept of each sampled group."""
        selected = self.resampled_rows(record)
        rewards = self.filter_rewards(record)[selected]
        keep = torch.zeros(len(record.rewards), dtype=torch.bool)
        if self.args.dynamic_sampling:
            keep[selected] = informative_rows(rewards, self.group_size, self.args.dynamic_sampling_tolerance).cpu()
        else:
            keep[selected] = True
        for row_filter in self.row_filters:
            keep = keep & row_filter(record).cpu()
        return keep

    def resampled_rows(self, record: RoundRecord) -> torch.Tensor:
        """(N * G / sampled group,) ascending: the rows resample-on-correct keeps of the round (every row when
        off); logs the tool errors of the right answers kept and of those sampled."""
        rows = len(record.rewards)
        if self.resample is None:
            return torch.arange(rows)
        success = record.rewards_per_func[:, self.success_index].float().cpu()
        errors = record.tool_errors.cpu() if record.tool_errors is not None else torch.zeros(rows)
        kept = resample_on_correct(success, errors, self.sampled_group, self.group_size,
                                   self.args.success_threshold, generator=self.generator)
        right = success >= self.args.success_threshold
        if right.any():
            metrics = self.metrics["train"]
            metrics["rlvr/sampled_right_tool_errors"].append(errors[right].mean().item())
            metrics["rlvr/resampled_right_tool_errors"].append(errors[kept][right[kept]].mean().item())
        return kept

    def record_history(self, record: RoundRecord) -> tuple[int, int]:
        """Every group of the round into the prompt history, from the gathered rewards, so that every rank holds the
        same history and takes the same skip decisions; returns (revisited prompts, revisits with no signal)."""
        history = self.stream.history
        if history is None:
            return 0, 0
        size = self.sampled_group  # a prompt's history holds what was sampled for it
        zero = zero_signal_groups(self.filter_rewards(record), size, self.args.dynamic_sampling_tolerance)
        success = record.rewards_per_func[:, self.success_index] >= self.args.success_threshold
        rates = success.float().view(-1, size).mean(dim=1)
        return record_groups(history, record.prompt_indices, rates.tolist(), zero.tolist())

    def log_selection(self, answers: int, informative_rows_trained: int, revisits: tuple[int, int]) -> None:
        metrics = self.metrics["train"]
        if informative_rows_trained:
            metrics["rlvr/answers_per_informative_row"].append(answers / informative_rows_trained)
        if self.stream.history is None:
            return
        metrics["rlvr/prompts_skipped"].append(self.stream.skipped)
        self.stream.skipped = 0
        revisited, held = revisits
        if revisited:
            metrics["rlvr/skipped_would_have_been_zero_signal"].append(held / revisited)

    # -- selective sampling alone --------------------------------------------------------------------------------

    def selected_round(self) -> tuple[dict, GenerationRecord]:
        """One round from the stream (predicted zero-signal prompts skipped), trained on whole."""
        output, record = self.score_round(*self.next_prompts())
        revisits = self.record_history(record)
        rows = informative_rows(self.filter_rewards(record), self.group_size, self.args.dynamic_sampling_tolerance)
        self.log_selection(len(rows), int(rows.sum()), revisits)
        return output, GenerationRecord.whole(record)

    # -- dynamic sampling ----------------------------------------------------------------------------------------

    def informative_batch(self, target: int) -> tuple[dict, GenerationRecord]:
        """Rounds of generation until ``target`` rows per process of groups with signal are kept (or
        ``max_sampling_rounds``); -> this process's rows and the record of every process's trained rows.

        Every rank keeps its own rows of the kept groups; they are then handed to the ranks that train them, in the
        order an all-gather would give, so groups may span processes and each rank holds and moves O(its own rows).
        An empty record (``has_signal`` False) comes with a batch that carries no gradient."""
        group_size, num_processes = self.group_size, self.accelerator.num_processes
        max_rounds = self.args.max_sampling_rounds or self.stream.rounds_per_pass  # 0: one full pass at most
        if not self.args.dynamic_sampling:  # resample-on-correct alone: one round, every group kept
            max_rounds = 1
        kept_rounds, keeps, widths, pieces, revisits, filler = [], [], [], [], (0, 0), None
        kept, groups_seen, rounds, reward_metrics = 0, 0, 0, set()
        with _held_back(self.metrics, "train") as held:
            while True:
                rounds += 1
                missing_groups = -(-(target * num_processes - kept) // group_size)
                prompts = prompts_for_round(missing_groups, self.stream.prompts_per_round,
                                            self.args.dynamic_sampling_oversample, self.sampled_group, num_processes)
                output, record = self.score_round(*self.next_prompts(prompts))
                revisits = tuple(a + b for a, b in zip(revisits, self.record_history(record), strict=True))
                reward_metrics.update(record.reward_metrics)
                keep = self.kept_rows(record)
                groups_seen += len(keep) // self.sampled_group
                if keep.any():
                    piece, round_widths = self._own_kept_rows(output, keep)
                    if filler is None:  # a row of this process's own, of a round whose widths the batch spans
                        filler = {key: output[key][:1] for key in piece}
                    pieces.append(piece)
                    kept_rounds.append(record)
                    keeps.append(keep)
                    widths.append(round_widths)
                    kept += int(keep.sum())
                if kept >= target * num_processes or rounds >= max_rounds:
                    break
        partial_batch = self.args.dynamic_sampling_partial_batch
        rows = rows_per_process(kept, num_processes, self.args.steps_per_generation, target, partial_batch)
        trained = min(kept, rows * num_processes)  # informative rows trained on; the other slots are fillers
        metrics = self.metrics["train"]
        _merge_generation_metrics(held, metrics, set(trl_row_figure_names(self.reward_func_names)), reward_metrics)
        metrics["rlvr/sampling_rounds"].append(rounds)
        metrics["rlvr/prompts_sampled"].append(groups_seen)
        metrics["rlvr/kept_groups_frac"].append(kept / group_size / groups_seen)
        self.log_selection(groups_seen * self.sampled_group, trained, revisits)
        if partial_batch == "pad":
            metrics["rlvr/filler_rows"].append(rows * num_processes - trained)
        if rows < target:
            logger.warning(
                "dynamic sampling: %d rounds found %d informative groups of the %d wanted; training on %d of their "
                "rows (%d rows per process, %d fillers in all)", rounds, kept // group_size,
                target * num_processes // group_size, trained, rows, rows * num_processes - trained,
            )
        if rows == 0:
            logger.warning("dynamic sampling: no informative group in this batch; skipping the update")
            return self._empty_batch(output), GenerationRecord.empty()
        batch = self._hand_over(pieces, keeps, widths, rows, trained, filler)
        kept_indices = [keep.nonzero().flatten() for keep in keeps]
        advantages = torch.cat([r.advantages[i] for r, i in zip(kept_rounds, kept_indices, strict=True)])
        if self.scale_rewards == "batch" or self.resample:  # the batch std of the groups trained on (as verl); the
            # groups of G kept by resample-on-correct (the round's advantages were of its sampled rows)
            kept_rewards = torch.cat([r.rewards[i] for r, i in zip(kept_rounds, kept_indices, strict=True)])
            advantages = group_advantages(kept_rewards, group_size, self.scale_rewards,
                                          baseline=self.args.advantage_baseline, std=self.args.advantage_std)
            if (self.args.void_turn_action in VOID_TURN_ADVANTAGE_ACTIONS  # ("score_as_wrong" acted on the rewards)
                    and all(r.void is not None for r in kept_rounds)):
                void = torch.cat([r.void[i] for r, i in zip(kept_rounds, kept_indices, strict=True)])
                advantages = advantages.masked_fill(void.to(advantages.device), 0.0)  # void turns stay at 0
            slots = advantages.new_zeros(rows * num_processes)  # fillers' stay 0
            slots[:trained] = advantages[:trained]
            start = self.accelerator.process_index * rows
            batch["advantages"] = slots[start : start + rows].to(batch["advantages"])
        generation = GenerationRecord(tuple(kept_rounds), tuple(_first_rows(kept_indices, trained)),
                                      advantages[:trained])
        # the loss tokens of every process's trained rows, from the gathered lengths (no reduction of the rows)
        loss_tokens = generation.column("lengths")
        if self.mask_truncated_completions:  # TRL zeroes a truncated answer's completion mask
            loss_tokens = loss_tokens * ~generation.column("truncated")
        if self.args.void_turn_action == "drop" and all(r.void is not None for r in kept_rounds):
            loss_tokens = loss_tokens * ~generation.column("void")  # dropped from the loss (stabilisers)
        batch["num_items_in_batch"] = torch.tensor(int(loss_tokens.sum().item()), device=self.accelerator.device)
        self._log_trained_figures(generation)
        return batch, generation

    def _log_trained_figures(self, generation: GenerationRecord) -> None:
        figures = trained_figures(
            generation.column("rewards_per_func"), self.reward_weights, self.reward_func_names,
            generation.column("lengths"), generation.column("truncated"), self.group_size, self.scale_rewards,
        )
        for name, value in figures.items():
            self.metrics["train"][name].append(value)

    def _own_kept_rows(self, output: dict, keep: torch.Tensor) -> tuple[dict, dict[str, int]]:
        """This process's rows of the round's kept rows, and the round's widest width of every 2-D row tensor over
        the processes (one small gather), to which the kept rows are later padded."""
        unsupported = [k for k, v in output.items() if k not in ROW_KEYS and k != "num_items_in_batch"]
        if unsupported:
            raise ValueError(f"dynamic_sampling does not support batches with {unsupported} (e.g. multimodal inputs)")
        present = [key for key in ROW_KEYS if output.get(key) is not None]
        wide = [key for key in present if output[key].dim() >= 2]
        local_widths = torch.tensor([output[key].size(1) for key in wide], device=self.accelerator.device)
        widest = self.accelerator.gather(local_widths).view(-1, len(wide)).amax(dim=0).tolist()
        rows = len(output["advantages"])
        start = self.accelerator.process_index * rows
        mine = keep[start : start + rows]
        return {key: output[key][mine.to(output[key].device)] for key in present}, dict(zip(wide, widest, strict=True))

    def _hand_over(self, pieces: list[dict], keeps: list[torch.Tensor], widths: list[dict], rows: int, trained: int,
                   filler: dict) -> dict:
        """Every process's ``rows`` rows to train on: the first ``trained`` kept rows in round order, process r
        taking positions ``[r*rows, (r+1)*rows)``, and filler rows (:func:`~.dynamic.filler_rows`, made of ``filler``,
        a row of this process's) in the positions past ``trained``; only rows that change process are sent (point
        to point)."""
        widest = {key: max(w[key] for w in widths) for key in widths[0]}
        pad = {"prompt_ids": self.pad_token_id, "completion_ids": self.pad_token_id, "tool_mask": 1}
        local = pad_pieces(pieces, widest, pad)
        num_processes, rank = self.accelerator.num_processes, self.accelerator.process_index
        own = min(max(trained - rank * rows, 0), rows)  # this process's slots that hold kept rows (the first ones)
        if num_processes == 1:
            batch = {key: value[:own] for key, value in local.items()}
        else:
            per_round = [keep.view(num_processes, -1).sum(dim=1).tolist() for keep in keeps]
            batch = exchange_rows(local, destinations(per_round, rows, num_processes), rows, rank, num_processes)
            batch = {key: value[:own] for key, value in batch.items()}
        if own == rows:
            return batch
        fillers = filler_rows(pad_pieces([filler], widest, pad), rows - own)
        return {key: torch.cat([batch[key], fillers[key].to(batch[key])]) for key in batch}

    def _empty_batch(self, output: dict) -> dict:
        """No informative group at all: a batch that carries no gradient (the trainer skips the optimizer steps it
        alone feeds)."""
        rows = self.args.steps_per_generation
        batch = {k: v[:rows].clone() for k, v in output.items() if k in ROW_KEYS and v is not None}
        batch["completion_mask"] = torch.zeros_like(batch["completion_mask"])
        batch["advantages"] = torch.zeros_like(batch["advantages"])
        batch["num_items_in_batch"] = torch.zeros((), device=batch["advantages"].device)
        return batch


@contextlib.contextmanager
def _held_back(metrics: dict, mode: str):
    """Within the block, what is logged to ``metrics[mode]`` goes to a fresh sink (yielded)."""
    sink, held = metrics[mode], defaultdict(list)
    metrics[mode] = held
    try:
        yield held
    finally:
        metrics[mode] = sink


def _merge_generation_metrics(held: dict, sink: dict, recomputed: set[str], reward_metrics: set[str]) -> None:
    """What the rounds logged, into ``sink``: TRL's per-row figures dropped (``recomputed`` on the trained rows),
    the generation's figures as logged, any other figure as ``generated/<name>`` (see the module docstring)."""
    for name, values in held.items():
        if name in recomputed:
            continue
        if name in TRL_ASSIGNED_FIGURES:  # TRL sets these (a running total), it does not append
            sink[name] = values
        elif name.startswith("rlvr/") or name in TRL_GENERATION_FIGURES or name in reward_metrics:
            sink[name].extend(values)
        else:
            if name not in _warned_generated:
                _warned_generated.add(name)
                logger.warning(
                    "dynamic sampling: %r, a figure TRL logs of every generated row, is not one trl-rlvr recomputes on "
                    "the rows trained on; logged as 'generated/%s' (declare it in trl_rlvr/_compat/trl_contract.py)",
                    name, name,
                )
            sink[f"generated/{name}"].extend(values)


def _first_rows(kept: list[torch.Tensor], count: int) -> list[torch.Tensor]:
    """The first ``count`` of the kept row indices, round after round."""
    out = []
    for rows in kept:
        out.append(rows[:count])
        count -= len(out[-1])
    return out
