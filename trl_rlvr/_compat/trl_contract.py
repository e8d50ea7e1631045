"""Everything private of TRL (and of transformers, accelerate and vLLM) that trl-rlvr relies on, named once.

TRL is a moving target: its GRPO trainer changes shape between minor releases. ``pyproject.toml`` pins TRL
to the range the tests prove (:data:`TESTED_TRL`). After upgrading TRL, run the TRL-upgrade check::

    pytest -m trl_contract

It is behaviour first: the tests marked ``trl_contract`` train ``RLVRTrainer`` and ``GRPOTrainer`` on a tiny
model and compare gradients with independent references written from the papers' formulas
(tests/algorithms/test_loss_normalization.py, tests/test_grpo_config.py), and check what TRL's own config declares
(defaults, loss types). :func:`contract_violations` adds a readable list of what moved (a method gone, a
parameter renamed) so a failed upgrade says where to look rather than only that a gradient differs.

Private pieces we call, override, read or bypass, and what guards each:

TRL ``GRPOTrainer`` (trl/trainer/grpo_trainer.py)

- overridden, calling ``super()``: ``_generate_and_score_completions``, ``_calculate_rewards``,
  ``_prepare_inputs``, ``_compute_loss``, ``_generate_single_turn``, ``log``; called:
  ``_get_per_token_logps_and_entropies`` (reference log-probs of the rows dynamic sampling keeps). Signatures:
  :data:`OVERRIDDEN_METHODS`; behaviour: every trainer test.
- instance attributes read: :data:`READ_ATTRIBUTES` (``_buffered_inputs``, ``_metrics``, ``_tokenizer``, ...).
- attributes swapped for one call (:data:`SWAPPED_ATTRIBUTES`): ``max_completion_length`` inside
  ``_compute_loss`` (Dr. GRPO's ``loss_constant``; guarded by the gradient test
  ``test_constant_normalization_uses_loss_constant``), ``beta`` inside ``_generate_and_score_completions``
  (no reference log-probs for rows dynamic sampling drops; guarded by
  ``test_kl_term_uses_reference_log_probs_of_kept_rows``).
- module helper ``trl.trainer.utils.use_adapter`` (the PEFT reference model).
- ``GRPOConfig.loss_type``'s help text, read for the list of loss types (:func:`trl_loss_types`), and
  ``GRPOConfig``'s field defaults, read by presets (``max_completion_length``).

TRL ``VLLMGeneration`` (trl/generation/vllm_generation.py), used by :mod:`trl_rlvr._compat.vllm_cpu`

- ``sync_weights`` replaced on one instance; ``_iter_named_params`` and ``generate`` called; attributes
  ``llm``, ``mode``, ``enable_sleep_mode`` read. The only source-text check left here (``self.llm =`` ...):
  vLLM is not installed in the main test environment, so no behaviour test there can see it
  (tests/engines/test_vllm_cpu.py runs the behaviour in vLLM's own environment).

transformers ``Trainer``

- overridden, calling ``super()``: ``_save_checkpoint`` (the prompt stream's position goes into the checkpoint),
  ``_load_optimizer_and_scheduler`` (restored on resume), ``_save_rng_state`` (every process's files are written
  before process 0 writes ``trainer_state.json``), ``train`` (``resume_from_checkpoint=True`` takes the newest
  complete checkpoint; SIGTERM handling, :mod:`trl_rlvr.faults`); called: ``_get_output_dir``. The order in
  which ``_save_checkpoint`` writes (``trainer_state.json`` after every other file, then rotation) is what
  :mod:`trl_rlvr.faults.checkpoints` relies on; guarded by ``tests/faults/test_checkpoint_crash.py``.
- bypassed: ``optimizer.step`` and ``lr_scheduler.step`` are shadowed by no-ops on their instances for an
  optimizer step fed only by empty dynamic-sampling batches (``trl_rlvr.trainer._SkipEmptyUpdates``, between
  the callbacks ``on_pre_optimizer_step`` and ``on_step_end``); guarded by
  ``test_an_empty_update_leaves_the_optimizer_and_the_weights_alone``.

vLLM: the CPU model runner's ``reload_weights`` (:data:`VLLM_RUNNER_RELOAD`, :func:`vllm_contract_violations`)
and ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``. bitsandbytes: the module attribute
``support_avx512bf16_for_cpu`` (:mod:`trl_rlvr._compat.quantized`). argparse: ``ArgumentParser._actions`` (the known
keys named in a recipe's unknown-key error).
"""

