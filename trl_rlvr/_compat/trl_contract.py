"""Everything private of TRL (and of transformers and vLLM) that trl-rlvr relies on, named once, by the adapter method
that relies on it.

TRL is a moving target: its GRPO trainer changes shape between minor releases. ``pyproject.toml`` pins TRL to the
range the tests prove (:data:`TESTED_TRL`). Every private touch lives in one adapter,
:class:`trl_rlvr._compat.grpo_adapter.GRPOAdapter` (and the CPU shims beside it); :data:`ADAPTER` says, for each of
its methods, which private TRL method it overrides (with the parameters it passes), which private names it reads,
calls or swaps (:data:`SWAPS`) and in which TRL method they must still be used, and which public hook replaces it the day TRL
calls that hook (docs/trainer.md, "Upstreaming"). After upgrading TRL, run the upgrade drill::

    pytest -m trl_contract

It is behavior first: the tests marked ``trl_contract`` train ``RLVRTrainer`` and ``GRPOTrainer`` on a tiny model
and compare gradients with independent references written from the papers' formulas. :func:`contract_violations`
adds a readable list of what moved, each line starting with the adapter method to change ("change
GRPOAdapter._tool_call_loop: ...").

Also declared here: TRL code re-implemented (:data:`COPIED_PATHS`, with the line ranges it copies), the module
constant and helpers used (:data:`MODULE_CONSTANTS`, :data:`MODULE_FUNCTIONS`), what :mod:`.vllm_cpu` uses of TRL's
``VLLMGeneration`` and vLLM, what :mod:`.vllm_server` replaces of TRL's server-mode client
(:data:`VLLM_SERVER_CLIENT`), the order of transformers' optimizer step that an empty update relies on
(:data:`OPTIMIZER_STEP_ORDER`), the environment protocol's private methods (:data:`ENVIRONMENT_PROTOCOL`), the
run-time swaps left, each with the hook that retires it (:data:`SWAPS`), what the audit's child run calls
(:data:`AUDIT`). The asynchronous trainer's (``trl.experimental.async_grpo``) pieces are a table of their own,
:data:`ASYNC_ADAPTER`, checked by :func:`async_contract_violations`. The metric names TRL
logs, by what they describe, are :mod:`trl_rlvr.sampling.trained_metrics`'s, checked against TRL's source here.
:func:`warn_on_contract_violations` runs the check when ``RLVRTrainer`` is built (the class part once per process, a
few milliseconds) and warns once, naming each piece that moved.
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass, field

#: The TRL versions the test suite proves (keep equal to the pin in pyproject.toml). The ``vllm`` extra follows the
#: range that TRL declares (:func:`trl_vllm_requirement`).
TESTED_TRL = ">=1.16,<1.17"


#: The private attributes of ADAPTER's ``uses`` that GRPOTrainer sets at construction (checked on a built trainer).
INSTANCE_ATTRIBUTES = ("_logs", "_metrics", "_tokenizer", "_pending_metrics", "_buffered_inputs")


@dataclass(frozen=True)
class Touch:
    """What one adapter method relies on: the private method it overrides (calling ``super()``) or calls, and the
    parameters it passes (``overrides`` / ``calls``, ``params``); the private names it reads or swaps (``uses``) and
    the TRL methods whose source must still use each of them (``used_in``); why no public API does it; the public
    hook that replaces it the day TRL calls that hook."""

    why: str
    overrides: str | None = None
    calls: str | None = None
    params: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()
    used_in: tuple[str, ...] = ()
    hook: str = ""


#: GRPOAdapter's methods (and its module functions) -> what each relies on of GRPOTrainer / transformers' Trainer.
ADAPTER = {
    "_generate_and_score_completions": Touch(
        "TRL's training loop asks it for a generation batch: the round driver's rows, their table entries",
        overrides="_generate_and_score_completions", params=("inputs",), uses=("_logs",),
        hook="filter_generation_batch (a row filter with refill) and compute_advantages"),
    "_score_round": Touch(
        "one round of TRL's own generation and scoring; its table entries held back (_logs swapped for a fresh "
        "table) until the trained rows are known; beta=0 when rows may be dropped (no reference log-probs for them)",
        uses=("_logs", "beta"), used_in=("_generate_and_score_completions",),
        hook="filter_generation_batch"),
    "_generate": Touch(
        "its third result, the tool mask, is the only place TRL exposes which tokens a tool wrote; before it, a "
        "colocated vLLM engine on a CPU is synced through vLLM's reload path (sync_vllm_weights_once_per_step), "
        "where TRL's sync fails",
        overrides="_generate", params=("prompts",),
        hook="tool_mask passed to the reward functions; VLLMGeneration syncing a CPU engine itself"),
    "_tool_call_loop": Touch(
        "the batch's tool loop, the first point where its rollouts' messages (completions) exist: the batch's "
        "environments join its tool turns for the loop (ENVIRONMENT_PROTOCOL), so each turn's calls go out together "
        "(trl_rlvr.rollouts.tool_turn)",
        overrides="_tool_call_loop", params=("prompts", "prompt_ids", "completion_ids", "completions", "logprobs"),
        hook="GRPOConfig.tool_calls_concurrent"),
    "_calculate_rewards": Touch(
        "between TRL's gathered rewards and its advantages: the trainer's transform_rewards, the round's lengths; "
        "the log_metric counters of the round (_pending_metrics)",
        overrides="_calculate_rewards", params=("inputs", "prompts", "completions", "completion_ids_list"),
        uses=("_pending_metrics",), used_in=("_generate_and_score_completions",),
        hook="transform_rewards and tool_mask passed to the reward functions"),
    "_prepare_inputs": Touch(
        "the one place the shuffled micro-batches of a generation batch exist together (_buffered_inputs): each gets "
        "its optimizer step's exact token count (DAPO)",
        overrides="_prepare_inputs", params=("generation_batch",), uses=("_buffered_inputs",),
        used_in=("_prepare_inputs",), hook="optimizer_step_token_counts"),
    "completion_logps": Touch(
        "TRL's scorer, for the kept rows' reference log-probs and the policy-shift metrics' second look",
        calls="_get_per_token_logps_and_entropies", params=("model", "input_ids", "attention_mask", "logits_to_keep")),
    "_get_per_token_logps_and_entropies": Touch(
        "the log-probs TRL's loss computes (rlvr/shift_*), observed within observing_loss_logprobs as the scorer "
        "returns them; TRL has no hook between its forward and its loss, a second forward would cost as much again",
        overrides="_get_per_token_logps_and_entropies", params=("model", "input_ids", "attention_mask", "logits_to_keep"),
        uses=("_get_per_token_logps_and_entropies",), used_in=("_compute_loss",),
        hook="the loss's per-token log-probs passed to compute_loss's callers (e.g. in its outputs)"),
    "metrics_to_log": Touch(
        "where rlvr/ metrics go (TRL's _metrics[mode]); the round driver holds back what dynamic sampling's rounds "
        "append there until the trained rows are known",
        uses=("_metrics",), used_in=("_generate_and_score_completions", "log")),
    "_pad_token_id": Touch("the pad id of gathered rows (TRL's _tokenizer)", uses=("_tokenizer",)),
    "training_step": Touch(
        "TRL's fused LM head in tiles sized for a CPU (MODULE_CONSTANTS), around the step's forward and backward",
        overrides="training_step", params=("model", "inputs", "num_items_in_batch")),
    "_save_checkpoint": Touch(
        "the prompt stream's position written before the model, optimizer and trainer state; on_save runs after "
        "trainer_state.json, too late (the folder: _get_output_dir)", overrides="_save_checkpoint",
        params=("model", "trial"), hook="a Trainer callback before the checkpoint's files"),
    "_save_rng_state": Touch(
        "the last per-process file of a checkpoint: a barrier after it, before process 0 writes trainer_state.json",
        overrides="_save_rng_state", params=("output_dir",)),
    "is_new_best_metric": Touch(
        "SampledEvalCallback's metrics to transformers' best-model selection", calls="_determine_best_metric",
        params=("metrics", "trial")),
    "sync_vllm_weights_once_per_step": Touch(
        "a colocated vLLM engine synced as TRL syncs it, once per step (through vLLM's reload path on a CPU): for "
        "the evaluation, and before TRL generates (_generate); TRL then finds the step synced",
        uses=("_last_loaded_step",), used_in=("_generate_single_turn",)),
}

#: Public methods of TRL's trainer that RLVRTrainer overrides (listed so that a renamed parameter is seen).
PUBLIC_OVERRIDES = {
    "compute_loss": ("model", "inputs", "return_outputs", "num_items_in_batch"),
    "log": ("logs", "start_time"),
    "train": ("resume_from_checkpoint", "trial", "ignore_keys_for_eval"),
}

#: TRL code paths re-implemented here -> (TRL function, its line range in trl 1.16.0's trl/trainer/grpo_trainer.py,
#: a line of it that must still be there, where ours lives, why it is not called).
COPIED_PATHS = {
    "reference log-probs": ("_generate_and_score_completions", (2709, 2739),
        "# Compute the per-token log probabilities for the reference model", "GRPOAdapter._reference_logps",
        "TRL computes them for every generated row or none (beta); dynamic sampling wants the kept rows only"),
    "length metrics": ("_generate", (2295, 2310), "# Log completion lengths, mean, min, max",
        "trl_rlvr.sampling.trained_metrics.trained_metrics",
        "TRL's metrics of every generated row, evaluated on the rows dynamic sampling trains on"),
    "reward metrics": ("_generate_and_score_completions", (2820, 2830),
        "# Calculate mean reward per function, but only for samples where the function was applied",
        "trl_rlvr.sampling.trained_metrics.trained_metrics", "as the length metrics"),
    "evaluation tool loop": ("_tool_call_loop", (1945, 2191),
        "# Tool execution loop: execute tools, then regenerate completions with tool results appended to the prompt",
        "trl_rlvr.evaluation.tool_rollouts",
        "the evaluation's rollouts are seeded per sample and run without a GRPOTrainer (HF generate or vLLM)"),
    "tool reply header": ("_get_tool_suffix_ids", (1893, 1943),
        "# Use the real tool name instead of a dummy", "trl_rlvr.evaluation.tool_rollouts",
        "as the evaluation tool loop"),
}

#: Module-level helpers imported from TRL.
MODULE_FUNCTIONS = {"trl.trainer.utils": ("use_adapter", "nanstd"),  # nanstd: TRL's metrics of the trained rows
                    # `trl vllm-serve`'s parser and command, which trl_rlvr.scripts.vllm_serve extends
                    "trl.scripts.vllm_serve": ("build_command", "make_parser")}

#: Module constants of TRL swapped for one training step -> (constant, the class whose methods must read it as a
#: module global for the swap to mean anything). ``TOKEN_CHUNK_SIZE``: the token tile of TRL's fused LM head, read
#: by its forward and its backward (trl_rlvr._compat.logprob_tiles; guarded by tests/_compat/test_cpu_logprob_tiles.py).
MODULE_CONSTANTS = {"trl.kernels.chunked_logprob": ("TOKEN_CHUNK_SIZE", "ChunkedLogProbFunction")}

#: transformers' optimizer step, in the order trl_rlvr.sampling.empty_updates.SkipEmptyUpdatesCallback relies on
#: (in ``Trainer._run_epoch``'s source): an empty update's gradients are dropped at on_pre_optimizer_step,
#: before the optimizer steps, and the scheduler's state put back at on_step_end, after it steps. Guarded by
#: test_an_empty_update_leaves_the_optimizer_and_the_weights_alone.
OPTIMIZER_STEP_ORDER = ("on_pre_optimizer_step(", "self.optimizer.step()", "self.lr_scheduler.step()", "on_step_end(")

#: The environment protocol's private methods that trl_rlvr.rollouts.tool_turn calls (where an environment has
#: them) -> their parameters: ``_join_tool_turns(turns)`` for the batch's tool loop (the environment's tools then
#: send the turn's calls ahead first), ``_dispatch_call(name, arguments)`` to send one call ahead. Private on
#: purpose: TRL offers every public method of an environment to the model as a tool (its discovery skips names with
#: a leading underscore, checked in its source), and the model must not call these.
ENVIRONMENT_PROTOCOL = {"_join_tool_turns": ("turns",), "_dispatch_call": ("name", "arguments")}

#: The run-time swaps left: state of TRL that the adapter replaces for one call and puts back however the call ends
#: (trl_rlvr._compat.swaps.swapped), by the attribute swapped -> (the adapter method or module that swaps it, why,
#: the hook that retires it). tests/_compat/test_trl_contract.py holds the code to this list (no other swap; no
#: TRL, transformers or torch method replaced on an instance) and the list to at most 4.
SWAPS = {
    "beta": ("GRPOAdapter._score_round", "a round whose rows dynamic sampling may drop is generated without "
             "reference log-probs (TRL computes them for every row or none); the kept rows' follow",
             "filter_generation_batch (TRL would compute them after the filter)"),
    "_logs": ("GRPOAdapter._score_round", "TRL's completions table holds generation_batch_size rows (deques): a "
              "round's entries go to a fresh table until the trained rows are known (k rounds would evict their own)",
              "filter_generation_batch (TRL would log the rows it trains on)"),
    "TOKEN_CHUNK_SIZE": ("GRPOAdapter.training_step (trl_rlvr._compat.logprob_tiles)", "TRL's fused LM head in "
                         "token tiles sized for a CPU, for a training step's forward and backward",
                         "a token tile size argument of TRL's fused log-prob head (or a CPU default)"),
    "VLLMClient": ("GRPOAdapter.__init__ (trl_rlvr._compat.vllm_server)", "server mode with a trainer on a CPU: "
                   "VLLMGeneration builds its client from the module global while GRPOTrainer.__init__ runs, and "
                   "TRL's client's NCCL weight transfer needs CUDA; the subclass pushes through a file",
                   "a client class (or weight-transfer backend) argument of VLLMGeneration / GRPOConfig"),
}

#: What trl_rlvr._compat.vllm_cpu uses of TRL's VLLMGeneration (methods it calls; attributes it reads), and of
#: vLLM's CPU model runner (checked where vLLM is installed).
VLLM_GENERATION_METHODS = ("sync_weights", "_iter_named_params", "generate")
VLLM_GENERATION_ATTRIBUTES = ("llm", "mode", "enable_sleep_mode")
VLLM_RUNNER_RELOAD = ("reload_weights", ("weights_iterator", "is_checkpoint_format"))

#: TRL's server-mode client where the trainer has no CUDA device (trl_rlvr._compat.vllm_server): the module global
#: ``VLLMGeneration._init_vllm`` builds its client from (swapped for a subclass while GRPOTrainer.__init__ runs), and
#: the client methods the subclass overrides -> their parameters (TRL calls both; on CUDA they call TRL's own).
VLLM_SERVER_CLIENT = ("trl.generation.vllm_generation", "VLLMClient")
VLLM_CLIENT_OVERRIDES = {"init_communicator": ("device",), "update_named_params": ("metadata", "named_params")}

#: What the audit's child run (trl_rlvr/audit/_child.py, its PRIVATE_NAMES) relies on to run a real training step
#: over the corpus's completions -> where it must be: TRL's completions table (read for the step's scores), TRL's
#: generation calling the policy's ``generate`` (the completions handed in), the order TRL's sampler draws the train
#: dataset's rows in (the corpus's rows placed there), TRL's fused LM head (computed by the tiny model over the
#: batch's own tokens).
AUDIT = {"_logs": "GRPOTrainer.__init__", "_generate_single_turn": "GRPOTrainer",
         "_get_train_sampler": "GRPOTrainer", "add_fused_lm_head": "trl.trainer.utils"}


def trl_round_metrics(trainer_cls=None) -> set[str]:
    """The metric names the installed TRL logs in ``_generate`` and ``_generate_and_score_completions``."""
    return trl_logged_metrics(("_generate", "_generate_and_score_completions"), trainer_cls)


def trl_logged_metrics(methods: tuple[str, ...], trainer_cls=None) -> set[str]:
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


def _signature_problem(cls, name: str, params: tuple[str, ...], where: str) -> str | None:
    method = getattr(cls, name, None)
    if not callable(method):
        return f"{cls.__name__}.{name} is gone in {where}"
    have = list(inspect.signature(method).parameters)[1:]
    missing = [p for p in params if p not in have]
    return f"{cls.__name__}.{name}{tuple(have)} lacks parameter(s) {missing} in {where}" if missing else None


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


def _touch_problems(trainer_cls, method: str, touch: Touch, where: str) -> list[str]:
    """What of one adapter method's :class:`Touch` the class ``trainer_cls`` breaks, without the "change" prefix."""
    cls, problems = trainer_cls.__name__, []
    if touch.overrides or touch.calls:
        problems.append(_signature_problem(trainer_cls, touch.overrides or touch.calls, touch.params, where))
    for used_in in touch.used_in:
        source = _source(trainer_cls, used_in)
        if not source:
            problems.append(f"{cls}.{used_in} is gone in {where}")
            continue
        problems += [f"{cls}.{used_in} no longer uses self.{name} in {where}" for name in touch.uses
                     if f"self.{name}" not in source]
    return [p for p in problems if p]


