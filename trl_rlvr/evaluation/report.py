"""Presenting sampled evaluations (:func:`trl_rlvr.evaluation.evaluate.evaluate_sampled` results) of one or more models:
a text table, a PNG of pass@k (and maj@k) against k with one curve per model, and the base-vs-trained sentence."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from trl_rlvr.evaluation.metric_table import num as _num
from trl_rlvr.evaluation.metric_table import pct as _pct


def _get(d: Mapping | None, k: int):
    """``d[k]`` for a dict with int keys, or with str keys (read back from JSON)."""
    if d is None:
        return None
    return d.get(k, d.get(str(k)))


def format_table(results: Mapping[str, dict]) -> str:
    """One column per model (label -> result), one row per metric of
    :data:`trl_rlvr.evaluation.metric_table.EVAL_METRICS` that has a ``row`` (per k: a row per k; ``n/a`` where a model's
    metric is not defined) and, when a model ran tool rollouts, per :data:`~trl_rlvr.evaluation.metric_table.TOOL_METRICS`
    (:func:`~trl_rlvr.evaluation.metric_table.text_table`'s layout)."""
    from trl_rlvr.evaluation.metric_table import EVAL_METRICS, TOOL_METRICS, text_table

    labels = list(results)
    first = next(iter(results.values()))
    ks = first["ks"]
    rows = [("questions x samples", [f"{r['questions']} x {r['n']}" for r in results.values()]),
            (f"mean@{first['n']} (= pass@1)", [_pct(r["mean@n"]) for r in results.values()])]
    for metric in EVAL_METRICS:
        if metric.row is None:
            continue
        if metric.per_k:
            rows += [(metric.row.format(k=k), [metric.fmt(_get(r[metric.name], k)) if r[metric.name] else "n/a"
                                               for r in results.values()]) for k in ks]
        else:
            rows.append((metric.row, [metric.fmt(r[metric.name]) for r in results.values()]))
    if any(r.get("tools") for r in results.values()):  # tool rollouts (trl_rlvr.evaluation.tool_rollouts)
        rows += [(m.row, [m.fmt(r["tools"][m.key]) if r.get("tools") else "n/a" for r in results.values()])
                 for m in TOOL_METRICS]
    rows.append(("sampling + scoring (s)", [_num(r.get("seconds")) for r in results.values()]))
    notes = {r.get("maj_note") for r in results.values() if r.get("maj_note")}
    return text_table(labels, rows, sorted(notes))


def headless_pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed), or ``None`` with a message on stderr when
    matplotlib is not installed: every plot of the project and its examples is optional."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'trl-rlvr[examples]'): no plot written", file=sys.stderr)
        return None
    return plt


