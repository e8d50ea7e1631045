"""What one round of generation carries from TRL's generation to the loss and the logs, as immutable records.

A *round* is one call of TRL's ``_generate_and_score_completions``: generate for a batch of prompts, score, compute
advantages. A *generation batch* is what :class:`~trl_rlvr.RLVRTrainer` hands to TRL's training loop: one round, or
(dynamic sampling) the kept rows of several rounds. Shapes: ``N`` rows of the round over all processes, ``B`` this
process's rows, ``F`` reward functions, ``G`` answers per prompt, ``K`` rows trained on over all processes.
"Global" tensors are identical on every process, rows in global order (process r's rows at ``[r*B, (r+1)*B)``), the
order TRL gathers rewards in. (The layout of torchtune's ``GRPOTrajectory``: one record, each field's shape beside it.)

TRL's hooks cannot be given arguments, so what they see of a round is noted, while TRL runs, in a
:class:`RoundNotes` (the one mutable piece); the round then ends as a frozen :class:`RoundRecord`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def gathered_lengths(accelerator, completion_ids_list: list, model_lengths: list, stop_ids: set
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) tokens the model wrote (``model_lengths``: tool results not counted, as TRL's
    ``completions/mean_length``) and (N,) truncation flags (no stop token at the end), gathered over processes."""
    local = torch.tensor(
        [[n, float(bool(ids) and ids[-1] not in stop_ids)]
         for ids, n in zip(completion_ids_list, model_lengths, strict=True)],
        dtype=torch.float32,
        device=accelerator.device,
    )
    lengths, truncated = accelerator.gather(local).unbind(dim=1)
    return lengths, truncated.bool()


@dataclass
class RoundNotes:
    """What TRL's hooks note of the round in progress (``_generate``, then ``_calculate_rewards``)."""

    prompt_indices: list[int] | None = None
    tool_mask: list[list[int]] | None = None
    rewards_per_func: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    truncated: torch.Tensor | None = None
    reward_metrics: tuple[str, ...] = ()
    notes: dict = field(default_factory=dict)

    def finish(self, trl_advantages: torch.Tensor, table: dict) -> RoundRecord:
        return RoundRecord(self.prompt_indices, self.tool_mask, self.rewards_per_func, self.rewards, self.lengths,
                           self.truncated, trl_advantages, table, self.reward_metrics, dict(self.notes))


@dataclass(frozen=True)
class RoundRecord:
    """One scored round."""

    prompt_indices: list[int] | None = None  # (N / G,) dataset row of each group (prompt stream); None: TRL's sampler
    tool_mask: list[list[int]] | None = None  # B lists, per completion token 1 = the model's, 0 = a tool's; or None
    rewards_per_func: torch.Tensor | None = None  # (N, F) global, float; NaN where a function did not score the answer
    rewards: torch.Tensor | None = None  # (N,) global: weighted sum over functions; NaN for an unscorable row
    lengths: torch.Tensor | None = None  # (N,) global, float: tokens the model wrote (tool results not counted)
    truncated: torch.Tensor | None = None  # (N,) global, bool: the answer ends without a stop token
    trl_advantages: torch.Tensor | None = None  # (N,) global: the advantages TRL computed for the round
    table: dict | None = None  # the completions-table entries TRL wrote for the round, N per column, held back
    reward_metrics: tuple[str, ...] = ()  # the names the reward functions logged through TRL's log_metric
    notes: dict = field(default_factory=dict)  # (N,) per-row values the row rules noted at score time ("void", ...)


@dataclass(frozen=True)
class GenerationRecord:
    """One generation batch: the rows it trains on, as positions in its rounds, and what was logged for it."""

    rounds: tuple[RoundRecord, ...]  # the rounds whose rows are trained on (dynamic sampling: those with a kept row)
    trained: tuple[torch.Tensor, ...]  # per round, (K_t,) long: global row indices trained on; sum of K_t = K
    advantages: torch.Tensor | None  # (K,) global: the advantages the loss uses, in the order of ``trained``
    has_signal: bool = True  # False: no informative group at all (the optimizer steps it alone feeds are skipped)

    @classmethod
    def whole(cls, record: RoundRecord, advantages: torch.Tensor) -> GenerationRecord:
        """A round trained on whole (no row left out), with the (N,) advantages the loss uses."""
        return cls((record,), (torch.arange(len(record.rewards)),), advantages)

    @classmethod
    def empty(cls) -> GenerationRecord:
        """No row to train on (dynamic sampling found no informative group)."""
        return cls((), (), None, has_signal=False)

    def column(self, name: str) -> torch.Tensor:
        """(K, ...) global: a tensor field of the rounds (``rewards_per_func``, ``lengths``, ...) at the trained rows."""
        return torch.cat([getattr(r, name)[rows.to(getattr(r, name).device)]
                          for r, rows in zip(self.rounds, self.trained, strict=True)])

    def table_entries(self, key: str, column: str | None = None) -> list:
        """The completions-table entries of the trained rows, in order: ``key`` ``"prompt"``, ``"completion"``,
        ``"images"``, or ``"rewards"``/``"extra"`` with a ``column``."""
        entries = []
        for record, rows in zip(self.rounds, self.trained, strict=True):
            values = record.table[key] if column is None else record.table[key].get(column)
            if values:
                entries.extend(values[i] for i in rows.tolist())
        return entries

    def write_table(self, logs: dict, reward_func_names: list[str]) -> None:
        """Append the trained rows' completions-table entries to TRL's table ``logs``, each with the advantage the
        loss uses."""
        for key in ("prompt", "completion", "images"):
            logs[key].extend(self.table_entries(key))
        for name in reward_func_names:
            logs["rewards"][name].extend(self.table_entries("rewards", name))
        for column in sorted({column for record in self.rounds for column in record.table["extra"]}):
            logs["extra"][column].extend(self.table_entries("extra", column))
        if self.advantages is not None:
            logs["advantages"].extend(self.advantages.tolist())
