"""Resample-on-correct in the round driver (rStar2-Agent's GRPO-RoC): scripted rounds, no model."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from tests.sampling.test_driver import G, _args, driver_settings, scripted_round
from trl_rlvr.algorithms.advantages import group_advantages
from trl_rlvr.sampling.driver import RoundDriver
from trl_rlvr.sampling.row_rules import ResampleOnCorrect

K = 2  # resample_on_correct_oversample: K x G rollouts sampled per prompt


def resampling_driver(rounds, **args):
    """A driver over scripted rounds of (rewards, tool errors), recording what each round was asked to generate."""
    metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    asked = []
    played = iter(rounds)

    def score_round(rows, prompt_indices, drops_rows=False):
        rewards, errors = (torch.tensor(x, dtype=torch.float32) for x in next(played))
        asked.append(([r["prompt"] for r in rows], prompt_indices))
        n = len(rewards)
        assert len(rows) == n, "the driver asks for K x G rollouts of each prompt"
        return scripted_round(rewards, prompt_indices, 1000 * len(asked), tool_errors=errors)

    settings = dict(resample_on_correct=True, resample_on_correct_oversample=K, dynamic_sampling=False)
    config = _args(**{**settings, **args})
    rule = ResampleOnCorrect(K, G, success_index=0, threshold=1.0, seed=config.seed,
                             log_metric=lambda name, value: metrics["train"][name].append(value))
    driver = RoundDriver(config, [{"prompt": f"q{i}"} for i in range(40)],
                         **driver_settings(config, score_round, metrics, rules=[rule]))
    return driver, metrics, asked


# two prompts, K x G = 8 rollouts each; the right answers of the first carry 0..3 tool errors
REWARDS_A = [1, 1, 1, 1, 0, 0, 0, 0]
ERRORS_A = [3, 0, 2, 1, 5, 5, 5, 5]
REWARDS_B = [0, 1, 0, 0, 0, 0, 0, 1]
ERRORS_B = [0, 4, 0, 0, 0, 0, 0, 0]


def test_each_prompt_is_sampled_k_times_g_and_g_are_kept_the_right_ones_with_fewest_errors():
    driver, metrics, asked = resampling_driver([(REWARDS_A + REWARDS_B, ERRORS_A + ERRORS_B)])
    batch, generation = driver.informative_batch(8)  # a generation batch of 8 rows = 2 groups of G
    prompts, indices = asked[0]
    assert len(prompts) == 16 and len(indices) == 2  # one round: 2 prompts x K x G rollouts
    assert prompts[:8] == [prompts[0]] * 8 and prompts[8:] == [prompts[8]] * 8
    (trained,) = generation.trained
    # group A: 4 right / 4 wrong -> keeps 2 right (errors 0 and 1: rows 1, 3) and 2 of the wrong rows 4-7;
    # group B: 2 right / 6 wrong -> round(4 * 2/8) = 1 right (row 15: 0 errors, not row 9 with 4) and 3 wrong
    a, b = trained[:4].tolist(), trained[4:].tolist()
    assert [r for r in a if r < 4] == [1, 3] and all(4 <= r < 8 for r in a if r >= 4) and len(a) == 4
    assert [r for r in b if REWARDS_B[r - 8] == 1] == [15] and len(b) == 4
    # the advantages are those of the kept groups of G, not of the round's sampled rows
    rewards = torch.tensor([float((REWARDS_A + REWARDS_B)[r]) for r in trained.tolist()])
    torch.testing.assert_close(batch["advantages"], group_advantages(rewards, G))
    torch.testing.assert_close(generation.advantages, batch["advantages"])
    assert batch["num_items_in_batch"].item() == 8 * 3
    assert metrics["train"]["rlvr/sampled_right_tool_errors"] == [pytest.approx((3 + 0 + 2 + 1 + 4 + 0) / 6)]
    assert metrics["train"]["rlvr/resampled_right_tool_errors"] == [pytest.approx((0 + 1 + 0) / 3)]


def test_with_dynamic_sampling_the_kept_groups_are_judged_and_refilled():
    """A sampled group whose answers are all wrong has no signal after resampling either; dynamic sampling drops it
    and refills with a second round."""
    flat = ([0] * 8, [0] * 8)
    driver, metrics, asked = resampling_driver(
        [(REWARDS_A + flat[0], ERRORS_A + flat[1]), (REWARDS_B + REWARDS_A, ERRORS_B + ERRORS_A)],
        dynamic_sampling=True)
    batch, generation = driver.informative_batch(8)
    assert metrics["train"]["rlvr/sampling_rounds"] == [2] and len(batch["advantages"]) == 8
    assert all((batch["advantages"].view(-1, G) != 0).any(dim=1))
    assert generation.trained[0].tolist()[:2] == [1, 3]  # round 1, group A: the two cleanest right answers


def test_draws_are_seeded():
    runs = [resampling_driver([(REWARDS_A + REWARDS_B, ERRORS_A + ERRORS_B)])[0].informative_batch(8)[1].trained[0]
            for _ in range(2)]
    assert runs[0].tolist() == runs[1].tolist()
    other = resampling_driver([(REWARDS_A + REWARDS_B, ERRORS_A + ERRORS_B)], seed=1)[0].informative_batch(8)[1]
    assert other.trained[0][:2].tolist() == [1, 3]  # the choice of right answers does not depend on the seed