def _metric_problems(trainer_cls, where: str) -> list[str]:
    """TRL's metric names, by what they describe (trl_rlvr.sampling.trained_metrics), against what its source logs."""
    from trl_rlvr.sampling import trained_metrics as metrics

    cls, problems = trainer_cls.__name__, []
    declared = {*metrics.TRAINED_ROW_METRICS, *metrics.GENERATION_METRICS, metrics.REWARD_METRIC_VARIABLE}
    undeclared = sorted(trl_round_metrics(trainer_cls) - declared)
    if undeclared:
        problems.append(f"change trl_rlvr/sampling/trained_metrics.py: {cls} logs {undeclared} while it generates, which it "
                        f"does not classify (per row or of the generation) in {where}: dynamic sampling logs them as "
                        "generated/<name>")
    missing = sorted(set(metrics.STEP_METRICS) - trl_logged_metrics(("_compute_loss",), trainer_cls))
    if missing and _source(trainer_cls, "_compute_loss"):
        problems.append(f"change trl_rlvr/sampling/trained_metrics.py: {cls}._compute_loss no longer logs {missing} (a "
                        f"per-step setting, kept when a micro-batch has no loss token) in {where}")
    return problems


def _class_violations(trainer_cls, where: str) -> list[str]:
    """What of the contract the class ``trainer_cls`` (TRL's GRPOTrainer or a stand-in) breaks, each line naming the
    adapter method (or module) to change."""
    import importlib

    cls, problems = trainer_cls.__name__, []
    for method, touch in ADAPTER.items():
        problems += [f"change GRPOAdapter.{method}: {p}" for p in _touch_problems(trainer_cls, method, touch, where)]
    problems += [f"change RLVRTrainer.{name}: {p}" for name, params in PUBLIC_OVERRIDES.items()
                 if (p := _signature_problem(trainer_cls, name, params, where))]
    for path, (method, (first, last), anchor, ours, _why) in COPIED_PATHS.items():
        source = _source(trainer_cls, method)
        if source and anchor not in source:
            problems.append(f"change {ours}: the {path} copy TRL's {cls}.{method}, lines {first}-{last} of trl "
                            f"1.16.0, which no longer has {anchor!r} in {where}: compare and update the copy")
    tool_discovery = _source(trainer_cls, "_generate_and_score_completions")
    if tool_discovery and 'not member_name.startswith("_")' not in tool_discovery:
        problems.append(f"change trl_rlvr.rollouts.tool_turn: {cls} may now offer an environment's private methods "
                        f"({', '.join(ENVIRONMENT_PROTOCOL)}) as tools in {where}")
    problems += _metric_problems(trainer_cls, where)
    for module_name, names in MODULE_FUNCTIONS.items():
        module = importlib.import_module(module_name)
        problems += [f"{module_name}.{n} is gone in {where}" for n in names if not hasattr(module, n)]
    problems += module_constant_violations(where) + optimizer_step_order_violations(where)
    if trl_loss_types() is None:
        problems.append(f"change trl_rlvr.config: GRPOConfig.loss_type's help no longer lists the supported values "
                        f"in {where}")
    return problems + _vllm_generation_violations(where) + _audit_violations(trainer_cls, where)


