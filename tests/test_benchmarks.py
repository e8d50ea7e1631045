"""Every benchmark can be run in a smoke mode (.ci/run runs them all: `python -m benchmarks --smoke`) and ends with
an exit status that says whether its cases ran (benchmarks/_status.py)."""

import ast
from pathlib import Path

import pytest

from benchmarks.__main__ import benchmark_modules

ROOT = Path(__file__).resolve().parents[1]


def test_the_smoke_driver_sees_every_benchmark():
    on_disk = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_")}
    assert set(benchmark_modules()) == on_disk and "dynamic_sampling" in on_disk


@pytest.mark.parametrize("name", benchmark_modules())
def test_every_benchmark_has_a_smoke_mode_and_an_exit_status(name):
    source = (ROOT / "benchmarks" / f"{name}.py").read_text()
    tree = ast.parse(source)
    flags = {node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "attr", None) == "add_argument" and node.args
             and isinstance(node.args[0], ast.Constant)}
    assert "--smoke" in flags, f"benchmarks/{name}.py has no --smoke"
    main_block = next(node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))
    assert "sys.exit(" in ast.unparse(main_block), f"benchmarks/{name}.py does not exit with main()'s status"


def test_a_failing_case_fails_the_dynamic_sampling_benchmark():
    """A learner that crashes, or whose import breaks, is a failure; only a trainer the installed TRL lacks is
    'not run' (the benchmark used to report every learner NOT RUN and exit 0)."""
    from benchmarks.dynamic_sampling import failures

    ok = {"method": "a", "name": "x", "seeds": 1, "error": None, "skipped": False, "crashed_in_update_per_seed": [None]}
    assert failures([ok]) == []
    assert failures([{**ok, "seeds": 0, "error": "ModuleNotFoundError: No module named 'length_bias_toy'"}])
    assert failures([{**ok, "crashed_in_update_per_seed": [2], "error": "RuntimeError: boom"}])
    assert failures([{**ok, "method": "c", "seeds": 0, "error": "No module named 'trl.experimental...'",
                      "skipped": True}]) == []
