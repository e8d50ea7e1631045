"""A row is unscorable as a whole when a correctness check returned None (NaN), whatever the other functions gave it."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.algorithms.advantages import group_advantages
from trl_rlvr.algorithms.unscorable import mark_unscorable, total_rewards, unscorable_rows

NAN = float("nan")


def test_a_failed_check_beside_a_format_score_leaves_the_baseline():
    """think_format + boxed_math: a row whose check failed on the machinery (None) used to be trained as a wrong
    answer with its format score (advantage -0.577 beside the wrong answers of its group)."""
    weights = torch.tensor([1.0, 1.0])  # think_format, boxed_math
    rewards = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, NAN], [1.0, 0.0]])
    marked, rows = mark_unscorable(rewards, checks=[1])
    assert rows.tolist() == [False, False, True, False] and marked[2].isnan().all()
    totals = total_rewards(marked, weights)
    assert totals[2].isnan() and totals[[0, 1, 3]].tolist() == [2.0, 1.0, 1.0]
    advantages = group_advantages(totals, 4)
    assert advantages[2].item() == 0.0
    assert torch.allclose(advantages[[0, 1, 3]], group_advantages(totals[[0, 1, 3]], 3))  # a group of the other 3
    trls_rule = total_rewards(rewards, weights)  # TRL's rule alone: the row scores its format as a wrong answer
    assert trls_rule[2].item() == 1.0 and group_advantages(trls_rule, 4)[2].item() < 0


def test_a_group_whose_checks_all_failed_trains_on_nothing():
    weights = torch.tensor([1.0, 1.0])
    rewards = torch.tensor([[1.0, NAN], [0.0, NAN], [1.0, NAN], [0.0, NAN]])  # format varies, no check scored
    totals = total_rewards(mark_unscorable(rewards, [1])[0], weights)
    assert totals.isnan().all() and (group_advantages(totals, 4) == 0).all()
    assert (group_advantages(total_rewards(rewards, weights), 4) != 0).all()  # TRL's rule: trained on format alone


def test_without_checks_the_rule_is_trls():
    rewards = torch.tensor([[NAN, NAN], [1.0, NAN]])
    assert unscorable_rows(rewards, []).tolist() == [True, False]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.integers(1, 4), st.data())
def test_unscorable_rows_have_nan_totals_and_the_others_trls(n, funcs, data):
    value = st.one_of(st.just(NAN), st.floats(-3, 3, allow_nan=False, width=32))
    rewards = torch.tensor(data.draw(st.lists(st.lists(value, min_size=funcs, max_size=funcs), min_size=n,
                                              max_size=n)))
    weights = torch.tensor(data.draw(st.lists(st.floats(-2, 2, width=32), min_size=funcs, max_size=funcs)))
    checks = data.draw(st.lists(st.integers(0, funcs - 1), max_size=funcs, unique=True))
    marked, rows = mark_unscorable(rewards, checks)
    totals = total_rewards(marked, weights)
    expected_rows = rewards.isnan().all(dim=1) | (rewards[:, checks].isnan().any(dim=1) if checks else False)
    assert torch.equal(rows, expected_rows) and torch.equal(totals.isnan(), rows)
    trl = (rewards * weights).nansum(dim=1)  # TRL's sum, for every row left scorable
    assert torch.allclose(totals[~rows], trl[~rows])
    assert torch.equal(mark_unscorable(marked, checks)[0].isnan(), marked.isnan())  # marking twice changes nothing
