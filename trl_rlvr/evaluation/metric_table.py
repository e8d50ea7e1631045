"""The evaluation's metrics, defined once: :data:`EVAL_METRICS` (and :data:`TOOL_METRICS` for tool rollouts), and
the one layout of every metric table (:func:`text_table`).

Each :class:`EvalMetric` says what a metric is and everywhere it shows: the per-question value the scorer's records
hold (:func:`trl_rlvr.evaluation.evaluate.score_questions`), how the summary aggregates it over questions
(:func:`trl_rlvr.evaluation.evaluate.summarize_sampled`), the key :class:`~trl_rlvr.evaluation.callback.SampledEvalCallback`
logs it under, and the row and format of the printed table (:func:`trl_rlvr.evaluation.report.format_table`).
A new metric is one entry here (and one test)::

    EvalMetric("no_answer_frac", per_question=lambda q: q.get("no_answer"), aggregate=share_of_samples,
               log_key="eval/no_answer_frac", row="no extractable answer", fmt=pct)

A metric with ``per_k=True`` has one value per k (``pass@k``, ``maj@k``): its ``per_question`` takes ``(record, k)``
and its ``log_key`` and ``row`` hold ``{k}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


def pct(v) -> str:
    """A share as the tables print it: one decimal of a percent; ``-`` when undefined."""
    return "-" if v is None else f"{v:.1%}"


def num(v) -> str:
    """A length or a time as the tables print it: one decimal; ``-`` when undefined."""
    return "-" if v is None else f"{v:.1f}"


def text_table(labels: list[str], rows: list[tuple[str, list[str]] | None], notes=(), corner: str = "metric") -> str:
    """The project's one table layout, for every before/after and per-arm table: a column per label, a row per
    ``(name, one cell per label)`` (None: a blank line between sections), names left-aligned, cells right-aligned
    under their label, two spaces apart; then the ``notes``, one a line."""
    named = [row for row in rows if row is not None]
    w0 = max(len(corner), *(len(name) for name, _ in named))
    widths = [max(len(label), *(len(cells[i]) for _, cells in named)) for i, label in enumerate(labels)]
    lines = ["  ".join([f"{corner:<{w0}}", *(f"{label:>{w}}" for label, w in zip(labels, widths))])]
    for row in rows:
        name, cells = row if row is not None else ("", [""] * len(labels))
        lines.append("  ".join([f"{name:<{w0}}", *(f"{v:>{w}}" for v, w in zip(cells, widths))]).rstrip())
    return "\n".join(lines + list(notes))


def mean_over_questions(values: list, samples: int) -> float | None:
    """The mean of one value per question (pass@k: Chen et al.'s estimator averaged over questions); None when a
    question has none."""
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)


def share_of_samples(counts: list, samples: int) -> float | None:
    """Per-question counts summed, over all samples (format rate, truncation); None when a question has none."""
    if not samples or any(c is None for c in counts):
        return None
    return sum(counts) / samples


def mean_of_samples(lists: list, samples: int) -> float | None:
    """The mean of per-sample values pooled over questions (lengths); None when there are none."""
    pooled = [x for values in lists for x in values]
    return sum(pooled) / len(pooled) if pooled else None


@dataclass(frozen=True)
class EvalMetric:
    """One evaluation metric.

    Args:
        name: its key in :func:`summarize_sampled`'s result (per k: a dict ``{k: value}`` under this key).
        per_question: a scorer record -> the question's value (``per_k``: ``(record, k)`` -> value).
        aggregate: ``(per-question values, number of samples) -> value`` over the evaluation.
        log_key: what :class:`SampledEvalCallback` logs it as (None: not logged).
        row: its row in :func:`format_table` (None: not printed).
        fmt: value -> table cell.
        per_k: one value per k of the evaluation.
    """

    name: str
    per_question: Callable
    aggregate: Callable[[list, int], float | None]
    log_key: str | None = None
    row: str | None = None
    fmt: Callable[[float | None], str] = pct
    per_k: bool = False

    def summarize(self, per_question: list[dict], ks: list[int]):
        """The metric over the questions' records (per k: ``{k: value}``, or None when undefined)."""
        samples = sum(len(q["lengths"]) for q in per_question)
        if not self.per_k:
            return self.aggregate([self.per_question(q) for q in per_question], samples)
        values = {k: [self.per_question(q, k) for q in per_question] for k in ks}
        if any(v is None for per_k in values.values() for v in per_k):
            return None  # not defined for some question (maj@k without a reward that extracts answers)
        return {k: self.aggregate(per_k, samples) for k, per_k in values.items()}


def _maj(q: dict, k: int):
    return None if q["maj@k"] is None else q["maj@k"][k]


#: Every metric of :func:`summarize_sampled`, in its result's order (``mean@n`` = pass@1 is printed first).
EVAL_METRICS: tuple[EvalMetric, ...] = (
    EvalMetric("mean@n", lambda q: q["right"] / len(q["right_flags"]), mean_over_questions),
    EvalMetric("pass@k", lambda q, k: q["pass@k"][k], mean_over_questions, log_key="eval/pass@{k}", row="pass@{k}",
               per_k=True),
    EvalMetric("maj@k", _maj, mean_over_questions, log_key="eval/maj@{k}", row="maj@{k}", per_k=True),
    EvalMetric("format_rate", lambda q: q["formatted"], share_of_samples, log_key="eval/format_rate",
               row="format rate"),
    EvalMetric("no_answer_frac", lambda q: q.get("no_answer"), share_of_samples, log_key="eval/no_answer_frac",
               row="no extractable answer"),
    EvalMetric("unscored_frac", lambda q: q["unscored"], share_of_samples),
    EvalMetric("mean_length", lambda q: q["lengths"], mean_of_samples),
    EvalMetric("length_right", lambda q: [x for x, r in zip(q["lengths"], q["right_flags"]) if r], mean_of_samples,
               log_key="eval/length_right", row="mean length, right (tokens)", fmt=num),
    EvalMetric("length_wrong", lambda q: [x for x, r in zip(q["lengths"], q["right_flags"]) if not r],
               mean_of_samples, log_key="eval/length_wrong", row="mean length, wrong (tokens)", fmt=num),
    EvalMetric("truncated_frac", lambda q: sum(not f for f in q["finished"]), share_of_samples,
               log_key="eval/truncated_frac", row="truncated"),
)


@dataclass(frozen=True)
class ToolMetric:
    """One tool metric of :func:`trl_rlvr.evaluation.tool_rollouts.summarize_tool_rollouts` that is logged
    (``eval/tools/<key>``) and printed (``row``, ``fmt``)."""

    key: str
    row: str
    fmt: Callable[[float | None], str] = pct

    @property
    def log_key(self) -> str:
        return f"eval/tools/{self.key}"


#: The tool metrics the callback logs and the table prints, in the table's order.
TOOL_METRICS: tuple[ToolMetric, ...] = (
    ToolMetric("tool_call_rate", "tool-call rate (samples)"),
    ToolMetric("calls_per_answer", "tool calls per answer", lambda v: f"{v:.2f}"),
    ToolMetric("tool_call_parse_rate", "tool-call parse rate"),
    ToolMetric("tool_error_rate", "tool errors (per call)"),
    ToolMetric("tool_timeout_rate", "tool timeouts (per call)"),
    ToolMetric("tool_budget_frac", "tool replies: share of budget"),
    ToolMetric("reply_dropped_frac", "tool reply dropped (budget)"),
)


def log_keys(ks: list[int], tools: bool) -> list[str]:
    """Every key :func:`log_metrics` may log for these ``ks`` (with tool rollouts: the tool metrics too)."""
    keys = []
    for metric in EVAL_METRICS:
        if metric.log_key is not None:
            keys += [metric.log_key.format(k=k) for k in ks] if metric.per_k else [metric.log_key]
    return keys + ([m.log_key for m in TOOL_METRICS] if tools else [])


def log_metrics(result: Mapping, ks: list[int]) -> dict:
    """The logged values of one :func:`summarize_sampled` result (the metrics it could compute; per k, ``ks``)."""
    logs = {}
    for metric in EVAL_METRICS:
        value = result.get(metric.name)
        if metric.log_key is None or value is None:
            continue
        if metric.per_k:
            logs.update({metric.log_key.format(k=k): value[k] for k in ks})
        else:
            logs[metric.log_key] = value
    for metric in TOOL_METRICS if result.get("tools") else ():
        if result["tools"][metric.key] is not None:
            logs[metric.log_key] = result["tools"][metric.key]
    return logs
