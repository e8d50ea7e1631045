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

- private methods overridden, calling ``super()``, each with why TRL's public API does not do it:
  :data:`OVERRIDDEN_METHODS` (``_generate_and_score_completions``, ``_generate``, ``_tool_call_loop``,
  ``_calculate_rewards``, ``_prepare_inputs``); called: :data:`CALLED_METHODS`; public methods overridden:
  :data:`PUBLIC_OVERRIDES` (``compute_loss``, ``log``, ``train``, ``training_step``). Signatures checked;
  behaviour: every trainer test. The public extension points that do not replace them, and why:
  :data:`PUBLIC_API_NOT_USED`.
- instance attributes read: :data:`READ_ATTRIBUTES` (``_buffered_inputs``, ``_metrics``, ``_tokenizer``,
  ``_pending_metrics``, ...); set only with vLLM: :data:`VLLM_TRAINER_ATTRIBUTES`; set while TRL generates and
  changed here: :data:`ROUND_ATTRIBUTES` (``_sync_tool_dicts``, wrapped in place by trl_rlvr.rollouts.tool_round).
- attributes swapped for one call (:data:`SWAPPED_ATTRIBUTES`, :mod:`trl_rlvr._compat.swaps`):
  ``_get_per_token_logps_and_entropies`` around ``compute_loss`` with ``policy_shift_metrics`` (the loss's
  log-probs noted, :mod:`trl_rlvr.checks.shift_monitor`), ``max_completion_length`` around ``compute_loss`` (Dr. GRPO's ``loss_constant``; guarded by the gradient test
  ``test_constant_normalization_uses_loss_constant``), ``beta`` around dynamic sampling's rounds (no reference
  log-probs for rows it drops; ``test_kl_term_uses_reference_log_probs_of_kept_rows``), ``_logs`` and
  ``_metrics["train"]`` (what a round logs, held back until the rows trained on are known;
  tests/test_logged_is_trained.py).
