"""Recipes: ``trl-rlvr train --config recipe.yaml [--field value ...]``, and the code ``examples/r1zero.py`` shares.

A recipe is a YAML mapping of fields of three dataclasses, as in TRL's own scripts (``TrlParser``):
:class:`RecipeArguments` (preset, data, prompt, rewards), :class:`trl_rlvr.RLVRConfig` (every ``GRPOConfig``
field and the RLVR switches) and ``trl.ModelConfig`` (model, dtype, 4-bit, PEFT). Precedence, lowest first:
the script's defaults, the ``preset``'s switches (:mod:`trl_rlvr.presets`), the YAML, the command line. A key
that none of the three dataclasses has is an error that names it.

The steps, in the order they can fail (cheap and likely mistakes first, the model last):

1. :func:`parse` -- unknown keys, unknown preset, invalid settings (``RLVRConfig`` validates itself);
2. :func:`load_raw_data` -- the dataset, its split and its question/answer columns;
3. :func:`recipe_rewards` -- the reward functions with their options (the registry resolves each name);
4. :func:`model_settings` -- then the prompts, and :func:`build_trainer` hands everything to
   ``RLVRTrainer``, which checks the dataset's columns against the rewards and then loads the model.

The parsed arguments are not changed: what the trainer needs set differently (the options the rewards were built
with, the model's loading arguments) goes into the copy :func:`trainer_args` makes.
"""

from __future__ import annotations

import copy
import difflib
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from trl_rlvr.scripts.data import PROMPT_STYLES

#: What ``trl-rlvr train --help`` says first.
DESCRIPTION = (
    "Train a model with RLVRTrainer (TRL's GRPOTrainer plus the RLVR switches) from a recipe: a YAML file of fields "
    "of RecipeArguments (preset, data, prompt, rewards), RLVRConfig (every GRPOConfig field and the RLVR switches) "
    "and trl.ModelConfig (model, dtype, 4-bit, PEFT). Precedence, lowest first: the preset's switches, the YAML, the "
    "command line; an unknown key is an error that names it. Checks the data, the rewards and the settings before "
    "the model loads, trains, and saves the model (or adapter) to output_dir. Without a model and a dataset it "
    "trains SmolLM2-135M-Instruct on built-in arithmetic word problems, offline. Recipes: examples/recipes/, "
    "docs/recipes.md."
)