def _audit_violations(trainer_cls, where: str) -> list[str]:
    import importlib

    problems = []
    for name, home in AUDIT.items():
        if home == "GRPOTrainer.__init__":
            present = f"self.{name} =" in _source(trainer_cls, "__init__")
        elif home in ("GRPOTrainer", "Trainer"):
            present = callable(getattr(trainer_cls, name, None))
        else:
            present = hasattr(importlib.import_module(home), name)
        if not present:
            problems.append(f"change trl_rlvr/audit/_child.py: {home}.{name} is gone in {where}")
    return problems


def _vllm_generation_violations(where: str) -> list[str]:
    from trl.generation.vllm_generation import VLLMGeneration

    problems = [f"change trl_rlvr._compat.vllm_cpu: VLLMGeneration.{m} is gone in {where}"
                for m in VLLM_GENERATION_METHODS if not callable(getattr(VLLMGeneration, m, None))]
    # source text: vLLM is absent where the main suite runs
    class_source = "".join(_source(VLLMGeneration, m) for m in ("__init__", "_init_vllm"))
    problems += [f"change trl_rlvr._compat.vllm_cpu: VLLMGeneration no longer sets .{a} in {where}"
                 for a in VLLM_GENERATION_ATTRIBUTES if f"self.{a} =" not in class_source]
    return problems + _vllm_server_client_violations(VLLMGeneration, where)


