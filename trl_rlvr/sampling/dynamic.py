"""DAPO dynamic sampling (Yu et al., 2025): keep informative groups, refill with fresh prompts.

A group whose G answers all got the same reward has zero advantage and contributes no gradient. Dynamic
sampling drops such groups and generates for further prompts until the generation batch is full of
informative groups, then trims it to the exact size. The pieces here are pure (tensors and indices in,
tensors and indices out); the trainer glues them to TRL's generation path.

Multi-process layout (as in TRL): the global generation batch is the concatenation of every process's
rows, process r holding rows [r*B, (r+1)*B). Groups can span processes, so the keep/drop decision is taken
from the gathered rewards, identically on every rank; kept rows are gathered, concatenated over rounds and
re-sliced so that every rank ends with the same number of rows.
"""

from __future__ import annotations

import math

import torch

from trl_rlvr.algorithms.advantages import zero_signal_groups

#: Per-row tensors left-padded by TRL (prompt side); everything else 2-D is right-padded (completion side).
LEFT_PADDED = ("prompt_ids", "prompt_mask")
#: Per-row keys dynamic sampling knows how to move between processes.
ROW_KEYS = (
    "prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "old_per_token_logps",
    "ref_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio", "tool_mask",
)


def informative_rows(rewards: torch.Tensor, group_size: int, tolerance: float = 0.0) -> torch.Tensor:
    """Boolean mask over the rows of a flat, group-after-group reward vector: rows of groups with signal."""
    return (~zero_signal_groups(rewards, group_size, tolerance)).repeat_interleave(group_size)


