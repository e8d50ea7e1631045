"""Audit a reward function against a corpus of hostile and labelled cases: ``trl-rlvr rewards audit NAME``.

A policy under optimisation pressure finds whatever its verifier gets wrong. :func:`audit_reward` runs a
versioned corpus of cases suited to the reward's kind (``math_answer``, ``code``, ``format``; the reward declares
it as its ``reward_kind`` attribute) through the reward, each case also as a few metamorphic variants drawn
per run (:mod:`trl_rlvr.audit.variants`), in calls drawn from a training run's at that step (GRPO groups of one
call size, the run's token ids: :mod:`trl_rlvr.audit.batches`), each under a deadline, in a child process the
reward cannot take down with it, where a training run of a real trainer (``RLVRTrainer`` or ``GRPOTrainer`` on a
tiny model, its ``train()``) takes one optimizer step per call, the call's completions being what its policy
generates, and TRL's own ``_generate_and_score_completions`` calls the reward (:mod:`trl_rlvr.audit._child`), and
reports per class the wrong answers
it accepted (false positives), the wrong answers it let escape with ``None`` where a score is due, the right
answers it rejected (false negatives), crashes and hangs, and the cost. The rule for passing is in :mod:`trl_rlvr.audit.scorecard`;
the corpora's schema in :mod:`trl_rlvr.audit.cases`.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from trl_rlvr.audit.batches import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_GROUPS_PER_CALL,
    Call,
    Tokenizer,
    TrainingRun,
    plan,
    step_rows,
)
from trl_rlvr.audit.cases import (
    KINDS,
    Case,
    Corpus,
    CorpusError,
    builtin_corpus,
    load_corpus,
)
from trl_rlvr.audit.runner import Outcome, RewardStartError, Runner, _worst
from trl_rlvr.audit.scorecard import MIN_RIGHT_RATE, AuditReport
from trl_rlvr.audit.variants import variants as make_variants

__all__ = ["KINDS", "AuditReport", "Case", "Corpus", "CorpusError", "Outcome", "RewardStartError", "audit_reward",
           "builtin_corpus", "load_corpus"]


def _renamed(cases: Iterable[Case], columns: Mapping[str, str]) -> list[Case]:
    if not columns:
        return list(cases)
    return [replace(c, columns={columns.get(k, k): v for k, v in c.columns.items()}) for c in cases]


def _rows(calls, group_size: int) -> list[dict]:
    """The distinct dataset rows of ``calls`` (a row per group: its prompt and columns): a run's train dataset
    holds those with its columns, the rows of the steps to come first in the order its sampler draws them."""
    rows: dict[str, dict] = {}
    for call in calls:
        for row in step_rows(call, group_size):
            rows.setdefault(json.dumps(row, sort_keys=True, default=str), row)
    return list(rows.values())


def _warmups(groups, tok, rng, group_size, groups_per_call, kind) -> dict[tuple, Call]:
    """Per set of columns, the call a fresh reward process for it scores first (not reported): an ordinary call of
    the run, of plain cases with those columns (class ``agreement``, right and wrong answers, and their variants;
    else the right answers), so that a process's first call is neither a hostile case nor one answer repeated. A
    set without plain cases has none."""
    by_columns: dict[tuple, list] = {}
    for g in groups:
        by_columns.setdefault(tuple(sorted(g[0].columns)), []).append(g)
    warmups = {}
    for columns, same in by_columns.items():
        plain = [g for g in same if g[0].cls == "agreement"] or [g for g in same if g[0].expected == 1]
        if plain:
            warmups[columns] = plan(rng.sample(plain, min(len(plain), groups_per_call)), tok, rng,
                                    group_size=group_size, groups_per_call=groups_per_call, kind=kind)[0]
    return warmups


def _progress(total: int, label: str):
    """A rich progress bar on stderr (when it is a terminal): (advance callback, stop callback)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.fields[case]}"), console=Console(stderr=True), transient=True)
    task = progress.add_task(label, total=total, case="")
    progress.start()
    return (lambda o: progress.update(task, advance=1, case=f"{o.case.cls}/{o.case.id}")), progress.stop