def _vllm_server_client_violations(generation_cls, where: str) -> list[str]:
    """What of :data:`VLLM_SERVER_CLIENT` and :data:`VLLM_CLIENT_OVERRIDES` the installed TRL breaks: the client
    no longer built from the module global, its overridden methods gone, renamed or no longer called."""
    import importlib

    module_name, name = VLLM_SERVER_CLIENT
    client_cls = getattr(importlib.import_module(module_name), name, None)
    if client_cls is None:
        return [f"change trl_rlvr._compat.vllm_server: {module_name}.{name} is gone in {where}"]
    problems = [f"change trl_rlvr._compat.vllm_server: {p}" for method, params in VLLM_CLIENT_OVERRIDES.items()
                if (p := _signature_problem(client_cls, method, params, where))]
    calls = {"_init_vllm": (f"{name}(", "init_communicator("), "sync_weights": ("update_named_params(",)}
    return problems + [f"change trl_rlvr._compat.vllm_server: VLLMGeneration.{method} no longer calls {call[:-1]} "
                       f"in {where}" for method, needed in calls.items() for call in needed
                       if call not in _source(generation_cls, method)]


def module_constant_violations(where: str, constants: dict | None = None) -> list[str]:
    """What of :data:`MODULE_CONSTANTS` (or ``constants``) the installed TRL breaks: a constant gone or no longer an
    integer, or no longer read by its class's ``forward`` and ``backward``."""
    import importlib

    problems = []
    for module_name, (constant, cls_name) in (MODULE_CONSTANTS if constants is None else constants).items():
        module = importlib.import_module(module_name)
        value, cls = getattr(module, constant, None), getattr(module, cls_name, None)
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"change GRPOAdapter.training_step: {module_name}.{constant} is gone or no longer an "
                            f"integer in {where}")
        elif cls is None:
            problems.append(f"change GRPOAdapter.training_step: {module_name}.{cls_name} is gone in {where}")
        else:
            problems += [f"change GRPOAdapter.training_step: {module_name}.{cls_name}.{m} no longer reads {constant} "
                         f"(swapped for a training step) in {where}" for m in ("forward", "backward")
                         if constant not in _source(cls, m)]
    return problems