@dataclass
class RecipeArguments:
    """A recipe's own fields: preset, data, prompt and rewards. Model fields come from ``trl.ModelConfig``."""

    preset: str | None = field(
        default=None,
        metadata={"help": "Algorithm switches of one paper: 'dapo', 'dr_grpo', 'grpo' or 'r1zero' (docs/recipes.md). "
                  "The recipe's own fields and the command line override them."},
    )
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Hub id, local folder or local file (.json, .jsonl, .csv, .parquet) with a question and an "
                  "answer column. Default: built-in arithmetic word problems (offline)."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset configuration (e.g. 'main' for gsm8k)."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str | None = field(
        default="test", metadata={"help": "Held-out split; if missing, carved out of the train split."}
    )
    question_column: str = field(default="question", metadata={"help": "Column holding the question."})
    answer_column: str = field(
        default="answer", metadata={"help": "Column holding the reference answer (GSM8K's '... #### 42' is reduced to 42)."}
    )
    prompt_style: str = field(
        default="chat_prefill",
        metadata={"help": "'chat_prefill': chat template, instruction + one-shot example, assistant turn pre-filled "
                  "with <think>; 'r1zero': DeepSeek-R1-Zero's plain-text template ending in <think> (base models); "
                  "'chat': conversational prompt without prefill.",
                  "choices": list(PROMPT_STYLES)},
    )
    system_prompt: str | None = field(
        default=None, metadata={"help": "A system turn before the question (chat styles) or a paragraph before the "
                                "plain-text template (r1zero)."}
    )
    num_train_samples: int | None = field(
        default=None, metadata={"help": "Training questions (built-in data: how many to generate, default 256; "
                                "other data: a cap, None = all)."}
    )
    num_eval_samples: int = field(default=100, metadata={"help": "Held-out questions."})
    max_operand: int = field(default=20, metadata={"help": "Built-in data: operands are drawn from 1..max_operand."})
    dataset_seed: int = field(default=0, metadata={"help": "Seed of the built-in data and of subsampling."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["think_format", "boxed_math"],
        metadata={"help": "Reward functions by registry name (`trl-rlvr rewards list`) or dotted import path; "
                  "options in reward_options."},
    )
    environment_factory: str | None = field(
        default=None,
        metadata={"help": "Multi-turn training with tools: an environment class by import path, e.g. "
                  "'reward_plugins.code_sandbox.PythonEnvironment' (the sandboxed Python tool, docs/python_tool.md); "
                  "TRL's environment_factory. Needs a chat template that can call tools."},
    )
    chat_template: str | None = field(
        default=None,
        metadata={"help": "The tokenizer's chat template for this run: a .jinja file, or the name of a template TRL "
                  "ships (trl/chat_templates, e.g. 'qwen2_5': ChatML that renders tools). Needed with "
                  "environment_factory when the model's own template cannot render tools (SmolLM2's); saved with "
                  "the checkpoints' tokenizer."},
    )
    environment_options: dict | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments of environment_factory, e.g. {\"timeout\": 5} (a JSON string on the "
                  "command line)."},
    )
    cpu_threads: int | None = field(
        default=None,
        metadata={"help": "Torch threads when training on a CPU. Default: with one process, every usable core, "
                  "spinning ~30 us before they sleep (OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=3000; `accelerate "
                  "launch` without a config sets OMP_NUM_THREADS=1, which halves speed on 2 quiet cores); with "
                  "several processes, what the launcher set."},
    )

    def __post_init__(self):
        for name in ("preset", "dataset_name", "dataset_config", "dataset_test_split", "system_prompt",
                     "environment_factory", "chat_template"):
            if isinstance(getattr(self, name), str) and getattr(self, name).lower() in ("none", "null"):
                setattr(self, name, None)  # the command line's way of saying None
        if self.preset is not None:
            from trl_rlvr.presets import PRESETS

            if self.preset not in PRESETS:
                raise ValueError(f"Unknown preset {self.preset!r}; presets: {', '.join(map(repr, PRESETS))}")
        if isinstance(self.environment_options, str):
            import json

            try:
                self.environment_options = json.loads(self.environment_options)
            except json.JSONDecodeError as err:
                raise ValueError(f"environment_options must be a JSON object of keyword arguments: {err}") from err
        if self.environment_options is not None and not isinstance(self.environment_options, dict):
            raise ValueError(f"environment_options must be a mapping of keyword arguments: {self.environment_options!r}")
        if self.environment_options and self.environment_factory is None:
            raise ValueError("environment_options is set but environment_factory is not: name the environment class")
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"prompt_style={self.prompt_style!r} is not valid; allowed values: {PROMPT_STYLES}")
        if self.chat_template is not None:
            from trl_rlvr.scripts.chat_templates import resolve_chat_template

            resolve_chat_template(self.chat_template)  # a name that is neither a file nor TRL's: stop at parse time


# ------------------------------------------------------------------------------------------------ 1. parse
def make_parser(script_class: type = RecipeArguments, defaults: dict[str, Any] | None = None, prog: str | None = None):
    """A ``TrlParser`` over (``script_class``, ``RLVRConfig``, ``ModelConfig``) that knows ``preset`` and names
    unknown keys; ``defaults`` are the script's own defaults (lowest precedence)."""
    from trl import ModelConfig, TrlParser

    from trl_rlvr.config import RLVRConfig

    class RecipeParser(TrlParser):
        def parse_args_and_config(self, args=None, **kwargs):
            args = list(sys.argv[1:] if args is None else args)
            config_path, config = _read_config(args)
            preset = _setting("preset", args, config)
            if preset is not None and str(preset).lower() not in ("none", "null"):
                from trl_rlvr.presets import preset_values

                self.set_defaults_with_config(**preset_values(str(preset), self._run_settings(args, config)))
            if kwargs:
                return super().parse_args_and_config(args, **kwargs)
            *parsed, from_config, from_cli = super().parse_args_and_config(
                args, return_remaining_strings=True, separate_remaining_strings=True
            )
            if from_config or from_cli:
                raise ValueError(_unknown_keys(self, from_config, from_cli, config_path))
            return tuple(parsed)

        def _run_settings(self, args, config) -> dict:
            """The settings a preset reads, as this run will have them: the command line, else the YAML, else
            the parser's default (the script's, or the dataclass field's: TRL's own for GRPOConfig fields)."""
            settings = {}
            for name, kind in (("max_completion_length", int), ("loss_type", str), ("loss_normalization", str)):
                value = _setting(name, args, config)
                value = self.get_default(name) if value is None else value
                settings[name] = None if value is None or str(value).lower() in ("none", "null") else kind(value)
            return settings

    parser = RecipeParser((script_class, RLVRConfig, ModelConfig), prog=prog)
    if defaults:
        parser.set_defaults_with_config(**defaults)
    return parser


