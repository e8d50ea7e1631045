"""The two main jobs for tests and benchmarks, without importing an example: each recipe's parser built from the
public pieces the example composes, and the example run as ``python examples/<name>.py ARGS`` runs it (in this
process, so that TRL is imported once)."""

from __future__ import annotations

import runpy
import sys
from dataclasses import dataclass
from pathlib import Path

from trl_rlvr.evaluation.heldout import HeldOutEvalArguments
from trl_rlvr.scripts.train import RecipeArguments

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass
class R1ZeroArguments(HeldOutEvalArguments, RecipeArguments):
    """examples/r1zero.py's arguments: a recipe's and the held-out evaluation's."""


def r1zero_parser():
    """examples/r1zero.py's parser: the recipe parser over its arguments, the job's settings as defaults."""
    from trl_rlvr.presets import R1ZERO_ON_CPU, on_this_machine
    from trl_rlvr.scripts.train import make_parser

    return make_parser(R1ZeroArguments, on_this_machine(R1ZERO_ON_CPU))


def run_example(name: str, *argv: str) -> dict:
    """Run ``examples/<name>.py ARGV`` as a program in this process; returns its globals (``trainer``: what its
    ``main`` returned)."""
    path = EXAMPLES / f"{name}.py"
    saved = sys.argv
    sys.argv = [str(path), *map(str, argv)]
    try:
        return runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv = saved