def optimizer_step_order_violations(where: str, order: tuple[str, ...] | None = None) -> list[str]:
    """What of :data:`OPTIMIZER_STEP_ORDER` (or ``order``) transformers' training loop no longer has, in order."""
    from transformers import Trainer

    source, at = _source(Trainer, "_run_epoch"), 0
    for step in OPTIMIZER_STEP_ORDER if order is None else order:
        found = source.find(step, at)
        if found < 0:
            return [f"change trl_rlvr.sampling.empty_updates: transformers' Trainer._run_epoch no longer "
                    f"has {step!r} after the steps before it ({' -> '.join(OPTIMIZER_STEP_ORDER)}) in {where}"]
        at = found + len(step)
    return []


def contract_violations(trainer_cls=None, trainer=None) -> list[str]:
    """What of the contract above the installed TRL breaks (empty when it holds).

    ``trainer_cls`` defaults to ``trl.GRPOTrainer``; pass a built ``trainer`` to check the instance attributes too.
    """
    import trl

    if trainer_cls is None:
        trainer_cls = trl.GRPOTrainer
    where = f"trl {trl.__version__} (trl-rlvr is tested with trl{TESTED_TRL})"
    problems = list(_cached_class_violations(trainer_cls, where))
    if trainer is not None:  # the private attributes TRL sets at construction (those set while it generates excepted)
        problems += [f"change GRPOAdapter.{method}: GRPOTrainer instances no longer have .{name} in {where}"
                     for method, touch in ADAPTER.items() for name in touch.uses
                     if name in INSTANCE_ATTRIBUTES and not hasattr(trainer, name)]
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
    """What trl_rlvr._compat.vllm_cpu relies on of the installed vLLM: its CPU model runner's reload path; for server
    mode, worker extensions (``--worker-extension-cls``) and the dev-mode ``/collective_rpc`` endpoint."""
    import importlib.util

    import vllm
    from vllm.config import ParallelConfig
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    problems = []
    name, params = VLLM_RUNNER_RELOAD
    method = getattr(CPUModelRunner, name, None)
    if not callable(method):
        problems.append(f"vLLM {vllm.__version__}: the model runner has no {name}()")
    elif missing := [p for p in params if p not in inspect.signature(method).parameters]:
        problems.append(f"vLLM {vllm.__version__}: {name}() lacks {missing}")
    if "worker_extension_cls" not in getattr(ParallelConfig, "__dataclass_fields__", {}):
        problems.append(f"vLLM {vllm.__version__}: no worker_extension_cls (trl_rlvr.scripts.vllm_serve's extension)")
    if importlib.util.find_spec("vllm.entrypoints.serve.dev.rpc.api_router") is None:
        problems.append(f"vLLM {vllm.__version__}: no dev-mode /collective_rpc router (the file weight push)")
    return problems


# -- the asynchronous trainer (trl.experimental.async_grpo) ---------------------------------------------------------

@dataclass(frozen=True)
class AsyncTouch:
    """What one piece of :mod:`trl_rlvr._compat.async_adapter` (or of ``RLVRAsyncTrainer``) relies on of TRL's
    asynchronous trainer. ``owner``: the TRL class or module it reaches into, under ``trl.experimental.async_grpo``
    (``"async_rollout_worker._AsyncRolloutLoop"``, ``"async_grpo_trainer"``; ``"transformers"`` for transformers'
    own). ``signatures``: the owner's methods (or classes, functions) it overrides, calls or builds -> the parameters
    they must take. ``uses``: the names it reads, sets or swaps -> the owner's methods whose source must still use
    each (none: the name must exist). A ``"Class.name"`` is a class of the owner's module; a key that is no name
    (``'"advantages"'``, a key of the packed batch) is text that the methods' source must hold. ``stands_in_for``: the
    owner's function or class the piece replaces; it must take each of its parameters."""

    owner: str
    why: str
    signatures: dict[str, tuple[str, ...]] = field(default_factory=dict)
    uses: dict[str, tuple[str, ...]] = field(default_factory=dict)
    stands_in_for: str = ""


