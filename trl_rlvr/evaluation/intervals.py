"""How sure a held-out pass@1 is: a percentile bootstrap over questions (pure functions, numpy only).

pass@1 over ``Q`` questions is the mean of the per-question accuracies ``x_q = c_q / n`` (``c_q`` of ``n`` samples
right). The questions are the sampled unit (the samples of one question are not independent draws of the task), so
the interval resamples questions: ``B`` times, draw ``Q`` questions with replacement and take their mean; the 95%
interval is the 2.5th and 97.5th percentiles of those ``B`` means (Efron & Tibshirani 1993, "An Introduction to the
Bootstrap", ch. 13, the percentile interval). For a difference between two arms on the same questions (RL against
its cold start) pass the per-question differences ``x_q - y_q``: the paired bootstrap, which keeps each question's
difficulty out of the spread.

With ``Q = 32`` questions and pass@1 near 70% the interval is about +-8 points wide: a column of 32 questions
cannot tell a 5-point gain from noise.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["bootstrap_interval", "per_question_accuracy"]


def per_question_accuracy(per_question: Sequence[dict]) -> list[float]:
    """``c_q / n_q`` of each question of an evaluation's ``per_question`` records (``right`` of ``right_flags``)."""
    return [record["right"] / len(record["right_flags"]) for record in per_question]


def bootstrap_interval(values: Sequence[float], *, confidence: float = 0.95, resamples: int = 10_000,
                       seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``values`` (one value per question): ``resamples`` means of
    ``len(values)`` values drawn with replacement, cut at ``(1 - confidence) / 2`` and ``(1 + confidence) / 2``
    (numpy's linear percentile). Seeded: the same arguments give the same interval. ``ValueError`` for no values,
    a non-finite value, ``confidence`` outside (0, 1) or ``resamples < 1``."""
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"bootstrap_interval: values must be a non-empty list of numbers, got {len(x)} values")
    if not np.isfinite(x).all():
        raise ValueError("bootstrap_interval: values must be finite (a question without samples has no accuracy)")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"bootstrap_interval: confidence must be in (0, 1), got {confidence!r}")
    if not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"bootstrap_interval: resamples must be a positive integer, got {resamples!r}")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, 2_000_000 // x.size)  # bounded memory: at most ~16 MB of indices at once
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        means[start:stop] = x[rng.integers(0, x.size, size=(stop - start, x.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)
