"""The dataset's columns, checked before any model loads against what the reward functions read.

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
