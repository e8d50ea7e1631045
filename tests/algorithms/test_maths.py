"""The pure maths: the worked examples of the GRPO literature, zero-signal arithmetic, overlong parameters, diagnostics."""

import math

import pytest
import torch

from trl_rlvr.algorithms.advantages import expected_zero_signal_frac, group_advantages, zero_signal_groups
from trl_rlvr.algorithms.losses import per_step_num_items
from trl_rlvr.algorithms.metrics import rollout_metrics
from trl_rlvr.algorithms.shaping import validate_overlong


def test_worked_example_two_right_two_wrong():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-3, rtol=0)


def test_worked_example_one_rare_success():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4)
    assert adv[0].item() == pytest.approx(1.73, abs=5e-3)
    assert adv[1:].tolist() == pytest.approx([-0.58] * 3, abs=5e-3)


def test_dr_grpo_advantage_is_only_centered():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4, scale_rewards="none")
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_batch_scaling_and_unscorable_answers():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, math.nan])
    adv = group_advantages(rewards, group_size=4, scale_rewards="batch")
    valid = rewards[~torch.isnan(rewards)]
    batch_std = ((valid - valid.mean()) ** 2).mean().sqrt()
    assert adv[0].item() == pytest.approx(0.75 / (batch_std.item() + 1e-4), rel=1e-5)
    assert adv[7].item() == 0.0  # unscorable answer: no signal
    assert adv[4].item() == pytest.approx((1 - 2 / 3) / (batch_std.item() + 1e-4), rel=1e-5)


def test_all_equal_group_has_zero_advantage():
    assert group_advantages(torch.ones(8), group_size=8).abs().max().item() == 0.0


@pytest.mark.parametrize("p,G,expected", [(0.9, 4, 0.66), (0.9, 16, 0.19), (0.5, 2, 0.5)])
def test_expected_wasted_groups(p, G, expected):
    assert expected_zero_signal_frac(p, G) == pytest.approx(expected, abs=0.005)


def test_zero_signal_groups_exact_tolerance_and_nan():
    rewards = torch.tensor([1, 1, 1, 1, 1, 0, 1, 1, 0.5, 0.5001, 0.5, 0.5, 1, math.nan, math.nan, math.nan])
    assert zero_signal_groups(rewards, 4).tolist() == [True, False, False, True]
    assert zero_signal_groups(rewards, 4, tolerance=1e-3).tolist() == [True, False, True, True]


@pytest.mark.parametrize(
    "args,field",
    [((20, 0, 1.0), "overlong_buffer_length"), ((20, 21, 1.0), "overlong_buffer_length"),
     ((20, 4, -1.0), "overlong_penalty_factor"), ((None, 4, 1.0), "max_completion_length")],
)
def test_overlong_penalty_rejects_bad_parameters(args, field):
    with pytest.raises(ValueError, match=field):
        validate_overlong(*args)


def test_per_step_num_items_makes_trl_divisor_the_step_token_count():
    counts = torch.tensor([10.0, 30.0, 5.0, 15.0])  # 4 micro-batches, 2 per optimizer step
    items = per_step_num_items(counts, gradient_accumulation_steps=2)
    # TRL divides by items / P * GA / spg; with P = 1 that must be the step's tokens: 40 and 20.
    assert (items * 2 / 4).tolist() == [40.0, 40.0, 20.0, 20.0]
    with pytest.raises(ValueError, match="multiple"):
        per_step_num_items(torch.ones(3), gradient_accumulation_steps=2)


def test_rollout_metrics():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    success = rewards.clone()
    lengths = torch.tensor([2, 6, 4, 8, 3, 3, 3, 3])
    truncated = torch.tensor([False, False, False, True, False, False, False, False])
    m = rollout_metrics(rewards, success, lengths, truncated, group_size=4)
    assert m["rlvr/accuracy"] == 0.75
    assert m["rlvr/length_right"] == pytest.approx((2 + 4 + 12) / 6)
    assert m["rlvr/length_wrong"] == 7.0
    assert m["rlvr/zero_signal_frac"] == 0.5
    assert m["rlvr/zero_signal_expected"] == pytest.approx(0.75**4 + 0.25**4)
    assert m["rlvr/truncated_frac"] == 0.125
    assert math.isnan(rollout_metrics(torch.ones(4), torch.ones(4), lengths[:4], truncated[:4], 4)["rlvr/length_wrong"])
