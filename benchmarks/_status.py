"""The exit status every benchmark ends with, so that a broken benchmark cannot pass for a finished one.

- 0: every case ran and passed the checks the benchmark makes;
- 1: a case failed or crashed (each named on stderr, with the reason);
- :data:`SKIPPED` (77, the automake/meson convention): the benchmark cannot run on this machine (no GPU, a
  tool missing); it says what it needs. ``python -m benchmarks --smoke`` reports it as skipped, not passed.

Every benchmark has a ``--smoke`` mode (tiny sizes, one seed, seconds) that ``.ci/run`` runs once.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

SKIPPED = 77


def finish(name: str, failures: Iterable[str]) -> int:
    """0 when ``failures`` is empty; else print each on stderr and return 1."""
    failures = list(failures)
    for failure in failures:
        print(f"{name}: FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


def skip(name: str, reason: str) -> int:
    """Say why ``name`` cannot run here; the status to exit with."""
    print(f"{name}: SKIPPED: {reason}", file=sys.stderr)
    return SKIPPED
