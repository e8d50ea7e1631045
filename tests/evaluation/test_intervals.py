"""The bootstrap interval over questions: against an exact reference (every resample enumerated), scipy's
percentile bootstrap, and its invariants."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.evaluation.intervals import bootstrap_interval, per_question_accuracy


def exact_bootstrap_means(values):
    """The bootstrap distribution of the mean, exactly: the means of every one of the Q**Q resamples (equally
    likely)."""
    return np.array([np.mean(draw) for draw in itertools.product(values, repeat=len(values))])


def test_the_interval_is_the_exact_bootstrap_distributions_percentiles():
    values = [0.0, 0.25, 0.5, 1.0, 1.0, 0.75]  # 6**6 = 46656 resamples, enumerated
    exact = np.quantile(exact_bootstrap_means(values), [0.025, 0.975])
    for seed in range(3):  # the distribution is discrete (steps of 1/24): the sampled cut lands on the exact one
        assert bootstrap_interval(values, resamples=100_000, seed=seed) == pytest.approx(tuple(exact), abs=1e-12)
    assert tuple(exact) == pytest.approx((7 / 24, 21 / 24))


def test_it_matches_scipys_percentile_bootstrap():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    values = rng.integers(0, 5, size=64) / 4  # 64 questions x 4 samples, as the job's dev split
    ours = bootstrap_interval(values, resamples=50_000, seed=2)
    ref = scipy_stats.bootstrap((values,), np.mean, confidence_level=0.95, n_resamples=50_000, method="percentile",
                                random_state=5).confidence_interval
    assert ours == pytest.approx((ref.low, ref.high), abs=0.006)
    # and the normal approximation of a mean of 64 values: +- 1.96 standard errors
    half = 1.96 * values.std(ddof=1) / np.sqrt(len(values))
    assert ours == pytest.approx((values.mean() - half, values.mean() + half), abs=0.01)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), min_size=1, max_size=40), st.integers(0, 3),
       st.floats(-1, 1))
def test_invariants(values, seed, shift):
    low, high = bootstrap_interval(values, resamples=500, seed=seed)
    assert min(values) <= low <= high <= max(values)
    assert (low, high) == bootstrap_interval(values, resamples=500, seed=seed)  # seeded
    shifted = bootstrap_interval([v + shift for v in values], resamples=500, seed=seed)  # the same resamples
    assert shifted == pytest.approx((low + shift, high + shift), abs=1e-9)
    if len(set(values)) == 1:
        assert low == high == values[0]
    wider = bootstrap_interval(values, confidence=0.99, resamples=500, seed=seed)
    assert wider[0] <= low and high <= wider[1]


def test_per_question_accuracy_and_bad_inputs_are_named():
    records = [{"right": 3, "right_flags": [1, 1, 1, 0]}, {"right": 0, "right_flags": [0, 0]}]
    assert per_question_accuracy(records) == [0.75, 0.0]
    for bad, match in (([], "non-empty"), ([0.5, float("nan")], "finite")):
        with pytest.raises(ValueError, match=match):
            bootstrap_interval(bad)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_interval([0.5], confidence=95)
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_interval([0.5], resamples=0)
