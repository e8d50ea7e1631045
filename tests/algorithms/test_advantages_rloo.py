"""The leave-one-out baseline (RLOO): the pure function against its definition, the unbiasedness it is for
(derived and checked exactly), and the trainer's gradient against a reference on 1 and 2 processes."""

import itertools

import pytest
import torch

from tests.harness.launch import launch_on_cpu
from tests.harness.loss_harness import (
    FIXED_REWARDS,
    NORMALIZATIONS,
    assert_grads_equal,
    fixed_batch,
    reference_advantages,
    reference_grads,
    run_trainer,
    select_rows,
)
from trl_rlvr.algorithms.advantages import group_advantages, zero_signal_groups
from trl_rlvr.testing import load_tokenizer

HARNESS = ("--module", "tests.harness.loss_harness")


# ----------------------------------------------------------------------------------------------- the function
@pytest.mark.parametrize("group_size", [2, 3, 4, 8])
def test_leave_one_out_is_its_definition(group_size):
    g = torch.Generator().manual_seed(group_size)
    rewards = torch.randint(0, 3, (6 * group_size,), generator=g).double() / 2
    rewards[torch.rand(rewards.shape, generator=g) < 0.15] = float("nan")  # unscored answers
    got = group_advantages(rewards, group_size, "none", baseline="leave_one_out")
    want = reference_advantages(rewards, "leave_one_out", "none", group_size=group_size, dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_leave_one_out_scales_the_group_mean_by_g_over_g_minus_1():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5])
    for scale in ("none", "group", "batch"):
        mean = group_advantages(rewards, 4, scale)
        loo = group_advantages(rewards, 4, scale, baseline="leave_one_out")
        torch.testing.assert_close(loo, mean * 4 / 3)
    assert group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, "none", baseline="leave_one_out").tolist() == [
        1.0, pytest.approx(-1 / 3), pytest.approx(-1 / 3), pytest.approx(-1 / 3)]


def test_zero_signal_groups_are_the_same_set():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.3, 0.3, float("nan"), 0.3])
    loo = group_advantages(rewards, 4, "group", baseline="leave_one_out").view(-1, 4)
    assert ((loo == 0).all(dim=1)).tolist() == zero_signal_groups(rewards, 4).tolist() == [True, False, True]


def test_unknown_baseline_is_named():
    with pytest.raises(ValueError, match="advantage_baseline='rloo'.*'leave_one_out'"):
        group_advantages(torch.zeros(4), 4, baseline="rloo")


# ---------------------------------------------------------------------------------------- the unbiasedness
# A policy over K answers, pi = softmax(theta), reward r(y). The policy gradient is
#     grad J = E_y[r(y) grad log pi(y)] = sum_y pi_y r_y (e_y - pi).
# One group of G answers gives the estimate g = (1/G) sum_i A_i (e_{y_i} - pi). With the leave-one-out baseline
# b_i = mean_{j != i} r(y_j) is independent of y_i, and E[grad log pi(y_i)] = 0, so E[g] = grad J exactly. With the
# group mean, r_i - mean = (G-1)/G (r_i - b_i), so E[g] = (G-1)/G grad J: biased by that factor, in scale only.
THETA = torch.tensor([0.3, -0.2, 0.9, 0.0], dtype=torch.float64)
REWARD = torch.tensor([1.0, 0.0, 0.25, 0.6], dtype=torch.float64)


def _policy():
    return torch.softmax(THETA, dim=0)


def _true_gradient():
    pi = _policy()
    return sum(pi[y] * REWARD[y] * (torch.eye(len(pi), dtype=torch.float64)[y] - pi) for y in range(len(pi)))


def _group_estimates(answers: torch.Tensor, baseline: str) -> torch.Tensor:
    """Policy-gradient estimates of groups (rows of ``answers``), scale_rewards='none'."""
    groups, group_size = answers.shape
    pi = _policy()
    advantages = group_advantages(REWARD[answers].reshape(-1), group_size, "none", baseline=baseline)
    scores = torch.nn.functional.one_hot(answers.reshape(-1), len(pi)).double() - pi  # grad log pi(y)
    return (advantages[:, None] * scores).view(groups, group_size, -1).mean(dim=1)


