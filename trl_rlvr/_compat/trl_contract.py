"""Everything private of TRL's ``GRPOTrainer`` (and transformers' ``Trainer``) that ``RLVRTrainer`` relies on.

TRL is a moving target: its GRPO trainer changes shape between minor releases. ``RLVRTrainer`` overrides a
few private methods, reads a few private attributes and swaps two attributes for the duration of one call;
each is named here once, with what we rely on. :func:`contract_violations` checks an installed TRL against
this list (``tests/test_trl_contract.py`` runs it), so an upgrade fails with a message that says what moved,
rather than with a wrong loss. ``pyproject.toml`` pins TRL to the range the tests prove (``TESTED_TRL``).
"""

from __future__ import annotations

import inspect

#: The TRL versions the test suite proves (keep equal to the pin in pyproject.toml).
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
    # transformers.Trainer
    "_save_checkpoint": ("model", "trial"),
    "_load_optimizer_and_scheduler": ("checkpoint",),
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
    "use_vllm",  # with use_vllm=True, also .vllm_generation: a trl.generation.vllm_generation.VLLMGeneration
)

#: Attributes swapped for the duration of one call -> where TRL must read them for the swap to mean anything.
SWAPPED_ATTRIBUTES = {
    # Dr. GRPO's constant divisor: loss_normalization="constant" with loss_constant swaps it inside _compute_loss.
    "max_completion_length": "_compute_loss",
    # dynamic sampling generates with beta=0 (no reference log-probs for rows it then drops) and computes them
    # for the kept rows itself.
    "beta": "_generate_and_score_completions",
}

#: Module-level helpers imported from TRL.
MODULE_FUNCTIONS = {"trl.trainer.grpo_trainer": ("use_adapter",)}

#: What trl_rlvr._compat.vllm_cpu uses of TRL's VLLMGeneration (methods; ``llm``, ``mode`` and ``enable_sleep_mode`` are
#: attributes it sets), and of vLLM's CPU model runner (checked where vLLM is installed).
VLLM_GENERATION_METHODS = ("sync_weights", "_iter_named_params", "generate")
VLLM_GENERATION_ATTRIBUTES = ("llm", "mode", "enable_sleep_mode")
VLLM_RUNNER_RELOAD = ("reload_weights", ("weights_iterator", "is_checkpoint_format"))

#: ``loss_type`` values our ``loss_normalization`` maps onto.
LOSS_TYPES = ("grpo", "dapo", "dr_grpo")


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
    for name, reader in SWAPPED_ATTRIBUTES.items():
        source = inspect.getsource(getattr(trainer_cls, reader))
        if f"self.{name}" not in source:
            problems.append(f"{trainer_cls.__name__}.{reader} no longer reads self.{name} in {where}")
    for module_name, names in MODULE_FUNCTIONS.items():
        module = importlib.import_module(module_name)
        problems += [f"{module_name}.{n} is gone in {where}" for n in names if not hasattr(module, n)]
    loss_source = inspect.getsource(trainer_cls._compute_loss)
    problems += [
        f"loss_type {t!r} is no longer handled by {trainer_cls.__name__}._compute_loss in {where}"
        for t in LOSS_TYPES
        if f'"{t}"' not in loss_source
    ]
    from trl.generation.vllm_generation import VLLMGeneration

    problems += [
        f"VLLMGeneration.{m} is gone in {where}" for m in VLLM_GENERATION_METHODS if not callable(getattr(VLLMGeneration, m, None))
    ]
    class_source = inspect.getsource(VLLMGeneration)
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
