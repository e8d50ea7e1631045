"""One group's advantages as the asynchronous trainer's reward process computes them: TRL's formula where the
switches are TRL's, the reward weights, the unscorable rule, the baselines, and dynamic sampling's test."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.algorithms.group_scores import group_scores

NAN = math.nan


def trl_async_advantages(rewards_per_func: list[list[float]]) -> list[float]:
    """TRL 1.16's _AsyncRolloutLoop._score_group, written out: nansum of the functions, a row every function left
    unscored is NaN and gets 0, (r - mean) / (std + 1e-8) over the scored rows, population std."""
    arr = np.array(rewards_per_func, dtype=float).T  # (F, G), as TRL holds it
    all_nan = np.all(np.isnan(arr), axis=0)
    rewards = np.nansum(arr, axis=0)
    rewards[all_nan] = np.nan
    scored = ~np.isnan(rewards)
    adv = np.zeros_like(rewards)
    if scored.any():
        adv[scored] = (rewards[scored] - rewards[scored].mean()) / (rewards[scored].std() + 1e-8)
    return adv.tolist()


cell = st.one_of(st.just(NAN), st.floats(-2, 2, allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3).flatmap(lambda f: st.lists(st.lists(cell, min_size=f, max_size=f), min_size=2, max_size=8)))
def test_trls_switches_give_trls_advantages(rows):
    got = group_scores(torch.tensor(rows, dtype=torch.float64), [1.0] * len(rows[0]), (), eps=1e-8)
    assert got.advantages.tolist() == pytest.approx(trl_async_advantages(rows), rel=1e-9, abs=1e-9)


def test_weights_scale_each_function():
    # correctness, overlong penalty (weight 0.5): the long right answer loses half its penalty
    rows = torch.tensor([[1.0, -1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    got = group_scores(rows, [1.0, 0.5], ())
    assert got.rewards.tolist() == [0.5, 1.0, 0.0, 0.0]


def test_an_unscored_correctness_check_leaves_the_row_out():
    rows = torch.tensor([[1.0, 1.0], [NAN, 1.0], [1.0, 1.0], [0.0, 0.0]])  # row 1: the check failed, format scored
    got = group_scores(rows, [1.0, 1.0], (0,))
    assert got.unscorable.tolist() == [False, True, False, False]
    assert got.advantages[1] == 0 and math.isnan(got.rewards[1])
    scored = torch.tensor([2.0, 2.0, 0.0], dtype=torch.float64)
    assert got.advantages[[0, 2, 3]].tolist() == pytest.approx(((scored - scored.mean()) / (scored.std(unbiased=False)
                                                                                             + 1e-4)).tolist())
    # TRL's rule alone would train it as a wrong answer with its format score
    assert group_scores(rows, [1.0, 1.0], ()).advantages[1] != 0


def test_baselines_and_scales():
    rows = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    rloo = group_scores(rows, [1.0], (), baseline="leave_one_out", scale_rewards="none")
    assert rloo.advantages.tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    none = group_scores(rows, [1.0], (), scale_rewards="none")
    assert none.advantages.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    with pytest.raises(ValueError, match="scale_rewards must be one of"):
        group_scores(rows, [1.0], (), scale_rewards="batch")


def test_informative_is_dynamic_samplings_test():
    assert group_scores(torch.tensor([[1.0], [0.0]]), [1.0]).informative
    assert not group_scores(torch.tensor([[1.0], [1.0]]), [1.0]).informative
    assert not group_scores(torch.tensor([[1.0], [NAN], [1.0]]), [1.0]).informative  # the unscored row ignored
    assert not group_scores(torch.tensor([[1.0], [NAN]]), [1.0]).informative  # one scored row: no signal
    assert group_scores(torch.tensor([[1.0], [0.9]]), [1.0], tolerance=0.05).informative
    assert not group_scores(torch.tensor([[1.0], [0.99]]), [1.0], tolerance=0.05).informative
