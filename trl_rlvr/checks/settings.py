"""Mistakes found before any model loads: the dataset's columns, and settings that cannot work or do nothing.

A reward function declares the dataset columns it reads in an attribute ``required_columns``: a sequence whose
entries are a column name or a tuple of names any one of which will do. ``boxed_math`` declares
``(("answer", "solution"),)`` (or its ``gold_column``), ``code_sandbox`` ``(("tests", "test", "io_tests"),)``.
A function without the attribute is not checked. TRL gives a reward function every dataset column but
``prompt`` as a keyword argument, so a column missing from the dataset is otherwise found only after the model
has loaded and the first batch has been generated.

With ``environment_factory`` the check asks what TRL asks: no ``prompt`` column (the environment's ``reset()``
may supply the prompt), and with a dict of environments an ``environment`` column naming each row's.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence


def reward_name(reward) -> str:
    return getattr(reward, "__name__", None) or type(reward).__name__


def missing_columns(columns: Iterable[str], reward_funcs: Sequence, environment_factory=None) -> list[str]:
    """One message per missing column: ``prompt`` (not needed with an ``environment_factory``; with a dict of
    them, ``environment`` is), then every reward function's ``required_columns``."""
    columns = set(columns)
    problems = []
    if isinstance(environment_factory, dict):
        if "environment" not in columns:
            problems.append(
                "the column 'environment', which routes each row to one of the environment_factory dict's "
                f"environments {sorted(map(str, environment_factory))}"
            )
    elif environment_factory is None and "prompt" not in columns:
        problems.append("the column 'prompt' (what the policy is given to answer)")
    for reward in reward_funcs:
        for need in getattr(reward, "required_columns", ()) or ():
            options = (need,) if isinstance(need, str) else tuple(need)
            if not columns & set(options):
                wanted = " or ".join(map(repr, options))
                problems.append(f"the column {wanted}, which the reward function {reward_name(reward)!r} reads")
    return problems


def check_dataset_columns(dataset, reward_funcs: Sequence, what: str = "train_dataset",
                          environment_factory=None) -> None:
    """Raise ``ValueError`` naming every column ``dataset`` lacks (``prompt`` or, with a dict ``environment_factory``,
    ``environment``; the rewards' ``required_columns``).

    A dataset whose columns are unknown (an ``IterableDataset`` without features, a plain list) is not checked."""
    columns = getattr(dataset, "column_names", None)
    if dataset is None or columns is None:
        return
    if isinstance(columns, dict):  # a DatasetDict
        return
    problems = missing_columns(columns, reward_funcs, environment_factory)
    if problems:
        raise ValueError(f"{what} lacks " + "; and ".join(problems) + f". Its columns: {sorted(columns)}")
    for reward in reward_funcs:  # a reward that checks its rows too (code_sandbox: what check() may call)
        if callable(getattr(reward, "check_rows", None)):
            reward.check_rows(dataset)
    factories = environment_factory.values() if isinstance(environment_factory, dict) else [environment_factory]
    for factory in factories:  # an environment that scores rows (PythonTestsEnvironment): its rows too
        options = {}
        while isinstance(factory, functools.partial):  # the options the environment will get
            options, factory = {**factory.keywords, **options}, factory.func
        if callable(getattr(factory, "check_rows", None)):
            factory.check_rows(dataset, **options)


# ------------------------------------------------------------------------------------------------ settings
def _filtering(config) -> bool:
    return config.dynamic_sampling or config.selective_sampling  # both judge groups by metric and tolerance


#: option -> (whether it acts under a built config, what it needs). The two rules of the GRPOTrainer-compatible
#: switches (``advantage_std``, ``token_count_scope``) read only fields a plain ``GRPOConfig`` has too
#: (``loss_type == "dapo"`` is ``loss_normalization="per_batch_token"`` once RLVRConfig has resolved it).
ACTS_WHEN = {
    "max_sampling_rounds": (lambda c: c.dynamic_sampling, "dynamic_sampling=True"),
    "dynamic_sampling_oversample": (lambda c: c.dynamic_sampling, "dynamic_sampling=True"),
    "dynamic_sampling_metric": (_filtering, "dynamic_sampling=True or selective_sampling=True"),
    "dynamic_sampling_tolerance": (_filtering, "dynamic_sampling=True or selective_sampling=True"),
    "selective_sampling_window": (lambda c: c.selective_sampling, "selective_sampling=True"),
    "revisit_probability": (lambda c: c.selective_sampling, "selective_sampling=True"),
    "overlong_penalty_factor": (lambda c: c.overlong_buffer_length is not None, "overlong_buffer_length"),
    "token_count_scope": (lambda c: c.loss_type == "dapo", "loss_normalization='per_batch_token'"),
    "advantage_std": (
        lambda c: c.scale_rewards != "none" and c.multi_objective_aggregation == "sum_then_normalize",
        "scale_rewards='group' or 'batch' and multi_objective_aggregation='sum_then_normalize'",
    ),
}


def option_acts(config, name: str) -> bool:
    """Whether RLVR option ``name`` changes anything under the other settings of ``config``."""
    return bool(ACTS_WHEN[name][0](config))


def ineffective_options(config) -> list[str]:
    """One message per RLVR option set away from its default where the other settings make it do nothing."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    return [
        f"{name}={getattr(config, name)!r} has no effect without {needs}"
        for name, (_, needs) in ACTS_WHEN.items()
        if name in defaults and getattr(config, name) != defaults[name] and not option_acts(config, name)
    ]


def check_tool_settings(config, train_dataset, environment_factory) -> None:
    """Combinations with tools that cannot work, named by both options, before any model loads: selective sampling
    remembers prompts by their dataset row, and without a ``train_dataset`` the environment's ``reset()`` makes each
    prompt (TRL then cycles placeholder rows), so a row names no prompt to skip or revisit."""
    if environment_factory is not None and train_dataset is None and getattr(config, "selective_sampling", False):
        raise ValueError(
            "selective_sampling=True needs a train_dataset, but environment_factory is given without one (its "
            "reset() makes each prompt, so a dataset row names no prompt to skip or revisit): pass a train_dataset "
            "or set selective_sampling=False"
        )


def check_settings(config) -> None:
    """Errors and warnings that need no model: options without effect (warn), bf16 on a CPU (warn), ``use_vllm``
    without vLLM installed (``ImportError`` now rather than after the model and data have loaded)."""
    import importlib.util
    import warnings

    for message in ineffective_options(config):
        warnings.warn(message, UserWarning, stacklevel=5)
    if config.use_vllm and importlib.util.find_spec("vllm") is None:
        raise ImportError(
            f"use_vllm=True (vllm_mode={config.vllm_mode!r}) needs vLLM, which is not installed: pip install "
            "'trl-rlvr[vllm]' (GPU) or see docs for vLLM's CPU build; or set use_vllm=False to generate with "
            "transformers"
        )
    if config.bf16 and _on_cpu(config):
        warnings.warn(
            "bf16=True on a CPU (use_cpu=True or no GPU; TRL's GRPOConfig turns bf16 on by default): bfloat16 "
            "autocast is slower than float32 on a CPU (measured in docs/benchmarks.md). Set bf16=False.",
            UserWarning,
            stacklevel=5,
        )


def _on_cpu(config) -> bool:
    if config.use_cpu:
        return True
    import torch

    return not (torch.cuda.is_available() or getattr(torch, "xpu", None) and torch.xpu.is_available()
                or torch.backends.mps.is_available())