def _read_in(methods: tuple[str, ...], *names: str) -> dict[str, tuple[str, ...]]:
    return dict.fromkeys(names, methods)


def _keys(*keys: str) -> tuple[str, ...]:
    return tuple(f'"{key}"' for key in keys)


_LOOP, _WORKER = "async_rollout_worker._AsyncRolloutLoop", "async_rollout_worker.AsyncRolloutWorker"
_TRAINER = "async_grpo_trainer.AsyncGRPOTrainer"
#: The keys of the packed batch (and the forward's arguments) that ``AsyncGRPOTrainer.compute_loss`` reads.
PACKED_BATCH_KEYS = _keys("attention_mask", "token_index", "input_ids", "position_ids", "shift_labels",
                          "old_log_probs", "advantages", "segment_id", "tree_kv_index", "tree_cu_seqlens_q",
                          "tree_cu_seqlens_k", "tree_max_seqlens")
#: The per-step counts ``compute_loss`` accumulates and ``_log_step_metrics`` flushes.
STEP_ACCOUNTING = ("_step_forward_tokens", "_step_trained_tokens", "_step_seq_len_weighted", "_step_samples",
                   "_step_forward_s")

#: The pieces of trl_rlvr/_compat/async_adapter.py and trl_rlvr/async_grpo/async_trainer.py -> what each relies on of
#: TRL 1.16's asynchronous trainer (checked by :func:`async_contract_violations`; not counted in the synchronous
#: contract's size).
ASYNC_ADAPTER = {
    "async_adapter.RLVRRolloutLoop._repeat_iterator": AsyncTouch(
        _LOOP, "the prompts the rollout process generates, (group_id, row) per generation: with rlvr_stream, the stream "
        "from a StreamStart (the group id its position) in TRL's order, the dataset pass after pass",
        signatures={"_repeat_iterator": ()},
        uses={"_repeat_iterator": ("_generate_loop",),
              **_read_in(("__init__", "_repeat_iterator"), "dataset", "num_generations")}),
    "async_adapter.RLVRRolloutLoop._score_group": AsyncTouch(
        _LOOP, "the rollout process scores a group there: TRL's rewards, then the RLVR advantages on the rows it "
        "returns (rescore_rows, the reward columns in reward_func_names' order); the plugins' log_metric through the "
        "group's reward_kwargs, their counters and the RLVR metrics pushed to the trainer (_push_metrics)",
        signatures={"_score_group": ("group",), "_push_metrics": ("values",)},
        uses={"_score_group": ("_score_loop",), "reward_func_names": ("__init__", "_score_group"),
              **_read_in(("_score_group",), "RolloutGroup.reward_kwargs", "RolloutGroup.completions_sequences"),
              "RolloutGroup.group_id": (), "RolloutGroup.model_version": ()}),
    "async_adapter.answer_facts": AsyncTouch(
        _LOOP, "each answer's completion tokens, truncation (no stop token at its end) and tool calls",
        uses={**_read_in(("__init__",), "eos_token_ids", "tools"), "RolloutGroup.completions_ids": (),
              "RolloutGroup.tool_call_counts": ()}),
    "async_adapter.dropped_group_marker": AsyncTouch(
        "async_rollout_worker", "the notice of a group that leaves no row, queued as a RolloutSample (AdmittingQueue "
        "settles it, never trains it)",
        signatures={"RolloutSample": ("prompt", "completion", "input_ids", "completion_mask", "old_log_probs",
                                      "advantage", "model_version", "group_id", "metrics")}),
    "async_adapter.use_rlvr_scoring": AsyncTouch(
        _WORKER, "what TRL's worker spawns, read when it starts: the loop class (RLVRRolloutLoop) and its keyword "
        "arguments (rlvr_scoring); a worker already started (_process) is left as it is",
        uses={"_loop_cls": ("start",), **_read_in(("__init__", "start"), "_loop_kwargs", "_process")}),
    "async_adapter.set_stream_start": AsyncTouch(
        _WORKER, "the prompt stream's start, a keyword argument of the loop the worker spawns",
        uses={"_loop_cls": (), **_read_in(("start",), "_loop_kwargs", "_process")}),
    "async_adapter.cpu_constructible": AsyncTouch(
        "async_grpo_trainer", "without CUDA, while the trainer is built: the module globals its constructor calls, "
        "the peak-FLOPs lookup (a CUDA device name) answering NaN and FileWeightTransfer built in place of the NCCL "
        "weight sync, with the same arguments (the manifest's names, dtype names, shapes)",
        uses=_read_in(("AsyncGRPOTrainer.__init__",), "get_peak_flops_per_device", "WeightTransferClient",
                      *_keys("names", "dtype_names", "shapes"))),
    "async_adapter.FileWeightTransfer": AsyncTouch(
        "async_grpo_trainer", "TRL's weight sync for a trainer without CUDA, built as TRL builds WeightTransferClient",
        stands_in_for="WeightTransferClient"),
    "async_adapter.use_cpu_tree_attention": AsyncTouch(
        "async_grpo_trainer", "the attention TRL builds its model with (FlashAttention-3 from the Hub, registered when "
        "the trainer is built) registered again under its name, in plain PyTorch, without CUDA",
        uses=_read_in(("AsyncGRPOTrainer.__init__",), "TREE_ATTENTION", "register_tree_attention")),
    "async_adapter.cpu_tree_attention": AsyncTouch(
        "packing", "TRL's tree attention without FlashAttention, called as TRL's is",
        uses={"TREE_ATTENTION": ("register_tree_attention",)}, stands_in_for="tree_attention"),
    "async_adapter.plain_attention": AsyncTouch(
        "transformers", "the attention the trainer's model was built with (TRL's tree attention reads its packed "
        "rows) set aside for a plain forward or generate(), and put back",
        signatures={"PreTrainedModel.set_attn_implementation": ("attn_implementation",)},
        uses={"PretrainedConfig._attn_implementation": ()}),
    "async_adapter.packed_forward": AsyncTouch(
        _TRAINER, "compute_loss's forward of a packed micro-batch, the same steps (the loss after it is ours): the "
        "packed batch's keys, the fused LM head, the forward's time",
        uses=_read_in(("compute_loss",), *PACKED_BATCH_KEYS, "fused_lm_head", "aux_loss_enabled",
                      "_last_forward_time_s")),
    "async_adapter.record_step_accounting": AsyncTouch(
        _TRAINER, "the per-step counts compute_loss accumulates for TRL's step metrics, the same arithmetic",
        uses={**_read_in(("compute_loss",), *_keys("global_n_forward_tokens", "mean_seq_len", "global_n_tokens"),
                         "_last_forward_time_s"),
              **_read_in(("compute_loss", "_log_step_metrics"), *STEP_ACCOUNTING)}),
    "async_adapter.admit_groups_whole": AsyncTouch(
        _TRAINER, "the trainer's RolloutQueueDataset (rank 0) reads its queue through AdmittingQueue (get(timeout=), "
        "qsize()); its own per-row staleness check stays",
        uses={"_rollout_dataset": ("__init__", "get_train_dataloader"),
              **_read_in(("RolloutQueueDataset.__init__", "RolloutQueueDataset.__iter__"), "RolloutQueueDataset.queue",
                         "RolloutQueueDataset.model_version_fn"),
              **_read_in(("RolloutQueueDataset.__iter__",), "self.queue.get(timeout=", "self.queue.qsize()")}),
    "async_adapter.carry_row_versions": AsyncTouch(
        "async_grpo_trainer", "the dataloader's collate function (DataCollatorForRollout) wrapped: each row's "
        "model_version taken out of its sample's metrics (the one field RolloutQueueDataset passes on to the collator, "
        "which only logs it) into the packed batch",
        uses={"DataCollatorForRollout": ("AsyncGRPOTrainer.get_train_dataloader",),
              "TreeRow.samples": ("DataCollatorForRollout.torch_call",),
              '"metrics"': ("RolloutQueueDataset.__iter__", "DataCollatorForRollout._log_metrics")}),
    "async_adapter.record_collated_groups": AsyncTouch(
        "async_grpo_trainer", "the collate function wrapped: each micro-batch's group ids recorded as it is collated",
        uses={"DataCollatorForRollout": ("AsyncGRPOTrainer.get_train_dataloader",),
              "TreeRow.samples": ("DataCollatorForRollout.torch_call",),
              '"group_id"': ("RolloutQueueDataset.__iter__", "DataCollatorForRollout.torch_call")}),
    "async_adapter.restore_epoch_count": AsyncTouch(
        _TRAINER, "TRL's epoch stop counts the groups trained before a resume (set from TRL's own record in "
        "_inner_training_loop, before on_train_begin)",
        uses={"_groups_before_resume": ("__init__", "_inner_training_loop", "_EpochStopCallback.on_step_end")}),
    "async_trainer.RLVRAsyncTrainer.__init__": AsyncTouch(
        _TRAINER, "TRL's constructor, its arguments passed by name",
        signatures={"__init__": ("model", "reward_funcs", "args", "train_dataset", "processing_class", "callbacks",
                                 "optimizers", "peft_config", "tools", "environment_factory", "rollout_worker",
                                 "weight_transfer")}),
    "async_trainer.RLVRAsyncTrainer._tag_names": AsyncTouch(
        _TRAINER, "the model card's tags, TRL's and trl-rlvr's", uses={"_tag_names": ()}),
    "async_trainer.RLVRAsyncTrainer.compute_loss": AsyncTouch(
        _TRAINER, "the RLVR token loss after TRL's packed forward; its metrics go where TRL's loss logs its own",
        signatures={"compute_loss": ("model", "inputs", "return_outputs", "num_items_in_batch")},
        uses=_read_in(("compute_loss",), "_metrics", "epsilon_low", "epsilon_high", "router_aux_loss_coef",
                      "current_gradient_accumulation_steps")),
    "async_trainer.RLVRAsyncTrainer.log": AsyncTouch(
        _TRAINER, "the RLVR counters appended to TRL's metrics before TRL reduces them into the logs",
        signatures={"log": ("logs", "start_time")}, uses={"_metrics": ("log",)}),
    "async_trainer.RLVRAsyncTrainer.get_train_dataloader": AsyncTouch(
        _TRAINER, "TRL's dataloader, then the admission and the collate wrappers", signatures={"get_train_dataloader": ()}),
    "async_trainer.RLVRAsyncTrainer.training_step": AsyncTouch(
        _TRAINER, "TRL's step, then the micro-batch's groups marked trained",
        signatures={"training_step": ("model", "inputs", "num_items_in_batch")}),
    "async_trainer.RLVRAsyncTrainer.train": AsyncTouch(
        _TRAINER, "the checkpoint to resume chosen, and the prompt stream's start set, before TRL's train",
        signatures={"train": ("resume_from_checkpoint", "trial", "ignore_keys_for_eval")}),
    "async_trainer.RLVRAsyncTrainer._save_checkpoint": AsyncTouch(
        _TRAINER, "the prompt stream's position written into the checkpoint's folder before TRL's checkpoint",
        signatures={"_save_checkpoint": ("model", "trial"), "_get_output_dir": ("trial",)}),
}


