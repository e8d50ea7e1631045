"""The round driver: every training round, and which of its generated rows a generation batch trains on.

Given a ``score_round(rows, prompt_indices, drops_rows) -> (batch, RoundRecord)`` callable (one round of TRL's
generation and scoring: this process's rows as TRL's batch dict, and the round's global record) and the trainer's
``compute_advantages(rewards, num_generations)`` hook, :class:`RoundDriver` runs every round the trainer trains on:

- a whole round (:meth:`RoundDriver.one_round`): the dataloader's prompts, or with selective sampling (GRESO, Zheng
  et al., 2025) the prompt stream's, predicted zero-signal prompts skipped (:mod:`.selective`);
- DAPO dynamic sampling (Yu et al., 2025), :meth:`RoundDriver.informative_batch`: rounds until the batch is full of
  groups with signal, the kept rows handed to the processes that train them (:mod:`.redistribute`).

Each round goes through one pipeline: the row rules' score step has run inside ``score_round`` (the trainer's
``transform_rewards``); here their keep step decides which rows of each sampled group are kept, which are trained
with advantage 0 and which leave the loss (:mod:`.row_rules`; resample-on-correct keeps G of each k x G); dynamic
sampling then keeps the groups with signal; the advantages are computed **once**, over the rows kept (so under
``scale_rewards="batch"`` the std is that of the groups trained on, as verl); the loss's token count is written
**once**, from the record (the model-written tokens of the rows trained on, less truncated answers under
``mask_truncated_completions`` and rows out of the loss). Every decision is taken from gathered tensors, so every
process runs the same rounds (lockstep). The batch comes with an immutable
:class:`~trl_rlvr.sampling.rounds.GenerationRecord` of the rows trained on.

A row's total reward is the round record's (``rewards``: the weighted sum of rewards already marked by
:func:`~trl_rlvr.algorithms.unscorable.mark_unscorable`): an unscorable row's is NaN, out of every baseline.

What is logged (the metrics sink, ``metrics["train"]``): while dynamic sampling's rounds run, what the rounds log goes
to a held-back sink. Then TRL's per-row metrics (:data:`~.metrics.TRAINED_ROW_METRICS`: reward, lengths) are logged
once, computed on the rows trained on (:func:`.metrics.trained_metrics`); the metrics that describe the generation
(ours, ``rlvr/``; TRL's :data:`~trl_rlvr._compat.trl_contract.TRL_GENERATION_METRICS`; a reward function's
``log_metric`` counters) pass through as logged; any other (a metric a newer TRL added, which this layer cannot
recompute on the trained rows) is logged as ``generated/<name>``, saying what it describes, with a warning once.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from trl_rlvr.algorithms.advantages import zero_signal_groups
from trl_rlvr.algorithms.metrics import rollout_metrics
from trl_rlvr.sampling.dynamic import (
    ROW_KEYS,
    PromptStream,
    filler_rows,
    informative_rows,
    prompts_for_round,
    rows_per_process,
)
from trl_rlvr.sampling.redistribute import destinations, exchange_rows, pad_pieces
from trl_rlvr.sampling.rounds import GenerationRecord, RoundRecord
from trl_rlvr.sampling.row_rules import RowDecision, RowRule
from trl_rlvr.sampling.selective import PromptHistory, record_groups
from trl_rlvr.sampling.trained_metrics import merge_generation_metrics, trained_metrics, trained_row_metric_names

logger = logging.getLogger(__name__)

ScoreRound = Callable[[list, "list[int] | None", bool], "tuple[dict, RoundRecord]"]
ComputeAdvantages = Callable[[torch.Tensor, int], torch.Tensor]


def filter_rewards(record: RoundRecord, metric: str, success_index: int | None) -> torch.Tensor:
    """(N,) what a group must vary in to have signal (``dynamic_sampling_metric``): the total reward, or the success
    reward alone."""
    return record.rewards_per_func[:, success_index] if metric == "success" else record.rewards


@dataclass(frozen=True)
class _KeptRound:
    """A round with a kept row: its record, its (N,) kept rows and its keep-time decision."""

    record: RoundRecord
    keep: torch.Tensor
    decision: RowDecision


class RoundDriver:
    """Every training round of one trainer (see the module docstring).

    ``args``: the trainer's :class:`~trl_rlvr.RLVRConfig`; ``dataset``: the map-style train dataset the prompt stream
    draws from (only with a switch that chooses prompts); ``metrics``: the trainer's ``{"train": defaultdict(list),
    ...}``; ``group_sizes``: ``(num_generations, num_generations_eval)``; ``reward_weights`` (F,),
    ``reward_func_names`` (F names) and ``scale_rewards``: TRL's, for the trained rows' metrics; ``rules``: the row
    rules (:func:`~.row_rules.row_rules_of`); ``trl_advantages``: whether the advantages TRL computed are the ones
    to train on (a ``GRPOConfig``'s settings), as long as no rows are regrouped.
    """

    @staticmethod
    def uses_stream(args) -> bool:
        """Whether the rounds draw their prompts from the trainer's prompt stream (a switch that chooses prompts)."""
        return bool(args.dynamic_sampling or args.selective_sampling or args.resample_on_correct)

    def __init__(self, args, dataset, *, group_sizes: tuple[int, int], score_round: ScoreRound,
                 compute_advantages: ComputeAdvantages, accelerator, metrics: dict, success_index: int | None,
                 reward_weights: torch.Tensor, reward_func_names: list[str], scale_rewards: str,
                 mask_truncated_completions: bool, pad_token_id: int, shuffle: bool = True,
                 rules: Sequence[RowRule] = (), trl_advantages: bool = False):
        self.args, self.dataset, self.score_round, self.compute_advantages = args, dataset, score_round, compute_advantages
        self.group_size, self.eval_group_size = group_sizes
        self.accelerator, self.metrics, self.success_index = accelerator, metrics, success_index
        self.reward_weights, self.reward_func_names, self.scale_rewards = reward_weights, reward_func_names, scale_rewards
        self.mask_truncated_completions, self.pad_token_id = mask_truncated_completions, pad_token_id
        self.rules, self.trl_advantages = tuple(rules), trl_advantages
        # a rule that oversamples (resample-on-correct) samples k x G answers per prompt (the sampled group)
        self.sampled_group = self.group_size * max([r.sampled_group_factor for r in self.rules], default=1)
        self.stream = self._prompt_stream(args, dataset, shuffle) if self.uses_stream(args) else None

    def _prompt_stream(self, args, dataset, shuffle: bool) -> PromptStream:
        from torch.utils.data import IterableDataset

        if dataset is None or isinstance(dataset, IterableDataset):
            raise ValueError(
                "dynamic_sampling / selective_sampling / resample_on_correct need a map-style (indexable) "
                "train_dataset to draw prompts from"
            )
        history = None
        if args.selective_sampling:
            history = PromptHistory(args.selective_sampling_window, args.revisit_probability, args.seed)
        return PromptStream(len(dataset), prompts_per_round=args.generation_batch_size // self.group_size,
                            group_size=self.sampled_group, seed=args.seed, shuffle=shuffle, history=history)

    @property
    def drops_rows(self) -> bool:
        """Whether a training round's rows may be left out of the batch (dynamic sampling, an oversampling rule)."""
        return bool(self.args.dynamic_sampling or self.sampled_group > self.group_size)

    # -- the entry points ----------------------------------------------------------------------------------------

    def generation_batch(self, inputs: list) -> tuple[dict, GenerationRecord]:
        """Training: the generation batch TRL's loop asks for (``inputs``: the dataloader's rows, which only set its
        size when the prompts come from the stream)."""
        if self.drops_rows:
            return self.informative_batch(len(inputs))
        if self.args.selective_sampling:
            return self.one_round(*self.next_prompts())
        return self.one_round(inputs, None)

    def one_round(self, inputs: list, prompt_indices: list[int] | None, training: bool = True
                  ) -> tuple[dict, GenerationRecord]:
        """One round trained on whole (every row in the batch; the rules may zero or mask rows)."""
        output, record = self.score_round(inputs, prompt_indices, False)
        group_size = self.group_size if training else self.eval_group_size
        self.log_round(record, "train" if training else "eval", group_size)
        if training and self.stream is not None and self.stream.history is not None:
            revisits = self.record_history(record)
            rows = informative_rows(self.filter_rewards(record), self.group_size, self.args.dynamic_sampling_tolerance)
            self.log_selection(len(rows), int(rows.sum()), revisits)
        decision = self.decide(record) if training else RowDecision()
        every = torch.arange(len(record.rewards))
        advantages = self.advantages([record], [every], group_size, regroup=False)
        advantages = advantages.masked_fill(decision.advantage_mask(len(every)).to(advantages.device), 0.0)
        _take_out_of_loss(output, decision, self.accelerator.process_index)
        rows = len(output["advantages"])
        start = self.accelerator.process_index * rows
        output["advantages"] = advantages[start : start + rows].to(output["advantages"])
        generation = GenerationRecord.whole(record, advantages)
        if training:
            output["num_items_in_batch"] = self.loss_tokens(generation, [decision])
        return output, generation

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

    def decide(self, record: RoundRecord) -> RowDecision:
        """The round's keep-time decision: every row rule's, merged."""
        return RowDecision.merge([rule.keep(record) for rule in self.rules])

    def kept_rows(self, record: RoundRecord, decision: RowDecision) -> torch.Tensor:
        """(N,) bool: the rows the rules keep of each sampled group, of the groups with signal (with dynamic
        sampling; else every group)."""
        sampled = decision.sampled if decision.sampled is not None else torch.ones(len(record.rewards), dtype=torch.bool)
        selected = sampled.nonzero().flatten()
        keep = torch.zeros(len(record.rewards), dtype=torch.bool)
        if self.args.dynamic_sampling:
            rewards = self.filter_rewards(record)[selected]
            keep[selected] = informative_rows(rewards, self.group_size, self.args.dynamic_sampling_tolerance).cpu()
        else:
            keep[selected] = True
        return keep

    def advantages(self, records: list[RoundRecord], rows: list[torch.Tensor], group_size: int, regroup: bool
                   ) -> torch.Tensor:
        """(K,) the advantages of the given rows of the records (groups of ``group_size``), computed once: TRL's own
        where they are the ones to train on and no group changed, else the trainer's ``compute_advantages``."""
        if self.trl_advantages and not regroup:
            return torch.cat([r.trl_advantages[i.to(r.trl_advantages.device)] for r, i in zip(records, rows, strict=True)])
        rewards = torch.cat([r.rewards[i.to(r.rewards.device)] for r, i in zip(records, rows, strict=True)])
        return self.compute_advantages(rewards, group_size)

    def loss_tokens(self, generation: GenerationRecord, decisions: list[RowDecision]) -> torch.Tensor:
        """The loss's token count of every process's trained rows, from the record: the tokens the model wrote,
        less truncated answers (``mask_truncated_completions``: TRL zeroes their completion mask) and rows out of
        the loss."""
        tokens = generation.column("lengths")
        if self.mask_truncated_completions:
            tokens = tokens * ~generation.column("truncated")
        outs = [d.out_of_loss if d.out_of_loss is not None else torch.zeros(len(r.rewards), dtype=torch.bool)
                for d, r in zip(decisions, generation.rounds, strict=True)]
        out = torch.cat([o.cpu()[rows.cpu()] for o, rows in zip(outs, generation.trained, strict=True)])
        tokens = tokens * ~out.to(tokens.device)
        return torch.tensor(int(tokens.sum().item()), device=self.accelerator.device)

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

    # -- what is logged ------------------------------------------------------------------------------------------

    def log_round(self, record: RoundRecord, mode: str, group_size: int) -> None:
        """The rlvr/ diagnostics of a round's generation (every row generated, before any row is left out)."""
        if self.success_index is None:
            return
        metrics = rollout_metrics(
            record.rewards, record.rewards_per_func[:, self.success_index], record.lengths, record.truncated,
            group_size, success_threshold=self.args.success_threshold,
            tolerance=self.args.dynamic_sampling_tolerance,
        )
        for key, value in metrics.items():
            self.metrics[mode][key].append(value)

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

    def _log_batch(self, held: dict, rounds: int, groups_seen: int, kept: int, trained: int, rows: int,
                   revisits: tuple[int, int], reward_metrics: set[str]) -> None:
        """What a dynamic-sampling batch logs: the rounds' held-back metrics merged, its own counts."""
        num_processes = self.accelerator.num_processes
        metrics = self.metrics["train"]
        merge_generation_metrics(held, metrics, set(trained_row_metric_names(self.reward_func_names)), reward_metrics)
        metrics["rlvr/sampling_rounds"].append(rounds)
        metrics["rlvr/prompts_sampled"].append(groups_seen)
        metrics["rlvr/kept_groups_frac"].append(kept / self.group_size / groups_seen)
        self.log_selection(groups_seen * self.sampled_group, trained, revisits)
        if self.args.dynamic_sampling_partial_batch == "pad":
            metrics["rlvr/filler_rows"].append(rows * num_processes - trained)

    def _log_trained_metrics(self, generation: GenerationRecord) -> None:
        metrics = trained_metrics(
            generation.column("rewards_per_func"), self.reward_weights, self.reward_func_names,
            generation.column("lengths"), generation.column("truncated"), self.group_size, self.scale_rewards,
        )
        for name, value in metrics.items():
            self.metrics["train"][name].append(value)

    # -- dynamic sampling ----------------------------------------------------------------------------------------

    def informative_batch(self, target: int) -> tuple[dict, GenerationRecord]:
        """Rounds of generation until ``target`` rows per process of groups with signal are kept (or
        ``max_sampling_rounds``); -> this process's rows and the record of every process's trained rows.

        Every rank keeps its own rows of the kept groups; they are then handed to the ranks that train them, in the
        order an all-gather would give, so groups may span processes and each rank holds and moves O(its own rows).
        An empty record (``has_signal`` False) comes with a batch that carries no gradient."""
        num_processes = self.accelerator.num_processes
        with _held_back(self.metrics, "train") as held:
            rounds = self._sample_rounds(target)
        kept = sum(int(k.keep.sum()) for k in rounds.kept)
        rows = rows_per_process(kept, num_processes, self.args.steps_per_generation, target,
                                self.args.dynamic_sampling_partial_batch)
        trained = min(kept, rows * num_processes)  # informative rows trained on; the other slots are fillers
        self._log_batch(held, rounds.count, rounds.groups_seen, kept, trained, rows, rounds.revisits,
                        rounds.reward_metrics)
        if rows < target:
            logger.warning(
                "dynamic sampling: %d rounds found %d informative groups of the %d wanted; training on %d of their "
                "rows (%d rows per process, %d fillers in all)", rounds.count, kept // self.group_size,
                target * num_processes // self.group_size, trained, rows, rows * num_processes - trained,
            )
        if rows == 0:
            logger.warning("dynamic sampling: no informative group in this batch; skipping the update")
            return self._empty_batch(rounds.last_output), GenerationRecord.empty()
        return self._trained_batch(rounds, rows, trained)

    def _sample_rounds(self, target: int) -> _Rounds:
        """Generate rounds until the kept rows fill ``target`` rows per process (or the round budget)."""
        num_processes, group_size = self.accelerator.num_processes, self.group_size
        max_rounds = self.args.max_sampling_rounds or self.stream.rounds_per_pass  # 0: one full pass at most
        if not self.args.dynamic_sampling:  # resample-on-correct alone: one round, every group kept
            max_rounds = 1
        rounds, kept = _Rounds(), 0
        while True:
            missing_groups = -(-(target * num_processes - kept) // group_size)
            prompts = prompts_for_round(missing_groups, self.stream.prompts_per_round,
                                        self.args.dynamic_sampling_oversample, self.sampled_group, num_processes)
            output, record = self.score_round(*self.next_prompts(prompts), True)
            self.log_round(record, "train", group_size)
            rounds.count += 1
            rounds.last_output = output
            rounds.revisits = tuple(a + b for a, b in zip(rounds.revisits, self.record_history(record), strict=True))
            rounds.reward_metrics.update(record.reward_metrics)
            decision = self.decide(record)
            keep = self.kept_rows(record, decision)
            rounds.groups_seen += len(keep) // self.sampled_group
            if keep.any():
                _take_out_of_loss(output, decision, self.accelerator.process_index)
                piece, widths = self._own_kept_rows(output, keep)
                if rounds.filler is None:  # a row of this process's own, of a round whose widths the batch spans
                    rounds.filler = {key: output[key][:1] for key in piece}
                rounds.kept.append(_KeptRound(record, keep, decision))
                rounds.pieces.append(piece)
                rounds.widths.append(widths)
                kept += int(keep.sum())
            if kept >= target * num_processes or rounds.count >= max_rounds:
                return rounds

    def _trained_batch(self, rounds: _Rounds, rows: int, trained: int) -> tuple[dict, GenerationRecord]:
        """This process's ``rows`` rows of the kept rows (the first ``trained`` of them, then fillers), with the
        advantages computed once over every kept row and the loss's token count of the trained ones."""
        num_processes = self.accelerator.num_processes
        batch = self._hand_over(rounds.pieces, [k.keep for k in rounds.kept], rounds.widths, rows, trained,
                                rounds.filler)
        records = [k.record for k in rounds.kept]
        kept_indices = [k.keep.nonzero().flatten() for k in rounds.kept]
        # regrouped: the batch std of the groups trained on (as verl); the groups of G resample-on-correct kept
        regroup = self.scale_rewards == "batch" or self.sampled_group > self.group_size
        advantages = self.advantages(records, kept_indices, self.group_size, regroup)
        zeroed = torch.cat([k.decision.advantage_mask(len(k.keep))[i] for k, i in zip(rounds.kept, kept_indices,
                                                                                       strict=True)])
        advantages = advantages.masked_fill(zeroed.to(advantages.device), 0.0)
        slots = advantages.new_zeros(rows * num_processes)  # fillers' stay 0
        slots[:trained] = advantages[:trained]
        start = self.accelerator.process_index * rows
        batch["advantages"] = slots[start : start + rows].to(batch["advantages"])
        generation = GenerationRecord(tuple(records), tuple(_first_rows(kept_indices, trained)), advantages[:trained])
        batch["num_items_in_batch"] = self.loss_tokens(generation, [k.decision for k in rounds.kept])
        self._log_trained_metrics(generation)
        return batch, generation

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
    """Within the block, what is logged to ``metrics[mode]`` is held back: taken out of it when the block ends and
    yielded (the names logged, in the order first logged, each with the values logged within the block)."""
    sink, held = metrics[mode], defaultdict(list)
    before = {name: len(values) for name, values in sink.items()}
    try:
        yield held
    finally:
        for name in list(sink):
            if name not in before:
                held[name] = sink.pop(name)
            elif len(sink[name]) > before[name]:
                held[name] = sink[name][before[name]:]
                del sink[name][before[name]:]


@dataclass
class _Rounds:
    """What dynamic sampling's rounds gathered for one generation batch."""

    count: int = 0
    groups_seen: int = 0
    revisits: tuple[int, int] = (0, 0)
    reward_metrics: set = field(default_factory=set)
    kept: list = field(default_factory=list)  # _KeptRound, one per round with a kept row
    pieces: list = field(default_factory=list)  # this process's kept rows of each such round
    widths: list = field(default_factory=list)  # each such round's widest width per 2-D key
    filler: dict | None = None
    last_output: dict | None = None


def _take_out_of_loss(output: dict, decision: RowDecision, process_index: int) -> None:
    """This process's rows of ``output`` (TRL's batch) that the decision takes out of the loss: completion mask 0
    (their advantage is zeroed with the round's)."""
    if decision.out_of_loss is None:
        return
    rows = len(output["advantages"])
    mine = decision.out_of_loss[process_index * rows : (process_index + 1) * rows].to(output["completion_mask"].device)
    output["completion_mask"] = output["completion_mask"] * ~mine[:, None]


def _first_rows(kept: list[torch.Tensor], count: int) -> list[torch.Tensor]:
    """The first ``count`` of the kept row indices, round after round."""
    out = []
    for rows in kept:
        out.append(rows[:count])
        count -= len(out[-1])
    return out