def _read_config(args: list[str]) -> tuple[str | None, dict]:
    if "--config" not in args:
        return None, {}
    import yaml

    path = args[args.index("--config") + 1]
    with open(path) as f:
        config = yaml.safe_load(f)
    return path, config if isinstance(config, dict) else {}


def _setting(name: str, args: list[str], config: dict):
    """``name``'s value on the command line (``--name v`` or ``--name=v``), else in the YAML, else None."""
    flag = f"--{name}"
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return config.get(name)


def _unknown_keys(parser, from_config: list[str], from_cli: list[str], config_path: str | None) -> str:
    known = sorted({action.dest for action in parser._actions})
    parts = []
    for where, strings in ((f"in {config_path}", from_config), ("on the command line", from_cli)):
        keys = [s.lstrip("-").split("=", 1)[0] for s in strings if s.startswith("--")] or strings
        for key in keys:
            close = difflib.get_close_matches(key, known, n=1)
            parts.append(f"{key!r} {where}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return ("Unknown recipe key(s): " + "; ".join(parts) + ". A recipe takes the fields of RecipeArguments, "
            "RLVRConfig (GRPOConfig) and trl.ModelConfig (`trl-rlvr train --help-all` lists them all).")


# ------------------------------------------------------------------------------------------------ 2. data
def load_raw_data(recipe):
    """The dataset as it is (``DatasetDict``), its split and columns checked; None for the built-in data."""
    if recipe.dataset_name is None:
        return None
    from trl_rlvr.scripts.data import load_raw_qa

    return load_raw_qa(recipe.dataset_name, config=recipe.dataset_config, train_split=recipe.dataset_train_split,
                       question_column=recipe.question_column, answer_column=recipe.answer_column)


def build_datasets(recipe, tokenizer, raw=None):
    """``{"train", "test"}`` in the R1-Zero format (:data:`trl_rlvr.scripts.data.COLUMNS`)."""
    from trl_rlvr.scripts.data import arithmetic_dataset, load_qa_dataset

    if recipe.dataset_name is None:
        return arithmetic_dataset(
            tokenizer, n_train=recipe.num_train_samples or 256, n_eval=recipe.num_eval_samples,
            seed=recipe.dataset_seed, max_operand=recipe.max_operand, prompt_style=recipe.prompt_style,
            system_prompt=recipe.system_prompt,
        )
    return load_qa_dataset(
        recipe.dataset_name, tokenizer, config=recipe.dataset_config, train_split=recipe.dataset_train_split,
        test_split=recipe.dataset_test_split, question_column=recipe.question_column,
        answer_column=recipe.answer_column, prompt_style=recipe.prompt_style, n_train=recipe.num_train_samples,
        n_eval=recipe.num_eval_samples, seed=recipe.dataset_seed, system_prompt=recipe.system_prompt, raw=raw,
    )


# ------------------------------------------------------------------------------------------------ 3. rewards
def reward_options(recipe, training_args) -> dict[str, dict]:
    """``reward_options`` as the rewards are built with them: the user's, and ``prefilled=True`` for
    ``think_format`` and ``boxed_math`` with a prompt that ends in ``<think>`` (``chat_prefill``, ``r1zero``): the
    completion starts inside the reasoning, and an answer exists only after ``</think>`` (boxed_math gives no
    credit to a box inside unclosed reasoning)."""
    from trl_rlvr.scripts.data import with_prefilled_options

    options = {k: dict(v) for k, v in (training_args.reward_options or {}).items()}
    with_prefilled_options(options, recipe.reward_funcs, recipe.prompt_style)
    return options


def recipe_rewards(recipe, training_args) -> list:
    """The reward functions, built with :func:`reward_options` (names and import paths resolved by the registry).
    The dataset's columns are checked against them by ``RLVRTrainer``, before the model loads."""
    from trl_rlvr.rewards.registry import resolve_reward_funcs

    return resolve_reward_funcs(recipe.reward_funcs, reward_options(recipe, training_args))


def trainer_args(recipe, training_args, reward_funcs: list, model_init_kwargs: dict):
    """The arguments ``RLVRTrainer`` gets: a copy of ``training_args`` (the parsed ones are left as they were) with
    the options the rewards were built with, the model's loading arguments, and ``success_reward`` cleared when it
    names none of ``reward_funcs`` (a recipe's ``success_reward: boxed_math`` with ``--reward_funcs`` that drop
    boxed_math: the first verifier decides)."""
    args = copy.copy(training_args)
    args.reward_options = reward_options(recipe, training_args) or None
    args.model_init_kwargs = model_init_kwargs
    if args.success_reward is not None and args.success_reward not in [getattr(f, "__name__", None) for f in reward_funcs]:
        args.success_reward = None
    return args


