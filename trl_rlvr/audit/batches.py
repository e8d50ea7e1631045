"""How the audit's calls look like training's: GRPO-shaped batches, real token ids, a trainer state.

TRL's GRPOTrainer calls a reward once per batch: ``num_generations`` completions of each prompt side by side (a
group, sharing the prompt and the dataset row), several groups per call, ``completion_ids`` from the tokenizer,
and ``trainer_state`` its ``transformers.TrainerState``. The audit calls the same way (:func:`plan`): each case is
a group with its metamorphic variants (:mod:`trl_rlvr.audit.variants`), padded to the group size with repeats
of its members (a GRPO group often holds the same completion twice), and the groups of several cases, hostile
and plain ones drawn in a seeded random order, share a call; the completions are tokenized by a real tokenizer
(:func:`load_tokenizer`); the trainer state is a ``TrainerState`` whose step advances call by call
(:func:`trainer_state`). A reward that behaves only when called one case at a time, with byte ids, or with no
trainer state is then seen behaving otherwise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from trl_rlvr.audit.cases import Case

DEFAULT_GROUP_SIZE = 4
DEFAULT_GROUPS_PER_CALL = 2


@dataclass(frozen=True)
class Item:
    """One completion of a call: the case it scores (a corpus case or one of its variants)."""

    case: Case
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Call:
    """One reward call: its completions in order (groups side by side) and the trainer state it carries."""

    items: tuple[Item, ...]
    state: dict


class Tokenizer:
    """A ``tokenizers.Tokenizer``: from a file or a model directory (``tokenizer.json``), else the character
    tokenizer of :mod:`trl_rlvr.testing` (offline, no download)."""

    def __init__(self, path: str | Path | None = None):
        from tokenizers import Tokenizer as HFTokenizer

        if path is None:
            from trl_rlvr.testing import char_tokenizer

            self._tok, self.name = char_tokenizer(), "trl_rlvr.testing char tokenizer"
            return
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise ValueError(f"audit tokenizer: no tokenizer file at {p} (give a tokenizer.json or a model directory)")
        self._tok, self.name = HFTokenizer.from_file(str(p)), str(p)

    def ids(self, text: str) -> tuple[int, ...]:
        return tuple(self._tok.encode(text, add_special_tokens=False).ids)


def trainer_state(step: int, max_steps: int, rng: random.Random) -> dict:
    """The fields of a ``transformers.TrainerState`` at ``step`` of a run of ``max_steps`` (the child builds the
    object from them)."""
    return {"global_step": step, "max_steps": max_steps, "epoch": step / max_steps, "num_train_epochs": 1,
            "logging_steps": rng.choice([1, 5, 10]), "save_steps": 500, "eval_steps": None,
            "train_batch_size": rng.choice([8, 16]), "is_local_process_zero": True, "is_world_process_zero": True,
            "log_history": [], "total_flos": 0.0}


def plan(cases: list[list[Case]], tokenizer: Tokenizer, rng: random.Random, group_size: int = DEFAULT_GROUP_SIZE,
         groups_per_call: int = DEFAULT_GROUPS_PER_CALL) -> list[Call]:
    """The calls for ``cases`` (each a corpus case followed by its variants), in a seeded random order.

    Only cases with the same columns share a call (one dataset has one set of columns); each case's group is
    its members, shuffled, padded with repeats to at least ``group_size``."""
    groups: dict[tuple, list[list[Case]]] = {}
    for members in cases:
        group = list(members)
        while len(group) < group_size:
            group.append(rng.choice(members))
        rng.shuffle(group)
        groups.setdefault(tuple(sorted(members[0].columns)), []).append(group)
    chunks = []
    for same_columns in groups.values():
        rng.shuffle(same_columns)
        chunks += [same_columns[i:i + groups_per_call] for i in range(0, len(same_columns), groups_per_call)]
    rng.shuffle(chunks)
    max_steps = len(chunks) + rng.randrange(10, 500)
    first = rng.randrange(0, max_steps - len(chunks))
    return [Call(tuple(Item(c, tokenizer.ids(c.completion)) for group in chunk for c in group),
                 trainer_state(first + k, max_steps, rng)) for k, chunk in enumerate(chunks)]