def _async_object(path: str, replaced: dict):
    """The object at ``path`` ("module" or "module.Class" under trl.experimental.async_grpo, or under transformers);
    ``replaced``: path -> a stand-in (tests). None when it is gone."""
    import importlib

    if path in replaced:
        return replaced[path]
    module_name, _, rest = path.partition(".")
    if module_name in replaced:
        obj = replaced[module_name]
    else:
        obj = importlib.import_module(module_name if module_name == "transformers"
                                      else f"trl.experimental.async_grpo.{module_name}")
    for part in filter(None, rest.split(".")):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _holder(owner: str, name: str) -> tuple[str, str]:
    """(the path of the object that has ``name``, its last part): a ``"Class.name"`` is a class of the owner's module."""
    if "." in name:
        cls, attr = name.rsplit(".", 1)
        return f"{owner.split('.')[0]}.{cls}", attr
    return owner, name


def _params(obj) -> list[str]:
    """The parameters ``obj`` (a function, method or class) takes by name, ``self`` left out."""
    return [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]


def _async_touch_problems(touch: AsyncTouch, piece_obj, where: str, replaced: dict) -> list[str]:
    """What of one :class:`AsyncTouch` TRL breaks, without the "change" prefix."""
    owner = _async_object(touch.owner, replaced)
    if owner is None:
        return [f"{touch.owner} is gone in {where}"]
    problems = []
    for name, params in touch.signatures.items():
        path, attr = _holder(touch.owner, name)
        method = getattr(_async_object(path, replaced) or object, attr, None)
        if method is None:
            problems.append(f"{path}.{attr} is gone in {where}")
        elif missing := [p for p in params if p not in _params(method)]:
            problems.append(f"{path}.{attr}{tuple(_params(method))} lacks parameter(s) {missing} in {where}")
    for name, methods in touch.uses.items():
        problems += _use_problems(touch.owner, name, methods, where, replaced)
    if touch.stands_in_for:
        theirs = getattr(owner, touch.stands_in_for, None)
        if theirs is None:
            problems.append(f"{touch.owner}.{touch.stands_in_for} is gone in {where}")
        elif missing := _not_taken(theirs, piece_obj):
            problems.append(f"{touch.owner}.{touch.stands_in_for} now takes {missing}, which the stand-in does not, "
                            f"in {where}")
    return problems