# ------------------------------------------------------------------------------------------------ 4. model
def model_settings(model_args, training_args, quiet: bool = False):
    """(model path, tokenizer, quantization config, model_init_kwargs): ``training_args.model_init_kwargs``
    completed from ``model_args`` (dtype, attention, revision, 4/8-bit device map). The weights load in
    ``RLVRTrainer``."""
    from trl_rlvr.scripts.models import kbit_device_map, load_tokenizer, quantization_config, resolve_model_path

    model_path = resolve_model_path(model_args.model_name_or_path, quiet=quiet)
    tokenizer = load_tokenizer(model_path, revision=model_args.model_revision,
                               trust_remote_code=training_args.trust_remote_code)
    tokenizer.truncation_side = "left"
    init_kwargs = dict(training_args.model_init_kwargs or {})
    init_kwargs.setdefault("dtype", model_args.dtype or "float32")
    if model_args.attn_implementation is not None:
        init_kwargs.setdefault("attn_implementation", model_args.attn_implementation)
    if model_args.model_revision not in (None, "main"):
        init_kwargs.setdefault("revision", model_args.model_revision)
    quantization = quantization_config(
        model_args.load_in_4bit, model_args.load_in_8bit, init_kwargs["dtype"], model_args.bnb_4bit_quant_type,
        model_args.use_bnb_nested_quant, model_args.bnb_4bit_quant_storage or "uint8",
    )
    if quantization is not None:
        init_kwargs.setdefault("device_map", kbit_device_map())
    return model_path, tokenizer, quantization, init_kwargs


def build_trainer(recipe, training_args, model_args, quiet: bool = False, main_process_first=None):
    """Steps 2-4: ``(RLVRTrainer, {"train", "test"} datasets)``. ``main_process_first``: a context manager
    (``PartialState().main_process_first``) under which the model is resolved (the offline default is
    converted once, by the main process)."""
    import contextlib

    from trl import get_peft_config

    from trl_rlvr.scripts.data_fit import check_recipe_fits
    from trl_rlvr.trainer import RLVRTrainer

    raw = load_raw_data(recipe)
    reward_funcs = recipe_rewards(recipe, training_args)
    environment_factory = build_environment_factory(recipe)
    check_recipe_fits(recipe, training_args, raw)  # num_eval_samples, num_train_samples vs the data's rows
    with (main_process_first or contextlib.nullcontext)():
        model_path, tokenizer, quantization_config, model_init_kwargs = model_settings(model_args, training_args, quiet)
    recipe_chat_template(recipe, tokenizer)  # before the prompts are rendered and before the model loads
    data = build_datasets(recipe, tokenizer, raw)
    evaluating = training_args.eval_strategy != "no"
    trainer = RLVRTrainer(
        model=model_path,
        reward_funcs=reward_funcs,
        args=trainer_args(recipe, training_args, reward_funcs, model_init_kwargs),
        train_dataset=data["train"],
        eval_dataset=data["test"] if evaluating else None,
        processing_class=tokenizer,
        quantization_config=quantization_config,
        peft_config=get_peft_config(model_args),
        environment_factory=environment_factory,
    )
    return trainer, data


def recipe_chat_template(recipe, tokenizer):
    """The recipe's ``chat_template`` on ``tokenizer``; with an ``environment_factory``, ``ValueError`` unless the
    template renders tools (checked on the tokenizer alone, before the model loads)."""
    from trl_rlvr.scripts.chat_templates import apply_chat_template_spec, check_renders_tools

    apply_chat_template_spec(tokenizer, recipe.chat_template)
    if recipe.environment_factory is not None:
        source = f"chat_template {recipe.chat_template!r}" if recipe.chat_template else "the model's tokenizer"
        check_renders_tools(tokenizer, f"environment_factory {recipe.environment_factory!r} with {source}")
    return tokenizer


def build_environment_factory(recipe):
    """``environment_factory`` by import path, with ``environment_options`` bound (``functools.partial``); None
    without one. ``ValueError`` naming the field when the path does not import."""
    if recipe.environment_factory is None:
        return None
    import functools

    from trl_rlvr.rewards.registry import import_callable

    factory = import_callable(recipe.environment_factory, "environment_factory")
    return functools.partial(factory, **(recipe.environment_options or {}))