def rows_per_process(kept_rows: int, num_processes: int, steps_per_generation: int, target: int,
                     partial_batch: str = "trim") -> int:
    """Rows each process trains on: the target when enough rows were kept. Else, ``partial_batch="trim"``: the
    largest multiple of ``steps_per_generation`` that every process can fill from the kept rows (0: nothing to train
    on); ``"pad"``: the smallest multiple that holds every kept row (the slots left are filler rows)."""
    per_round = num_processes * steps_per_generation
    if partial_batch == "pad":
        fill = -(-kept_rows // per_round) * steps_per_generation
    elif partial_batch == "trim":
        fill = kept_rows // per_round * steps_per_generation
    else:
        raise ValueError(f"partial_batch must be 'trim' or 'pad', got {partial_batch!r}")
    return min(target, fill)


def filler_rows(row: dict[str, torch.Tensor], count: int) -> dict[str, torch.Tensor]:
    """``count`` copies of a one-row batch that carry no loss token: completion mask and advantage 0. Real tokens
    (the prompt still attended to), so the forward pass of a filler is an ordinary one; only the mask keeps it out of
    the loss, its normalizer and the metrics."""
    out = {key: value.expand(count, *value.shape[1:]).clone() for key, value in row.items()}
    out["completion_mask"].zero_()
    out["advantages"].zero_()
    return out


def pad_to_width(tensor: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
    """Pad a (rows, T, ...) tensor along dim 1 to ``width`` columns, on the left or the right."""
    missing = width - tensor.size(1)
    if missing <= 0:
        return tensor
    pad = tensor.new_full((tensor.size(0), missing, *tensor.shape[2:]), value)
    return torch.cat([pad, tensor] if left else [tensor, pad], dim=1)


def concat_rows(pieces: list[dict[str, torch.Tensor]], pad_values: dict[str, float]) -> dict[str, torch.Tensor]:
    """Concatenate row dicts (same keys) along rows, padding 2-D tensors to a common width first."""
    out = {}
    for key in pieces[0]:
        tensors = [piece[key] for piece in pieces]
        if tensors[0].dim() >= 2:
            width = max(t.size(1) for t in tensors)
            tensors = [pad_to_width(t, width, pad_values.get(key, 0), key in LEFT_PADDED) for t in tensors]
        out[key] = torch.cat(tensors)
    return out


def prompts_for_round(missing_groups: int, full_round: int, oversample: float | None, group_size: int,
                      num_processes: int) -> int:
    """Prompts to draw for a dynamic-sampling round.

    ``oversample`` None: every round is a full generation batch (``full_round`` prompts), as DAPO's recipe does.
    Otherwise ``ceil(oversample x missing_groups)``, the groups the batch still needs (all of them in the first
    round): a round of the first kind fills the batch when at least 1/oversample of its groups have signal, and
    refills generate for what is missing, not a whole batch again. Rounded up so that the round's rows
    (prompts x G) split evenly over the processes.
    """
    if oversample is None:
        return full_round
    prompts = max(1, math.ceil(oversample * missing_groups - 1e-9))
    step = num_processes // math.gcd(group_size, num_processes)
    return -(-prompts // step) * step


class PromptStream:
    """Where dynamic and selective sampling take their prompts from: ONE stream for every round.

    Passes over the dataset, a new permutation each pass (seeded by ``seed`` and the pass number), handed out
    a round at a time: every prompt is used once per pass, whether by a first round or by a refill, so nothing
    is skipped or repeated beyond what a sampler would do. A pass is ``rounds_per_pass`` full rounds (the tail
    of the permutation is dropped, as a sampler with drop_last does); a smaller or larger round continues into
    the next pass. The position advances only when prompts are drawn and is part of the checkpoint
    (:meth:`state_dict`), so a resumed run continues exactly where it stopped. Yields global index lists, each
    prompt repeated ``group_size`` times consecutively, as TRL's ``RepeatSampler`` lays out a generation batch.

    With a :class:`~trl_rlvr.sampling.selective.PromptHistory` (selective sampling), each candidate prompt is first
    offered to it: a skipped prompt is passed over (it comes back in a later pass) and the next one taken. The
    history is part of the checkpoint too.
    """

    def __init__(self, dataset_size: int, prompts_per_round: int, group_size: int, seed: int, shuffle: bool = True,
                 history=None):
        if dataset_size < prompts_per_round:
            raise ValueError(
                f"dynamic_sampling / selective_sampling need at least one generation batch of prompts "
                f"({prompts_per_round}); the training dataset has {dataset_size}"
            )
        self.dataset_size, self.prompts_per_round, self.group_size = dataset_size, prompts_per_round, group_size
        self.seed, self.shuffle, self.history = seed, shuffle, history
        self.epoch, self.position = 0, 0
        self.skipped = 0  # prompts passed over by the history since the counter was last reset (not checkpointed)
        self._order_cache: tuple[int, list[int]] | None = None

    @property
    def rounds_per_pass(self) -> int:
        return self.dataset_size // self.prompts_per_round

    @property
    def pass_length(self) -> int:
        return self.rounds_per_pass * self.prompts_per_round

    def _order(self) -> list[int]:
        if self._order_cache is None or self._order_cache[0] != self.epoch:
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + self.epoch)
                order = torch.randperm(self.dataset_size, generator=generator).tolist()
            else:
                order = list(range(self.dataset_size))
            self._order_cache = (self.epoch, order)
        return self._order_cache[1]

    def next_indices(self, prompts: int | None = None) -> list[int]:
        """Global dataset indices of the next round: ``prompts`` (default: a full round) x group_size."""
        wanted = self.prompts_per_round if prompts is None else prompts
        taken = []
        while len(taken) < wanted:
            if self.position >= self.pass_length:
                self.epoch, self.position = self.epoch + 1, 0
            index = self._order()[self.position]
            if self.history is not None and self.history.skip(index, self.epoch, self.position):
                self.skipped += 1
            else:
                taken.append(index)
            self.position += 1
        return [index for index in taken for _ in range(self.group_size)]

    def state_dict(self) -> dict:
        state = {"epoch": self.epoch, "position": self.position}
        if self.history is not None:
            state["history"] = self.history.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        if self.history is not None and "history" in state:
            self.history.load_state_dict(state["history"])