from __future__ import annotations

import functools
import inspect
import re

#: The TRL versions the test suite proves (keep equal to the pin in pyproject.toml). The ``vllm`` extra follows the
#: range that TRL declares (:func:`trl_vllm_requirement`).
TESTED_TRL = ">=1.16,<1.17"

#: Methods RLVRTrainer overrides or calls -> the parameters (after ``self``) it passes and expects.
OVERRIDDEN_METHODS = {
    "_generate_and_score_completions": ("inputs",),  # returns the row dict of ROW_KEYS + num_items_in_batch
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),  # -> (N_global, n_funcs)
    "_prepare_inputs": ("generation_batch",),  # fills self._buffered_inputs once per generation round
    "_compute_loss": ("model", "inputs"),
    "_get_per_token_logps_and_entropies": ("model", "input_ids", "attention_mask", "logits_to_keep"),
    "log": ("logs", "start_time"),
    "_generate_single_turn": ("prompt_ids",),  # where TRL syncs vLLM's weights before generating (vllm_cpu)
    "_generate": ("prompts",),  # -> (prompt_ids, completion_ids, tool_mask, ...): the tool mask, read for lengths
    # transformers.Trainer
    "_save_checkpoint": ("model", "trial"),
    "_load_optimizer_and_scheduler": ("checkpoint",),
    "_save_rng_state": ("output_dir",),  # the last per-process file of a checkpoint (a barrier follows it)
    "train": ("resume_from_checkpoint", "trial", "ignore_keys_for_eval"),  # complete checkpoints, SIGTERM
    "_get_output_dir": ("trial",),
    "_determine_best_metric": ("metrics", "trial"),  # SampledEvalCallback's metrics for load_best_model_at_end
}

#: Instance attributes GRPOTrainer.__init__ sets and RLVRTrainer reads.
READ_ATTRIBUTES = (
    "_buffered_inputs",  # the micro-batches of the current generation round (exact DAPO token counts)
    "_metrics",  # {"train"|"eval": defaultdict(list)}: where rlvr/ diagnostics go
    "_logs",  # {"completion": deque, ...}: the decoded completions trl-rlvr doctor shows
    "_tokenizer",  # pad token id for padding gathered rows
    "eos_token_ids",  # truncation = last token not a stop token
    "reward_funcs",
    "reward_func_names",
    "reward_weights",
    "multi_objective_aggregation",
    "num_generations",
    "num_generations_eval",
    "scale_rewards",
    "shuffle_dataset",
    "ref_model",
    "accelerator",
    "beta",
    "max_completion_length",
    "environments",  # the batch's environment instances (None without environment_factory): tool figures
    "tools",  # the tools offered (standalone and environments'): whether to log tool figures
    "use_vllm",  # with use_vllm=True, also .vllm_generation: a trl.generation.vllm_generation.VLLMGeneration
)

#: Attributes swapped for the duration of one call -> where TRL must read them for the swap to mean anything
#: (guarded by behaviour tests, see the module docstring).
SWAPPED_ATTRIBUTES = {
    # Dr. GRPO's constant divisor: loss_normalization="constant" with loss_constant swaps it inside _compute_loss.
    "max_completion_length": "_compute_loss",
    # dynamic sampling generates with beta=0 (no reference log-probs for rows it then drops) and computes them
    # for the kept rows itself.
    "beta": "_generate_and_score_completions",
    # the completions-table entries TRL writes in a round are held back (a fresh table for the call) until the rows
    # trained on are known (guarded by tests/test_logged_is_trained.py).
    "_logs": "_generate_and_score_completions",
}

#: Module-level helpers imported from TRL.
MODULE_FUNCTIONS = {"trl.trainer.utils": ("use_adapter", "nanstd")}  # nanstd: TRL's figures of the trained rows

#: What trl_rlvr._compat.vllm_cpu uses of TRL's VLLMGeneration (methods; ``llm``, ``mode`` and ``enable_sleep_mode`` are
#: attributes it sets), and of vLLM's CPU model runner (checked where vLLM is installed).
VLLM_GENERATION_METHODS = ("sync_weights", "_iter_named_params", "generate")
VLLM_GENERATION_ATTRIBUTES = ("llm", "mode", "enable_sleep_mode")
VLLM_RUNNER_RELOAD = ("reload_weights", ("weights_iterator", "is_checkpoint_format"))



