"""The attributes of TRL's trainer swapped for one call (declared in :data:`.trl_contract.ADAPTER`)."""

from __future__ import annotations

import contextlib
from collections import defaultdict


@contextlib.contextmanager
def swapped(obj, name: str, value):
    """Within the block, ``obj.name`` is ``value``; the old value is put back however the block ends."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def table_held_back(trainer):
    """Within the block, TRL's completions-table entries go to a fresh table (yielded), not to ``trainer._logs``."""
    table = {"images": [], "prompt": [], "completion": [], "rewards": defaultdict(list), "advantages": [],
             "extra": defaultdict(list)}
    with swapped(trainer, "_logs", table):
        yield table