def audit_reward(
    reward: str | Callable,
    *,
    options: Mapping[str, Any] | None = None,
    kind: str | None = None,
    cases: Iterable[str | Path] = (),
    builtin: bool = True,
    deadline: float = 30.0,
    startup_deadline: float = 120.0,
    threshold: float = 1.0,
    min_right_rate: float = MIN_RIGHT_RATE,
    messages: bool = False,
    columns: Mapping[str, str] | None = None,
    progress: bool = False,
    on_case: Callable[[Outcome], None] | None = None,
    seed: int | None = None,
    variants: int = 3,
    group_size: int = DEFAULT_GROUP_SIZE,
    groups_per_call: int = DEFAULT_GROUPS_PER_CALL,
    tokenizer: str | Path | None = None,
) -> AuditReport:
    """Run the corpus of the reward's kind (and the JSONL files ``cases``) through ``reward`` and report.

    Args:
        reward: a registered reward name (``trl-rlvr rewards list``), a ``module:function`` path, or a picklable
            reward function (it is rebuilt in the audit's child process).
        options: the registered reward's options (those of ``load_reward``).
        kind: the corpus to use, for a reward that declares no ``reward_kind`` (or to override it).
        cases: more corpus files (same schema), run after the built-in corpus; with no kind, only these.
        builtin: run the built-in corpus of the kind (``False``: only ``cases``).
        deadline: seconds a case may take (wall clock); past it the reward's process is killed and replaced.
        startup_deadline: seconds a fresh process may take to build the reward and score its warm-up case.
        threshold: a score at or above it accepts the completion.
        min_right_rate: the share of right answers that must be accepted for the audit to pass.
        messages: pass completions (and prompts) as conversations, ``[{"role": "assistant", "content": ...}]``,
            as TRL does for a conversational dataset (TRL's own rewards read them so).
        columns: rename corpus columns for a reward that reads another name (``{"solution": "answer"}``).
        progress: show a progress bar on stderr.
        seed: draws the variants, the groups, their order and the run's settings (default: a fresh random seed,
            reported in the report, so that a run can be repeated and no two runs look alike).
        variants: metamorphic variants per case (0: none); a variant has the case's label.
        group_size: completions per group (a case, its variants and repeats of them), as ``num_generations``.
        groups_per_call: groups per reward call.
        tokenizer: the tokenizer of the run the reward is for, for ``completion_ids``: a ``tokenizer.json``, a model
            directory, or a hub id (its ``tokenizer.json`` from the cache, or fetched as the run would); the CLI's
            ``--tokenizer smollm2`` passes the project's default model's directory; default: none, a byte-level BPE drawn for this audit (the report says
            so: a reward keyed on a real tokenizer's ids is only audited as it trains with that tokenizer).

    Raises ``ValueError`` (a bad argument, an unknown kind, no corpus to run), :class:`CorpusError` (a corpus
    line against the schema, naming file and line) and :class:`RewardStartError` (the reward cannot be built),
    each before any case runs.
    """
    _check_arguments(kind, variants=variants, group_size=group_size, groups_per_call=groups_per_call)
    seed = int.from_bytes(os.urandom(4), "big") if seed is None else int(seed)
    tok = Tokenizer(tokenizer) if tokenizer is not None else None  # a bad path fails before the reward starts
    extra = [load_corpus(p) for p in cases]
    options = dict(options or {})
    with Runner(reward, options=options, messages=messages, deadline=deadline,
                startup_deadline=startup_deadline) as runner:
        used, corpora = _corpora(runner, reward, kind, builtin, extra)
        todo = _renamed([c for corpus in corpora for c in corpus.cases], columns or {})
        rng = random.Random(seed)
        groups = [[c, *make_variants(c, used, rng, variants)] for c in todo]
        if tok is None:  # none given: a BPE drawn for this audit, trained on its own texts
            tok = Tokenizer(None, texts=[c.completion for g in groups for c in g], rng=rng)
        calls = plan(groups, tok, rng, group_size=group_size, groups_per_call=groups_per_call, kind=used)
        warmups = _warmups(groups, tok, rng, group_size, groups_per_call, used)
        training = TrainingRun(rng, len(calls), group_size * groups_per_call, group_size,
                               str(runner.info.get("name") or "reward"), eos_id=tok.eos_id)
        runner.context = {"run": {"settings": training.trainer_settings(), "tokenizer": tok.spec()},
                          "rows": _rows([*calls, *warmups.values()], group_size)}
        title = f"auditing {runner.info.get('name') or reward}" if progress else None
        outcomes = _run(runner, calls, warmups, training, sum(len(g) for g in groups), title, on_case)
        name = reward if isinstance(reward, str) else runner.info.get("name") or repr(reward)
        return AuditReport(
            reward=name, kind=used, corpora=[{"name": c.name, "version": c.version, "path": c.path,
                                              "cases": len(c.cases)} for c in corpora],
            outcomes=_in_corpus_order(outcomes, groups), threshold=threshold, min_right_rate=min_right_rate,
            deadline=deadline, options=options, startup_seconds=list(runner.startup_seconds),
            calls={"seed": seed, "variants": variants, "group_size": group_size, "groups_per_call": groups_per_call,
                   "calls": len(calls), "tokenizer": tok.name, "tokenizer_given": tok.given,
                   "run": training.describe()})


def _check_arguments(kind: str | None, **counts: int) -> None:
    """ValueError for an unknown kind or a count below its least value (variants 0, the others 1)."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown reward kind {kind!r}: one of {', '.join(KINDS)}")
    for name, value in counts.items():
        least = 0 if name == "variants" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


def _corpora(runner: Runner, reward, kind: str | None, builtin: bool, extra: list) -> tuple[str | None, list]:
    """The kind the audit uses (``kind``, else the one the reward declares) and the corpora to run: the built-in
    one of that kind (``builtin``), then ``extra``. ValueError when there is none to run."""
    declared = runner.info.get("kind")
    used = kind or (declared if declared in KINDS else None)
    if builtin and used is None and not extra:
        raise ValueError(
            f"reward {runner.info.get('name') or reward!r} declares no reward_kind "
            f"({'got ' + repr(declared) if declared else 'none'}): pass --kind ({', '.join(KINDS)}) "
            "or your own cases (--cases)")
    corpora = ([builtin_corpus(used)] if builtin and used else []) + extra
    if not corpora:
        raise ValueError("no corpus to run: builtin=False and no cases")
    return used, corpora


def _run(runner: Runner, calls, warmups, training, total: int, title: str | None, on_case) -> list[Outcome]:
    """Send the calls; one outcome per case (a case sent in more than one call: its worst, as for the repeats
    within a group; the last call of a set of columns is filled with groups sent before)."""
    advance, stop = _progress(total, title) if title else (None, None)

    def each(o):
        if advance:
            advance(o)
        if on_case:
            on_case(o)

    try:
        return _worst(runner.run(calls, warmups=warmups, on_case=each, training=training))
    finally:
        if stop:
            stop()


def _in_corpus_order(outcomes: list[Outcome], groups: list[list]) -> list[Outcome]:
    """The outcomes in corpus order (each case, then its variants), whatever order the calls went in."""
    order = {(c.id, c.completion): i for i, c in enumerate(c for g in groups for c in g)}
    return sorted(outcomes, key=lambda o: order.get((o.case.id, o.case.completion), len(order)))