- TRL code re-implemented here, with TRL's line range and a line that must still be in it: :data:`COPIED_PATHS`
  (the reference log-probs, the reward and length figures, the evaluation's tool loop).
- the figures TRL logs while it generates, by what they describe (:data:`TRL_ROW_FIGURES`,
  :data:`TRL_GENERATION_FIGURES`), checked against TRL's source (:func:`trl_round_figures`); what its loss logs once
  per optimizer step (:data:`TRL_STEP_FIGURES`, kept when a micro-batch has no loss token; the rest is dropped then).
- environments: :data:`ENVIRONMENT_DISPATCH` (``_dispatch_call``, private so that TRL never offers it as a tool;
  TRL's discovery of an environment's tools is checked to skip private names).
- module helpers :data:`MODULE_FUNCTIONS` (``use_adapter``: the PEFT reference model; ``nanstd``).
- module constants swapped for one training step (:data:`MODULE_CONSTANTS`, through the public override
  ``training_step``): ``trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE``, the fused LM head's token tile, smaller on
  a CPU (``cpu_logprob_tile_tokens``, :mod:`trl_rlvr._compat.logprob_tiles`).
- ``GRPOConfig.loss_type``'s help text, read for the list of loss types (:func:`trl_loss_types`), and
  ``GRPOConfig``'s field defaults, read by presets (``max_completion_length``).

:func:`warn_on_contract_violations` runs all of this when ``RLVRTrainer`` is built (the class part once per process,
a few milliseconds) and warns once, naming each piece that moved.

TRL ``VLLMGeneration`` (trl/generation/vllm_generation.py), used by :mod:`trl_rlvr._compat.vllm_cpu`

- ``sync_weights`` replaced on one instance; ``_iter_named_params`` and ``generate`` called; attributes
  ``llm``, ``mode``, ``enable_sleep_mode`` read. The only source-text check left here (``self.llm =`` ...):
  vLLM is not installed in the main test environment, so no behaviour test there can see it
  (tests/engines/test_vllm_cpu.py runs the behaviour in vLLM's own environment).

transformers ``Trainer``

- overridden, calling ``super()`` (:data:`TRANSFORMERS_METHODS`): ``_save_checkpoint`` (the prompt stream's
  position goes into the checkpoint; restored in ``train``), ``_save_rng_state`` (every process's files are written
  before process 0 writes ``trainer_state.json``), ``train`` (``resume_from_checkpoint=True`` takes the newest
  complete checkpoint; SIGTERM handling, :mod:`trl_rlvr.faults`); called: ``_get_output_dir``. The order in
  which ``_save_checkpoint`` writes (``trainer_state.json`` after every other file, then rotation) is what
  :mod:`trl_rlvr.faults.checkpoints` relies on; guarded by ``tests/faults/test_checkpoint_crash.py``.
- bypassed: ``optimizer.step`` and ``lr_scheduler.step`` are shadowed by no-ops on their instances for an
  optimizer step fed only by empty dynamic-sampling batches (``trl_rlvr.sampling.empty_updates.SkipEmptyUpdates``, between
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

#: TRL's private methods RLVRTrainer overrides (each calls ``super()``) -> (the parameters, after ``self``, it passes
#: and expects; why TRL's public API cannot do it: the hook TRL would need, docs/trainer.md "Upstreaming").
OVERRIDDEN_METHODS = {
    "_generate_and_score_completions": (("inputs",),
        "the round driver's entry: TRL's training loop asks it for a generation batch; dynamic sampling answers with "
        "several rounds' kept rows, and every round's advantages are ours (no advantages hook in TRL)"),
    "_generate": (("prompts",),
        "its third result, the tool mask, is the only place TRL exposes which tokens a tool wrote; rewards and "
        "lengths need it (TRL passes no tool_mask to reward functions)"),
    "_tool_call_loop": (("prompts", "prompt_ids", "completion_ids", "completions", "logprobs"),
        "the first point where the rollouts' pending tool calls (completions) and this batch's tool dicts both "
        "exist: the round's calls are sent ahead together (trl_rlvr.rollouts.tool_round); TRL runs them in turn"),
    "_calculate_rewards": (("inputs", "prompts", "completions", "completion_ids_list"),
        "the tool mask to the reward functions, the finite-reward check and the round's gathered rewards noted; "
        "TRL has no hook between scoring and advantages"),
    "_prepare_inputs": (("generation_batch",),
        "the one place the shuffled micro-batches of a generation batch exist together: each gets its optimizer "
        "step's exact token count (DAPO)"),
}

#: TRL's methods RLVRTrainer calls (not overrides) -> the parameters it passes.
CALLED_METHODS = {
    "_get_per_token_logps_and_entropies": ("model", "input_ids", "attention_mask", "logits_to_keep"),  # ref log-probs
}

#: Public methods overridden (the documented way to extend a Trainer; listed so that a renamed parameter is seen).
PUBLIC_OVERRIDES = {
    "compute_loss": ("model", "inputs", "return_outputs", "num_items_in_batch"),  # Dr. GRPO's loss_constant
    "log": ("logs", "start_time"),  # clip_ratio/* re-published as rlvr/clip_*_frac before Trainer.log records them
    "train": ("resume_from_checkpoint", "trial", "ignore_keys_for_eval"),  # complete checkpoints, SIGTERM, stream
    "training_step": ("model", "inputs", "num_items_in_batch"),  # the LM head's CPU tiles (MODULE_CONSTANTS)
}

#: transformers ``Trainer``'s private methods overridden or called -> (parameters, why).
TRANSFORMERS_METHODS = {
    "_save_checkpoint": (("model", "trial"),
        "the prompt stream's position is written before the model, optimizer and trainer state (a checkpoint that "
        "rotation keeps always has it); on_save runs after trainer_state.json, too late"),
    "_save_rng_state": (("output_dir",),
        "the last per-process file of a checkpoint: a barrier after it, before process 0 writes trainer_state.json"),
    "_get_output_dir": (("trial",), "called: the checkpoint folder _save_checkpoint writes into"),
    "_determine_best_metric": (("metrics", "trial"), "called: SampledEvalCallback's metrics for load_best_model_at_end"),
}

#: Instance attributes GRPOTrainer.__init__ sets and RLVRTrainer reads.
READ_ATTRIBUTES = (
    "_buffered_inputs",  # the micro-batches of the current generation round (exact DAPO token counts)
    "_metrics",  # {"train"|"eval": defaultdict(list)}: where rlvr/ diagnostics go
    "_logs",  # {"completion": deque, ...}: the completions table (held back per round, the trained rows written)
    "_tokenizer",  # pad token id for padding gathered rows
    "_pending_metrics",  # the names reward functions logged through log_metric this round (passed through)
    "eos_token_ids",  # truncation = last token not a stop token
    "reward_funcs",
    "reward_func_names",
    "reward_weights",
    "multi_objective_aggregation",
    "mask_truncated_completions",
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

#: Set by GRPOTrainer.__init__ only with use_vllm=True (checked in its source): the VLLMGeneration, and the step its
#: weights were last synced at (read and set by trl_rlvr.evaluation.vllm_generation).
VLLM_TRAINER_ATTRIBUTES = ("vllm_generation", "_last_loaded_step")

#: Attributes set by TRL while it generates (not at construction) and read or changed by RLVRTrainer -> where.
ROUND_ATTRIBUTES = {
    # per-rollout {tool name: bound method}, built in _generate_and_score_completions before _generate; wrapped in
    # place by trl_rlvr.rollouts.tool_round inside _tool_call_loop (which reads it for its calls)
    "_sync_tool_dicts": ("_generate_and_score_completions", "_tool_call_loop"),
}

#: The method trl_rlvr.rollouts.tool_round calls on an environment (where it has it) to send a tool call ahead ->
#: its parameters. Private on purpose: TRL offers every public method of an environment to the model as a tool (its
#: discovery skips names with a leading underscore, checked in its source), and the model must not call this one.
ENVIRONMENT_DISPATCH = ("_dispatch_call", ("name", "arguments"))

#: Attributes swapped for the duration of one call -> where TRL must read them for the swap to mean anything
#: (guarded by behaviour tests, see the module docstring).
SWAPPED_ATTRIBUTES = {
    # Dr. GRPO's constant divisor: loss_normalization="constant" with loss_constant swaps it inside compute_loss.
    "max_completion_length": "_compute_loss",
    # dynamic sampling generates with beta=0 (no reference log-probs for rows it then drops) and computes them
    # for the kept rows itself (COPIED_PATHS["reference log-probs"]).
    "beta": "_generate_and_score_completions",
    # the completions-table entries TRL writes in a round are held back (a fresh table for the call) until the rows
    # trained on are known (guarded by tests/test_logged_is_trained.py).
    "_logs": "_generate_and_score_completions",
    # _metrics["train"]: what dynamic sampling's rounds log is held back, then merged (trl_rlvr.sampling.driver)
    "_metrics": "_generate_and_score_completions",
    # policy_shift_metrics: within compute_loss, an instance attribute over the method notes the log-probs the
    # loss's forward returns (the policy before the step; trl_rlvr.checks.shift_monitor). TRL exposes neither the
    # log-probs nor a hook between its forward and its loss; recomputing them would cost a second forward pass.
    # Guarded by tests/test_policy_shift_training.py (the recorded log-probs equal an independent forward's).
    "_get_per_token_logps_and_entropies": "_compute_loss",
}

#: TRL code paths re-implemented here -> (TRL function, its line range in trl 1.16.0's trl/trainer/grpo_trainer.py,
#: a line of it that must still be there, where ours lives, why it is not called).
COPIED_PATHS = {
    "reference log-probs": ("_generate_and_score_completions", (2709, 2739),
        "# Compute the per-token log probabilities for the reference model", "RLVRTrainer._reference_logps",
        "TRL computes them for every generated row or none (beta); dynamic sampling wants the kept rows only"),
    "length figures": ("_generate", (2295, 2310), "# Log completion lengths, mean, min, max",
        "trl_rlvr.sampling.figures.trained_figures",
        "TRL's figures of every generated row, evaluated on the rows dynamic sampling trains on"),
    "reward figures": ("_generate_and_score_completions", (2820, 2830),
        "# Calculate mean reward per function, but only for samples where the function was applied",
        "trl_rlvr.sampling.figures.trained_figures", "as the length figures"),
    "evaluation tool loop": ("_tool_call_loop", (1945, 2191),
        "# Tool execution loop: execute tools, then regenerate completions with tool results appended to the prompt",
        "trl_rlvr.evaluation.tool_rollouts",
        "the evaluation's rollouts are seeded per sample and run without a GRPOTrainer (HF generate or vLLM)"),
    "tool reply header": ("_get_tool_suffix_ids", (1893, 1943),
        "# Use the real tool name instead of a dummy", "trl_rlvr.evaluation.tool_rollouts",
        "as the evaluation tool loop"),
}

#: What TRL logs while it generates and scores one round (``_generate``, ``_generate_and_score_completions``), by
#: what it describes. Checked against TRL's source (:func:`trl_round_figures`): a figure TRL adds there is named.
#: Per row (recomputed on the rows trained on under dynamic sampling; ``{name}`` is each reward function's name):
TRL_ROW_FIGURES = (
    "reward", "reward_std", "frac_reward_zero_std", "rewards/{name}/mean", "rewards/{name}/std",
    "completions/mean_length", "completions/min_length", "completions/max_length", "completions/clipped_ratio",
    "completions/mean_terminated_length", "completions/min_terminated_length", "completions/max_terminated_length",
)
#: Of the generation as a whole (passed through): tokens seen, tool calls, vLLM's sampling mismatch.
TRL_GENERATION_FIGURES = (
    "num_tokens", "tools/call_frequency", "tools/failure_frequency", "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max", "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean", "sampling/importance_sampling_ratio/max",
)
#: Set, not appended, by TRL (a running total).
TRL_ASSIGNED_FIGURES = ("num_tokens",)
#: What TRL's loss (``_compute_loss``) logs once per optimizer step, not of the micro-batch: a setting. The rest of
#: what it logs describes the micro-batch, and is dropped for a micro-batch with no loss token under
#: ``dynamic_sampling_partial_batch="pad"`` (:func:`trl_rlvr.sampling.figures.loss_figures_of_trained_tokens`). Checked to be among
#: the names TRL's ``_compute_loss`` logs (:func:`trl_logged_figures`).
TRL_STEP_FIGURES = ("entropy_coef",)
#: The variable TRL logs reward functions' ``log_metric`` counters under (``self._metrics[mode][name]``).
TRL_REWARD_METRIC_VARIABLE = "name"

#: Why TRL's public extension points do not replace the overrides above.
PUBLIC_API_NOT_USED = {
    "rollout_func": "a user's slot (GRPOTrainer(rollout_func=...)), forwarded untouched: taking it would break the "
                    "drop-in, and it replaces generation, not the advantages or the choice of rows",
    "callbacks": "used where they suffice (skipping empty updates, alarms); none runs between scoring and the loss, "
                 "and on_save runs after trainer_state.json",
    "compute_loss": "overridden instead of the private _compute_loss (loss_constant)",
}


def trl_row_figure_names(reward_func_names) -> list[str]:
    """:data:`TRL_ROW_FIGURES` with each reward function's name filled in."""
    return [n.format(name=r) for n in TRL_ROW_FIGURES for r in (reward_func_names if "{name}" in n else [None])]


def trl_round_figures(trainer_cls=None) -> set[str]:
    """The metric names the installed TRL logs in ``_generate`` and ``_generate_and_score_completions``."""
    return trl_logged_figures(("_generate", "_generate_and_score_completions"), trainer_cls)


def trl_logged_figures(methods: tuple[str, ...], trainer_cls=None) -> set[str]:
    """The metric names the installed TRL logs in ``methods``, read from its source (an f-string's field as
    ``{name}``; a variable as its name)."""
    if trainer_cls is None:
        from trl import GRPOTrainer as trainer_cls
    found = set()
    for method in methods:
        source = _source(trainer_cls, method)
        for literal, variable in re.findall(r'self\._metrics\[mode\]\[(f?"[^"]+")\]|self\._metrics\[mode\]\[(\w+)\]', source):
            found.add(re.sub(r"\{[^}]*\}", "{name}", literal.lstrip("f").strip('"')) if literal else variable)
    return found


#: Module-level helpers imported from TRL.
MODULE_FUNCTIONS = {"trl.trainer.utils": ("use_adapter", "nanstd")}  # nanstd: TRL's figures of the trained rows

#: Module constants of TRL swapped for one training step -> (constant, the class whose methods must read it as a
#: module global for the swap to mean anything). ``TOKEN_CHUNK_SIZE``: the token tile of TRL's fused LM head, read
#: by its forward and its backward; cpu_logprob_tile_tokens sets it on a CPU (trl_rlvr._compat.logprob_tiles; guarded
#: by tests/test_cpu_logprob_tiles.py, which sees the tiles of both passes).
MODULE_CONSTANTS = {"trl.kernels.chunked_logprob": ("TOKEN_CHUNK_SIZE", "ChunkedLogProbFunction")}

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


def _signature_problems(cls, methods: dict, where: str) -> list[str]:
    problems = []
    for name, spec in methods.items():
        params = spec[0] if isinstance(spec[0], tuple) else spec
        method = getattr(cls, name, None)
        if not callable(method):
            problems.append(f"{cls.__name__}.{name} is gone in {where}")
            continue
        have = list(inspect.signature(method).parameters)[1:]
        missing = [p for p in params if p not in have]
        if missing:
            problems.append(f"{cls.__name__}.{name}{tuple(have)} lacks parameter(s) {missing} in {where}")
    return problems


def _source(cls, name: str) -> str:
    """The source text of ``cls.name`` ("" when it is gone), from its code object's line range: what
    ``inspect.getsource`` gives without tokenizing the method (TRL's ``__init__`` is 900 lines; this runs when every
    trainer is built)."""
    import linecache

    method = inspect.unwrap(getattr(cls, name, None) or (lambda: None))
    code = getattr(method, "__code__", None)
    if code is None or getattr(cls, name, None) is None:
        return ""
    last = max((line for _, _, line in code.co_lines() if line is not None), default=code.co_firstlineno)
    return "".join(linecache.getlines(code.co_filename)[code.co_firstlineno - 1 : last])


def _class_violations(trainer_cls, where: str) -> list[str]:
    """What of the contract the class ``trainer_cls`` (TRL's GRPOTrainer or a stand-in) breaks."""
    import importlib

    cls = trainer_cls.__name__
    problems = _signature_problems(trainer_cls, {**OVERRIDDEN_METHODS, **CALLED_METHODS, **PUBLIC_OVERRIDES,
                                                 **TRANSFORMERS_METHODS}, where)
    gone = {m for m in ({*SWAPPED_ATTRIBUTES.values(), *(p[0] for p in COPIED_PATHS.values()),
                         *(m for ms in ROUND_ATTRIBUTES.values() for m in ms)}) if not _source(trainer_cls, m)}
    problems += [f"{cls}.{m} is gone in {where}" for m in sorted(gone) if f"{cls}.{m} is gone" not in str(problems)]
    for attribute, methods in ROUND_ATTRIBUTES.items():
        problems += [f"{cls}.{m} no longer uses self.{attribute} in {where}" for m in methods
                     if m not in gone and f"self.{attribute}" not in _source(trainer_cls, m)]
    for attribute, method in SWAPPED_ATTRIBUTES.items():
        if method not in gone and f"self.{attribute}" not in _source(trainer_cls, method):
            problems.append(f"{cls}.{method} no longer reads self.{attribute} (swapped around it) in {where}")
    for path, (method, (first, last), anchor, ours, _why) in COPIED_PATHS.items():
        if method not in gone and anchor not in _source(trainer_cls, method):
            problems.append(f"the {path} ({ours}) copy TRL's {cls}.{method}, lines {first}-{last} of trl 1.16.0, "
                            f"which no longer has {anchor!r} in {where}: compare and update the copy")
    init_source = _source(trainer_cls, "__init__")
    problems += [f"{cls}.__init__ no longer sets self.{a} (use_vllm) in {where}" for a in VLLM_TRAINER_ATTRIBUTES
                 if init_source and f"self.{a} =" not in init_source]
    tool_discovery = _source(trainer_cls, "_generate_and_score_completions")
    if tool_discovery and 'not member_name.startswith("_")' not in tool_discovery:
        problems.append(f"{cls} may now offer an environment's private methods (_dispatch_call) as tools in {where}")
    declared = {*TRL_ROW_FIGURES, *TRL_GENERATION_FIGURES, TRL_REWARD_METRIC_VARIABLE}
    undeclared = sorted(trl_round_figures(trainer_cls) - declared)
    if undeclared:
        problems.append(f"{cls} logs {undeclared} while it generates, which trl_contract does not classify (per row "
                        f"or of the generation) in {where}: dynamic sampling logs them as generated/<name>")
    missing_step_figures = sorted(set(TRL_STEP_FIGURES) - trl_logged_figures(("_compute_loss",), trainer_cls))
    if missing_step_figures and _source(trainer_cls, "_compute_loss"):
        problems.append(f"{cls}._compute_loss no longer logs {missing_step_figures} (a per-step setting, kept when a "
                        f"micro-batch has no loss token) in {where}")
    for module_name, names in MODULE_FUNCTIONS.items():
        module = importlib.import_module(module_name)
        problems += [f"{module_name}.{n} is gone in {where}" for n in names if not hasattr(module, n)]
    problems += module_constant_violations(where)
    if trl_loss_types() is None:
        problems.append(f"GRPOConfig.loss_type's help no longer lists the supported values in {where}")
    from trl.generation.vllm_generation import VLLMGeneration

    problems += [
        f"VLLMGeneration.{m} is gone in {where}" for m in VLLM_GENERATION_METHODS if not callable(getattr(VLLMGeneration, m, None))
    ]
    # source text: vLLM is absent where the main suite runs
    class_source = "".join(_source(VLLMGeneration, m) for m in ("__init__", "_init_vllm"))
    problems += [
        f"VLLMGeneration no longer sets .{a} in {where}" for a in VLLM_GENERATION_ATTRIBUTES if f"self.{a} =" not in class_source
    ]
    return problems


def module_constant_violations(where: str, constants: dict | None = None) -> list[str]:
    """What of :data:`MODULE_CONSTANTS` (or ``constants``) the installed TRL breaks: a constant gone or no longer an
    integer, or no longer read by its class's ``forward`` and ``backward``."""
    import importlib

    problems = []
    for module_name, (constant, cls_name) in (MODULE_CONSTANTS if constants is None else constants).items():
        module = importlib.import_module(module_name)
        value, cls = getattr(module, constant, None), getattr(module, cls_name, None)
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{module_name}.{constant} is gone or no longer an integer in {where}")
        elif cls is None:
            problems.append(f"{module_name}.{cls_name} is gone in {where}")
        else:
            problems += [f"{module_name}.{cls_name}.{m} no longer reads {constant} (swapped for a training step) in "
                         f"{where}" for m in ("forward", "backward") if constant not in _source(cls, m)]
    return problems


def contract_violations(trainer_cls=None, trainer=None) -> list[str]:
    """What of the contract above the installed TRL breaks (empty when it holds).

    ``trainer_cls`` defaults to ``trl.GRPOTrainer``; pass a built ``trainer`` to check the instance attributes too.
    """
    import trl

    if trainer_cls is None:
        trainer_cls = trl.GRPOTrainer
    where = f"trl {trl.__version__} (trl-rlvr is tested with trl{TESTED_TRL})"
    problems = list(_cached_class_violations(trainer_cls, where))
    if trainer is not None:
        problems += [f"GRPOTrainer instances no longer have .{a} in {where}" for a in READ_ATTRIBUTES if not hasattr(trainer, a)]
    return problems


@functools.cache
def _cached_class_violations(trainer_cls, where: str) -> tuple[str, ...]:
    return tuple(_class_violations(trainer_cls, where))


def warn_on_contract_violations(trainer) -> list[str]:
    """At trainer construction: one warning naming every piece of the contract the installed TRL breaks (the class
    checked once per process, the instance's attributes each time); returns the problems."""
    import warnings

    from trl import GRPOTrainer

    problems = contract_violations(GRPOTrainer, trainer)
    if problems and tuple(problems) not in _warned:
        _warned.add(tuple(problems))
        warnings.warn(
            "RLVRTrainer: the installed TRL differs from the one trl-rlvr was tested with (run `pytest -m "
            "trl_contract`; trl_rlvr/_compat/trl_contract.py says what each piece is for):\n  " + "\n  ".join(problems),
            RuntimeWarning, stacklevel=3,
        )
    return problems


_warned: set[tuple[str, ...]] = set()


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
