"""How far an asynchronous trainer's prompt stream has been consumed, so that a resumed run takes up where the
checkpoint left it (pure, no I/O).

TRL's asynchronous rollout process walks the prompt dataset in order, pass after pass (``dataset[p % len]`` is the
prompt at stream position ``p``), one group per prompt; with :class:`StreamStart` the group's ``group_id`` is its
stream position. Groups complete out of order (``max_inflight_tasks`` generations in flight), reach the trainer
through a queue and are trained some steps later; a checkpoint must say which positions are *settled*:

- **trained**: a row of the group was in a micro-batch that a finished optimizer step trained (the first such row
  settles it; the collator's prefetch of the next micro-batch does not);
- **dropped**: the group was refused whole (older than ``max_staleness`` at its first row) or produced no row to
  queue (dynamic sampling's zero-signal drop in the rollout process, or nothing trainable).

:class:`StreamLedger` keeps ``next_position`` (every position below it settled) and the settled positions above it
(out-of-order completions: at most what was in flight). A resumed rollout process starts at ``next_position`` and
skips the settled ones (:func:`stream_positions`). Then, for every stream position:

- its group is trained in at most one run segment: a settled position is never generated again;
- none is skipped: an unsettled position (in flight, queued, prefetched, or generated after the checkpoint) is
  generated again after the resume;
- the resumed run takes the unsettled positions in stream order, as the first run did.

The price of "at most once" is one partial group per resume: the queue delivers a group's rows together and a step
trains a prefix of the queue, so at most one group straddles the checkpoint's step boundary; its rows trained before
the checkpoint stand, its other rows are not trained (they were never part of a checkpointed step).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StreamStart:
    """Where a rollout process starts its prompt stream: at ``position``, skipping the positions in ``skip`` (each
    ``>= position``). Picklable: it travels to the spawned rollout process."""

    position: int = 0
    skip: frozenset[int] = frozenset()

    def __post_init__(self):
        if self.position < 0 or any(p < self.position for p in self.skip):
            raise ValueError(f"StreamStart: position {self.position} must be >= 0 and every skipped one above it")


def stream_positions(start: StreamStart) -> Iterator[int]:
    """The stream positions a rollout process generates, in order: from ``start.position`` on, without the
    skipped ones (endless: the dataset is taken pass after pass, ``position % len(dataset)``)."""
    position = start.position
    while True:
        if position not in start.skip:
            yield position
        position += 1


@dataclass
class StreamLedger:
    """The settled stream positions (module docstring): ``next_position`` and the settled ones above it;
    ``groups_trained`` counts the trained groups since the run began (resumes included)."""

    next_position: int = 0
    settled_after: set[int] = field(default_factory=set)
    groups_trained: int = 0

    def is_settled(self, position: int) -> bool:
        return position < self.next_position or position in self.settled_after

    def settle(self, position: int, trained: bool) -> None:
        """Position ``position``'s group was trained (``trained``) or dropped; a settled position stays as it was."""
        if self.is_settled(position):
            return
        self.settled_after.add(position)
        self.groups_trained += int(trained)
        while self.next_position in self.settled_after:
            self.settled_after.remove(self.next_position)
            self.next_position += 1

    def trained(self, positions: Iterable[int]) -> None:
        for position in positions:
            self.settle(position, trained=True)

    def start(self) -> StreamStart:
        """Where a resumed rollout process starts."""
        return StreamStart(self.next_position, frozenset(self.settled_after))

    def state_dict(self) -> dict:
        return {"next_position": self.next_position, "settled_after": sorted(self.settled_after),
                "groups_trained": self.groups_trained}

    @classmethod
    def from_state_dict(cls, state: dict) -> StreamLedger:
        ledger = cls(int(state["next_position"]), {int(p) for p in state["settled_after"]},
                     int(state.get("groups_trained", 0)))
        ledger.start()  # validates
        return ledger