def plot_training_curves(history: list[Mapping], panels, path: str | Path) -> Path | None:
    """Training curves from a log history (one dict per logging step, with ``"step"``), one panel per entry of
    ``panels``: ``(title, [(key, style, label), ...])``, a key being a logged metric; a panel may instead give its
    own points as ``(title, [((xs, ys), style, label), ...])``. Missing values are gaps. Returns the path, or ``None``
    (with a message) when matplotlib is not installed."""
    plt = headless_pyplot()
    if plt is None:
        return None
    steps = [h["step"] for h in history]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (title, lines) in zip(axes[0], panels):
        for source, style, label in lines:
            xs, ys = source if isinstance(source, tuple) else (steps, [h.get(source, float("nan")) for h in history])
            ax.plot(xs, ys, style, label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def plot_passk(results: Mapping[str, dict], path: str | Path, title: str | None = None) -> Path | None:
    """pass@k against k (log2 axis), one curve per model; a second panel with maj@k when it is defined.

    Returns the path, or ``None`` (with a message) when matplotlib is not installed."""
    plt = headless_pyplot()
    if plt is None:
        return None
    with_maj = any(r.get("maj@k") for r in results.values())
    fig, axes = plt.subplots(1, 2 if with_maj else 1, figsize=(11 if with_maj else 6, 4.2), squeeze=False)
    panels = [("pass@k", "pass@k (unbiased estimator)")] + ([("maj@k", "maj@k (majority vote)")] if with_maj else [])
    all_ks = sorted({k for r in results.values() for k in r["ks"]})
    for ax, (key, ylabel) in zip(axes[0], panels):
        for label, r in results.items():
            if not r.get(key):
                continue
            ks = r["ks"]
            ax.plot(ks, [_get(r[key], k) for k in ks], "o-", label=f"{label} (n={r['n']})")
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_ks, [str(k) for k in all_ks])
        ax.set_xlabel("k (samples per question)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    first = next(iter(results.values()))
    fig.suptitle(title or f"{first['questions']} questions, T={first['temperature']}, top_p={first['top_p']}, "
                 f"max_new_tokens={first['max_new_tokens']}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def compare_sentence(base: dict, trained: dict, base_label: str = "base", trained_label: str = "trained") -> str:
    """One sentence: does the trained model's pass@k advantage over the base shrink as k grows?"""
    ks = [k for k in trained["ks"] if k in base["ks"]]
    lo, hi = ks[0], ks[-1]
    gap_lo = _get(trained["pass@k"], lo) - _get(base["pass@k"], lo)
    gap_hi = _get(trained["pass@k"], hi) - _get(base["pass@k"], hi)
    if abs(gap_hi - gap_lo) < 0.02:
        trend = "is about the same at every k"
    elif gap_hi < gap_lo:
        trend = "shrinks as k grows" + (" and reverses (the base model solves more at large k)" if gap_hi < 0 else "")
    else:
        trend = "grows with k"
    return (f"The {trained_label} model's pass@k advantage over the {base_label} model {trend}: "
            f"{gap_lo:+.1%} at k={lo} ({_pct(_get(base['pass@k'], lo))} -> {_pct(_get(trained['pass@k'], lo))}), "
            f"{gap_hi:+.1%} at k={hi} ({_pct(_get(base['pass@k'], hi))} -> {_pct(_get(trained['pass@k'], hi))}).")


class SampledComparison:
    """Sampled evaluations of one model at several points (base, trained) on the same questions and samples'
    seeds, then one table, one pass@k plot and the base-vs-trained sentence (what
    :class:`trl_rlvr.evaluation.heldout.HeldOutReport` runs)::

        cmp = SampledComparison(test_set, success_fn, format_fn, n=8, num_questions=8, accelerator=acc)
        cmp.run("base", model, tokenizer); trainer.train(); cmp.run("trained", model, tokenizer)
        report = cmp.report(out_dir / "r1zero_passk.png")   # on the main process
    """

    def __init__(self, dataset, success_fn, format_fn=None, *, n: int = 8, num_questions: int | None = None,
                 **eval_kwargs):
        if num_questions is not None and num_questions < len(dataset):
            dataset = dataset.select(range(num_questions))
        self.dataset, self.success_fn, self.format_fn = dataset, success_fn, format_fn
        self.n, self.eval_kwargs = n, eval_kwargs
        self.results: dict[str, dict] = {}

    def run(self, label: str, model, tokenizer) -> dict:
        from trl_rlvr.evaluation.evaluate import evaluate_sampled

        self.results[label] = evaluate_sampled(model, tokenizer, self.dataset, self.success_fn, self.format_fn,
                                               n=self.n, **self.eval_kwargs)
        return self.results[label]

    def report(self, plot_path: str | Path | None = None) -> dict:
        """``{"results", "table", "sentence", "plot"}``; the sentence compares the first and last runs."""
        labels = list(self.results)
        sentence = compare_sentence(self.results[labels[0]], self.results[labels[-1]], labels[0], labels[-1]) \
            if len(labels) > 1 else None
        plot = plot_passk(self.results, plot_path) if plot_path is not None and self.results else None
        return {"results": self.results, "table": format_table(self.results) if self.results else "",
                "sentence": sentence, "plot": str(plot) if plot else None}
