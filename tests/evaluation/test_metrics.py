"""The evaluation's metric table (trl_rlvr.evaluation.metric_table): each metric's summary against its definition computed
directly, and every metric that has a log key or a row reaching the callback's logs and the printed table."""

from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.evaluation.evaluate import summarize_sampled
from trl_rlvr.evaluation.metric_table import EVAL_METRICS, TOOL_METRICS, log_keys, log_metrics
from trl_rlvr.evaluation.passk import pass_at_k
from trl_rlvr.evaluation.report import format_table


@st.composite
def records(draw):
    """Scorer records (:func:`score_questions`' fields) of 1-5 questions x n samples; format and voting optional."""
    n = draw(st.sampled_from([1, 2, 4]))
    ks = [k for k in (1, 2, 4) if k <= n]
    voting, formatted = draw(st.booleans()), draw(st.booleans())
    out = []
    for _ in range(draw(st.integers(1, 5))):
        right = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        rec = {"right": sum(right), "right_flags": right, "unscored": draw(st.integers(0, n)),
               "formatted": draw(st.integers(0, n)) if formatted else None,
               "pass@k": {k: pass_at_k(n, sum(right), k) for k in ks},
               "maj@k": {k: draw(st.floats(0, 1)) for k in ks} if voting else None,
               "lengths": draw(st.lists(st.integers(0, 99), min_size=n, max_size=n)),
               "finished": draw(st.lists(st.booleans(), min_size=n, max_size=n))}
        if voting:
            rec["no_answer"] = draw(st.integers(0, n))
        out.append(rec)
    return n, ks, out


def _mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


@settings(max_examples=60, deadline=None)
@given(records())
def test_each_metric_summarizes_as_defined(case):
    n, ks, per_question = case
    total = n * len(per_question)
    s = summarize_sampled(per_question, n, ks)
    lengths = [(x, r) for q in per_question for x, r in zip(q["lengths"], q["right_flags"])]
    voting, formatted = per_question[0]["maj@k"] is not None, per_question[0]["formatted"] is not None
    assert s["mean@n"] == _mean(q["right"] / n for q in per_question)
    assert s["pass@k"] == {k: _mean(q["pass@k"][k] for q in per_question) for k in ks}
    assert s["maj@k"] == ({k: _mean(q["maj@k"][k] for q in per_question) for k in ks} if voting else None)
    assert s["format_rate"] == (sum(q["formatted"] for q in per_question) / total if formatted else None)
    assert s["no_answer_frac"] == (sum(q["no_answer"] for q in per_question) / total if voting else None)
    assert s["unscored_frac"] == sum(q["unscored"] for q in per_question) / total
    assert s["mean_length"] == _mean(x for x, _ in lengths)
    assert s["length_right"] == _mean(x for x, r in lengths if r)
    assert s["length_wrong"] == _mean(x for x, r in lengths if not r)
    assert s["truncated_frac"] == sum(not f for q in per_question for f in q["finished"]) / total
    assert [m.name for m in EVAL_METRICS] == [k for k in s if k in {m.name for m in EVAL_METRICS}]  # the order


@settings(max_examples=30, deadline=None)
@given(records())
def test_every_logged_or_printed_metric_reaches_the_logs_and_the_table(case):
    n, ks, per_question = case
    s = {**summarize_sampled(per_question, n, ks), "seconds": 1.0}
    logs, table = log_metrics(s, ks), format_table({"model": s})
    assert set(logs) <= set(log_keys(ks, tools=False))
    for metric in EVAL_METRICS:
        if metric.log_key is not None and s[metric.name] is not None:
            expected = {metric.log_key.format(k=k): s[metric.name][k] for k in ks} if metric.per_k else \
                {metric.log_key: s[metric.name]}
            assert expected.items() <= logs.items()
        if metric.row is not None:
            for row in [metric.row.format(k=k) for k in ks] if metric.per_k else [metric.row]:
                assert any(line.startswith(row + " ") for line in table.splitlines()), row


def test_tool_metrics_are_logged_and_printed_with_tool_rollouts_only():
    tools = {m.key: 0.5 for m in TOOL_METRICS}
    result = {"questions": 1, "n": 1, "ks": [1], "mean@n": 0.5, "pass@k": {1: 0.5}, "maj@k": None,
              **{m.name: None for m in EVAL_METRICS if m.name not in ("mean@n", "pass@k", "maj@k")}, "tools": tools}
    assert {m.log_key for m in TOOL_METRICS} <= set(log_metrics(result, [1]))
    assert set(log_keys([1], tools=True)) - set(log_keys([1], tools=False)) == {m.log_key for m in TOOL_METRICS}
    table = format_table({"tool": result, "plain": {**result, "tools": None}})
    assert all(m.row in table for m in TOOL_METRICS)
    assert not any(m.row in format_table({"plain": {**result, "tools": None}}) for m in TOOL_METRICS)