def _not_taken(theirs, ours) -> list[str]:
    """TRL's parameters that the stand-in ``ours`` does not take (a keyword-only one is taken by its ``**kwargs``)."""
    ours_params = inspect.signature(ours).parameters
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in ours_params.values())
    return [name for name, p in inspect.signature(theirs).parameters.items()
            if name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and name not in ours_params and not (var_keyword and p.kind is p.KEYWORD_ONLY)]


def _use_problems(owner: str, name: str, methods: tuple[str, ...], where: str, replaced: dict) -> list[str]:
    """A name of TRL's gone, or no longer used by a method that must use it."""
    if not methods:
        path, attr = _holder(owner, name)
        holder = _async_object(path, replaced)
        return [] if getattr(holder, attr, None) is not None else [f"{path}.{attr} is gone in {where}"]
    is_name = re.fullmatch(r"[A-Za-z_][\w.]*", name) is not None
    word = name.rsplit(".", 1)[-1]
    problems = []
    for method in methods:
        path, attr = _holder(owner, method)
        source = _source(_async_object(path, replaced) or object, attr)
        if not source:
            problems.append(f"{path}.{attr} is gone in {where}")
        elif not (re.search(rf"\b{re.escape(word)}\b", source) if is_name else name in source):
            problems.append(f"{path}.{attr} no longer uses {name} in {where}")
    return problems


def _async_piece(piece: str):
    """The object a key of :data:`ASYNC_ADAPTER` names in trl_rlvr (None when it is not there)."""
    import importlib

    module_name, *parts = piece.split(".")
    home = {"async_adapter": "trl_rlvr._compat.async_adapter", "async_trainer": "trl_rlvr.async_grpo.async_trainer"}
    obj = importlib.import_module(home[module_name])
    for part in parts:
        obj = getattr(obj, part, None)
    return obj


def async_contract_violations(replaced: dict | None = None) -> list[str]:
    """What of :data:`ASYNC_ADAPTER` the installed ``trl.experimental.async_grpo`` (and transformers) breaks, each line
    naming the piece of async_adapter.py or async_trainer.py to change (empty when it holds). ``replaced``: an owner's
    path -> a stand-in class or module, in place of TRL's (the tests' changed TRL)."""
    import trl

    where = f"trl {trl.__version__} (trl-rlvr is tested with trl{TESTED_TRL})"
    problems = []
    for piece, touch in ASYNC_ADAPTER.items():
        problems += [f"change {piece}: {p}"
                     for p in _async_touch_problems(touch, _async_piece(piece), where, replaced or {})]
    return problems