def use_cpu_threads(requested: int | None, num_processes: int) -> None:
    """Give torch the CPU's cores: `accelerate launch` without a config pins a CPU job to one thread. With one
    process and no ``requested`` count, every usable core (:func:`trl_rlvr.checks.machine.default_cpu_threads`),
    whatever the load: with OpenMP threads that spin briefly, then sleep (:func:`passive_openmp_waits`, before
    torch loads), a run on a core another process uses stays within ~2x of its quiet time."""
    import torch

    if torch.cuda.is_available():
        return
    if requested is None and num_processes == 1:
        from trl_rlvr.checks.machine import default_cpu_threads

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        requested = default_cpu_threads(cores)
    if requested:
        torch.set_num_threads(requested)


#: GNU OpenMP's spins before a waiting thread sleeps (~100 spins per microsecond): long enough to bridge the gap
#: between two small parallel regions of a decode step, too short to hold a core another process needs.
SHORT_SPIN_COUNT = "3000"


def passive_openmp_waits() -> None:
    """OpenMP threads that wait spin briefly, then sleep, unless the environment says otherwise: a thread spinning
    on takes the core from the very thread it waits for when another process shares the machine; one that sleeps at
    once pays a wake-up between every two small parallel regions of a quiet ``generate``.

    Sets ``OMP_WAIT_POLICY=PASSIVE`` and, for torch's GNU OpenMP (libgomp, whose ``GOMP_SPINCOUNT`` takes precedence
    over the policy), ``GOMP_SPINCOUNT`` = :data:`SHORT_SPIN_COUNT`; both left to the environment when it sets
    ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``. Measured on 2 Intel Xeon cores, one batch of the tool job's
    evaluation (docs/benchmarks.md, "Torch threads on shared cores"): 5% slower than spinning when quiet (PASSIVE
    alone: 21%), 7% slower than sleeping at once when another process takes a core (spinning: 3.6x). OpenMP reads
    both once, when torch loads: call this first."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ["GOMP_SPINCOUNT"] = SHORT_SPIN_COUNT


# ------------------------------------------------------------------------------------------------ train
def train(recipe, training_args, model_args):
    """``trl-rlvr train``: build, train, save the model (or adapter) to ``output_dir``; returns the trainer."""
    from trl_rlvr.faults import checkpoint_to_resume
    from trl_rlvr.scripts.distributed import distributed_state

    # Which checkpoint to resume from, before the model loads (UnusableCheckpointError says why none fits).
    resume = checkpoint_to_resume(training_args.resume_from_checkpoint, training_args.output_dir)
    state = distributed_state(training_args.use_cpu)
    use_cpu_threads(recipe.cpu_threads, state.num_processes)
    trainer, _ = build_trainer(recipe, training_args, model_args, quiet=not state.is_main_process,
                               main_process_first=state.main_process_first)
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(training_args.output_dir)
    return trainer


def help_text() -> str:
    """``trl-rlvr train --help``: what the command does, the recipe's fields, the RLVR switches and the most-used
    TRL/transformers fields (:mod:`trl_rlvr.scripts.recipe_help`; every field: ``--help-all``)."""
    from trl_rlvr.scripts.recipe_help import own_fields, short_help

    return short_help("trl-rlvr train", "--config RECIPE.yaml [--FIELD VALUE ...]", DESCRIPTION,
                      [("Recipe fields (RecipeArguments: preset, data, prompt, rewards)", own_fields(RecipeArguments))])


def main(argv: list[str] | None = None):
    """Entry point of ``trl-rlvr train``; ``--help`` prints :func:`help_text` (no TRL import), ``--help-all`` every
    field (TRL's parser)."""
    from trl_rlvr.scripts.recipe_help import wants_help

    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv) == "short":
        print(help_text(), end="")
        return None
    if wants_help(argv) == "all":
        argv = ["--help"]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    passive_openmp_waits()
    recipe, training_args, model_args = make_parser(
        prog="trl-rlvr train", defaults=log_file_defaults()).parse_args_and_config(argv)
    return train(recipe, training_args, model_args)


def log_file_defaults() -> dict:
    """When stderr is not a terminal (a log file, CI): ``disable_tqdm=True``, so that the Trainer prints one line
    per logging step instead of redrawing a bar with ``\r`` (a recipe or ``--disable_tqdm false`` still wins), and
    the bars of transformers, datasets and the hub off (:func:`trl_rlvr.evaluation.progress.plain_library_bars`)."""
    from trl_rlvr.evaluation.progress import is_terminal, plain_library_bars

    if is_terminal():
        return {}
    plain_library_bars()
    return {"disable_tqdm": True}
