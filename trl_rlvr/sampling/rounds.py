"""What one round of generation carries from TRL's generation to the loss and the logs, as typed records.

A *round* is one call of TRL's ``_generate_and_score_completions``: generate for a batch of prompts, score, compute
advantages. A *generation batch* is what :class:`~trl_rlvr.RLVRTrainer` hands to TRL's training loop: one round, or
(dynamic sampling) the kept rows of several rounds. Shapes: ``N`` rows of the round over all processes, ``B`` this
process's rows, ``F`` reward functions, ``G`` answers per prompt, ``K`` rows trained on over all processes.
"Global" tensors are identical on every process, rows in global order (process r's rows at ``[r*B, (r+1)*B)``), the
order TRL gathers rewards in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RoundRecord:
    """One round, filled as TRL's hooks run (``_generate``, then ``_calculate_rewards``), then by the trainer."""

    prompt_indices: list[int] | None = None  # (N / G,) dataset row of each group (prompt stream); None: TRL's sampler
    tool_mask: list[list[int]] | None = None  # B lists, per completion token 1 = the model's, 0 = a tool's; or None
    rewards_per_func: torch.Tensor | None = None  # (N, F) global, float; NaN where a function did not score the answer
    rewards: torch.Tensor | None = None  # (N,) global: weighted sum over functions; NaN where no function scored
    lengths: torch.Tensor | None = None  # (N,) global, float: tokens the model wrote (tool results not counted)
    truncated: torch.Tensor | None = None  # (N,) global, bool: the answer ends without a stop token
    advantages: torch.Tensor | None = None  # (N,) global: the advantages given to the rows (before batch re-scaling)
    keep: torch.Tensor | None = None  # (N,) global, bool: rows of groups with signal (dynamic / selective sampling)
    widths: dict[str, int] = field(default_factory=dict)  # 2-D row key -> its widest width over the processes
    table: dict | None = None  # the completions-table entries TRL wrote for the round, N per column, held back


@dataclass
class GenerationRecord:
    """One generation batch: the rows it trains on, as positions in its rounds, and what was logged for it."""

    rounds: list[RoundRecord]  # the rounds whose rows are trained on (dynamic sampling: those with a kept row)
    trained: list[torch.Tensor]  # per round, (K_t,) long: global row indices trained on; sum of K_t = K
    advantages: torch.Tensor | None  # (K,) global: the advantages the loss uses, in the order of ``trained``
    has_signal: bool = True  # False: no informative group at all (the optimizer steps it alone feeds are skipped)

    @classmethod
    def whole(cls, record: RoundRecord) -> GenerationRecord:
        """A round trained on whole (no dynamic sampling)."""
        rows = torch.arange(len(record.rewards))
        return cls([record], [rows], record.advantages)

    def column(self, name: str) -> torch.Tensor:
        """(K, ...) global: a tensor field of the rounds (``rewards_per_func``, ``lengths``, ...) at the trained rows."""
        return torch.cat([getattr(r, name)[rows.to(getattr(r, name).device)] for r, rows in zip(self.rounds,
                                                                                              self.trained, strict=True)])

    def table_entries(self, key: str, column: str | None = None) -> list:
        """The completions-table entries of the trained rows, in order: ``key`` ``"prompt"``, ``"completion"``,
        ``"images"``, or ``"rewards"``/``"extra"`` with a ``column``."""
        entries = []
        for record, rows in zip(self.rounds, self.trained, strict=True):
            values = record.table[key] if column is None else record.table[key].get(column)
            if values:
                entries.extend(values[i] for i in rows.tolist())
        return entries