@functools.cache
def trl_loss_types() -> tuple[str, ...] | None:
    """The ``loss_type`` values the installed TRL supports, as its ``GRPOConfig.loss_type`` help lists them
    ("Supported values are 'grpo', 'dr_grpo', ..."); None when the help no longer has that sentence (then
    :func:`contract_violations` says so, and TRL itself rejects an unknown value at the first loss step)."""
    from trl import GRPOConfig

    help_text = GRPOConfig.__dataclass_fields__["loss_type"].metadata.get("help", "")
    sentence = re.search(r"Supported values are (.*?)\.(?:\s|$)", help_text)
    names = tuple(re.findall(r"'(\w+)'", sentence.group(1))) if sentence else ()
    return names or None


def trl_vllm_requirement() -> str | None:
    """The vLLM versions the installed TRL supports, as its own ``vllm`` extra declares them (its metadata's
    ``Requires-Dist: vllm<=0.31.0,>=0.22.0; extra == "vllm"`` for TRL 1.16; TRL warns at import outside them).
    The ``vllm`` extra of pyproject.toml pins the same range (``pytest -m trl_contract`` holds them equal, so an
    upgrade of TRL moves both); None when TRL declares no such extra."""
    import importlib.metadata

    from packaging.requirements import Requirement

    for line in importlib.metadata.requires("trl") or ():
        requirement = Requirement(line)
        if requirement.name == "vllm" and requirement.marker is not None and requirement.marker.evaluate({"extra": "vllm"}):
            return str(requirement.specifier)
    return None


def contract_violations(trainer_cls=None, trainer=None) -> list[str]:
    """What of the contract above the installed TRL breaks (empty when it holds).

    ``trainer_cls`` defaults to ``trl.GRPOTrainer``; pass a built ``trainer`` to check the instance attributes too.
    """
    import importlib

    import trl

    if trainer_cls is None:
        trainer_cls = trl.GRPOTrainer
    where = f"trl {trl.__version__} (trl-rlvr is tested with trl{TESTED_TRL})"
    problems = []
    for name, params in OVERRIDDEN_METHODS.items():
        method = getattr(trainer_cls, name, None)
        if not callable(method):
            problems.append(f"{trainer_cls.__name__}.{name} is gone in {where}")
            continue
        have = list(inspect.signature(method).parameters)[1:]
        missing = [p for p in params if p not in have]
        if missing:
            problems.append(f"{trainer_cls.__name__}.{name}{tuple(have)} lacks parameter(s) {missing} in {where}")
    for module_name, names in MODULE_FUNCTIONS.items():
        module = importlib.import_module(module_name)
        problems += [f"{module_name}.{n} is gone in {where}" for n in names if not hasattr(module, n)]
    if trl_loss_types() is None:
        problems.append(f"GRPOConfig.loss_type's help no longer lists the supported values in {where}")
    from trl.generation.vllm_generation import VLLMGeneration

    problems += [
        f"VLLMGeneration.{m} is gone in {where}" for m in VLLM_GENERATION_METHODS if not callable(getattr(VLLMGeneration, m, None))
    ]
    class_source = inspect.getsource(VLLMGeneration)  # source text: vLLM is absent where the main suite runs
    problems += [
        f"VLLMGeneration no longer sets .{a} in {where}" for a in VLLM_GENERATION_ATTRIBUTES if f"self.{a} =" not in class_source
    ]
    if trainer is not None:
        problems += [f"GRPOTrainer instances no longer have .{a} in {where}" for a in READ_ATTRIBUTES if not hasattr(trainer, a)]
    return problems


def vllm_contract_violations() -> list[str]:
    """What trl_rlvr._compat.vllm_cpu relies on of the installed vLLM: its CPU model runner's reload path."""
    import vllm
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    name, params = VLLM_RUNNER_RELOAD
    method = getattr(CPUModelRunner, name, None)
    if not callable(method):
        return [f"vLLM {vllm.__version__}: the model runner has no {name}()"]
    missing = [p for p in params if p not in inspect.signature(method).parameters]
    return [f"vLLM {vllm.__version__}: {name}() lacks {missing}"] if missing else []