@pytest.mark.parametrize("group_size", [2, 3, 4])
def test_expected_gradient_exactly_by_enumeration(group_size):
    pi = _policy()
    answers = torch.tensor(list(itertools.product(range(len(pi)), repeat=group_size)))
    weights = pi[answers].prod(dim=1)  # probability of each group
    assert float(weights.sum()) == pytest.approx(1.0, abs=1e-12)
    truth = _true_gradient()
    expected = {b: (weights[:, None] * _group_estimates(answers, b)).sum(dim=0) for b in ("leave_one_out", "group_mean")}
    torch.testing.assert_close(expected["leave_one_out"], truth, atol=1e-12, rtol=0)
    torch.testing.assert_close(expected["group_mean"], truth * (group_size - 1) / group_size, atol=1e-12, rtol=0)
    assert (expected["group_mean"] - truth).abs().max() > 1e-3  # the bias is real, not rounding


def test_sampled_leave_one_out_gradients_converge_to_the_true_one():
    group_size, groups = 4, 200_000
    g = torch.Generator().manual_seed(0)
    answers = torch.multinomial(_policy(), groups * group_size, replacement=True, generator=g).view(groups, group_size)
    truth = _true_gradient()
    for baseline, factor in (("leave_one_out", 1.0), ("group_mean", (group_size - 1) / group_size)):
        estimates = _group_estimates(answers, baseline)
        standard_error = estimates.std(dim=0) / groups**0.5
        assert ((estimates.mean(dim=0) - factor * truth).abs() <= 5 * standard_error).all(), baseline
    loo_error = (_group_estimates(answers, "group_mean").mean(dim=0) - truth).abs().max()
    assert loo_error > 10 * (_group_estimates(answers, "leave_one_out").std(dim=0) / groups**0.5).max()


# -------------------------------------------------------------------------------------- the trainer's gradient
def _check(model_dir, grads, rows, normalization, scale_rewards):
    batch = fixed_batch(len(load_tokenizer(model_dir)))
    batch["advantages"] = reference_advantages(FIXED_REWARDS, "leave_one_out", scale_rewards)
    assert_grads_equal(grads, reference_grads(model_dir, select_rows(batch, rows), normalization))


@pytest.mark.parametrize("scale_rewards", ["none", "group"])
@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_trainer_gradient_with_leave_one_out(tiny_model_dir, normalization, scale_rewards):
    (grads,), (rows,), _ = run_trainer(
        tiny_model_dir, normalization, rewards=FIXED_REWARDS, advantage_baseline="leave_one_out",
        scale_rewards=scale_rewards,
    )
    _check(tiny_model_dir, grads, rows, normalization, scale_rewards)


def test_the_trainer_check_can_fail(tiny_model_dir):
    """Guards the test above: the group-mean baseline's gradient is not the leave-one-out reference."""
    (grads,), (rows,), _ = run_trainer(tiny_model_dir, "per_batch_token", rewards=FIXED_REWARDS, scale_rewards="none")
    with pytest.raises(AssertionError):
        _check(tiny_model_dir, grads, rows, "per_batch_token", "none")


@pytest.mark.slow
def test_trainer_gradient_with_leave_one_out_on_two_processes(tiny_model_dir, tmp_path):
    out = tmp_path / "grads.pt"
    launch_on_cpu(*HARNESS, tiny_model_dir, out, ",".join(NORMALIZATIONS), 2, 2, "leave_one_out")
    results = torch.load(out)
    assert results.pop("num_processes") == 2
    for normalization in NORMALIZATIONS:
        (grads,), (rows,) = results[normalization]["grads"], results[normalization]["rows"]
        assert rows.shape[0] == 8
        _check(tiny_model_dir, grads, rows, normalization, "none")


def test_config_validates_the_switch():
    from trl_rlvr import RLVRConfig

    with pytest.raises(ValueError, match="advantage_baseline='rloo'"):
        RLVRConfig(output_dir="/tmp/x", bf16=False, advantage_baseline="rloo")
    with pytest.raises(ValueError, match="multi_objective_aggregation='sum_then_normalize'"):
        RLVRConfig(output_dir="/tmp/x", bf16=False, advantage_baseline="leave_one_out",
                   multi_objective_aggregation="normalize_then_sum")
