"""The round driver on its own: scripted rounds, no model, no TRL trainer (trl_rlvr/sampling/driver.py)."""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from trl_rlvr.algorithms.advantages import group_advantages
from trl_rlvr.sampling.driver import RoundDriver
from trl_rlvr.sampling.rounds import RoundRecord

G = 4


class OneProcess:
    num_processes, process_index, device = 1, 0, torch.device("cpu")

    @staticmethod
    def gather(tensor):
        return tensor


def _args(**overrides):
    settings = dict(selective_sampling=False, generation_batch_size=8, seed=0, dynamic_sampling_metric="reward",
                    dynamic_sampling_tolerance=0.0, max_sampling_rounds=None, dynamic_sampling_oversample=None,
                    steps_per_generation=2, advantage_baseline="group_mean", advantage_std="population",
                    success_threshold=1.0, dynamic_sampling=True, resample_on_correct=False,
                    resample_on_correct_oversample=2, void_turn_action="off",
                    dynamic_sampling_partial_batch="trim")
    return SimpleNamespace(**{**settings, **overrides})


def scripted_rounds(rewards_by_round, metrics, extra_figure=None):
    """A ``score_round`` that plays the given rounds (global rewards per round), logging what TRL would: its per-row
    metric ``reward`` of every generated row, and, when given, a metric no list classifies."""
    rounds = iter(rewards_by_round)

    def score_round(rows, prompt_indices, drops_rows=False):
        rewards = torch.tensor(next(rounds))
        n = len(rewards)
        metrics["train"]["reward"].append(rewards.mean().item())  # TRL's: of every generated row
        metrics["train"]["num_tokens"] = [float(n)]
        if extra_figure:
            metrics["train"][extra_figure].append(rewards.mean().item())
        return scripted_round(rewards, prompt_indices, 100 * len(metrics["train"]["reward"]))

    return score_round


def scripted_round(rewards: torch.Tensor, prompt_indices, first_id: int, tool_errors=None):
    """What one round of TRL's generation and scoring hands the driver for ``rewards`` (N,): every row 3 completion
    tokens (ids from ``first_id``, distinct per round), TRL's group advantages -> (output, RoundRecord)."""
    n = len(rewards)
    ids = torch.arange(n)[:, None] + first_id
    output = {"prompt_ids": ids.repeat(1, 2), "prompt_mask": torch.ones(n, 2, dtype=torch.long),
              "completion_ids": ids.repeat(1, 3), "completion_mask": torch.ones(n, 3, dtype=torch.long),
              "advantages": group_advantages(rewards, G), "num_items_in_batch": torch.tensor(3 * n)}
    table = {"images": [], "prompt": list(range(n)), "completion": list(range(n)), "rewards": {"r": rewards.tolist()},
             "advantages": [], "extra": {}}
    notes = {} if tool_errors is None else {"tool_errors": tool_errors}
    record = RoundRecord(prompt_indices, None, rewards[:, None], rewards, torch.full((n,), 3.0),
                         torch.zeros(n, dtype=torch.bool), group_advantages(rewards, G, std="sample"), table,
                         notes=notes)
    return output, record


def driver_settings(args, score_round, metrics, rules=(), scale_rewards="group"):
    """RoundDriver's keywords around a scripted ``score_round``: one process, one reward ``r``, the population-std
    advantages of :func:`group_advantages`."""
    return dict(group_sizes=(G, G), accelerator=OneProcess(), score_round=score_round,
                compute_advantages=lambda rewards, size: group_advantages(rewards, size, scale_rewards),
                metrics=metrics, success_index=0, reward_weights=torch.ones(1), reward_func_names=["r"],
                scale_rewards=scale_rewards, mask_truncated_completions=False, pad_token_id=0, rules=rules)


def make_driver(rewards_by_round, rules=(), extra_figure=None, scale_rewards="group", **args):
    metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    score_round = scripted_rounds(rewards_by_round, metrics, extra_figure)
    driver = RoundDriver(_args(**args), [{"prompt": f"q{i}"} for i in range(40)],
                         **driver_settings(_args(**args), score_round, metrics, rules, scale_rewards))
    return driver, metrics


INFORMATIVE, FLAT = [1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]


def test_rounds_until_the_batch_is_full_of_groups_with_signal():
    driver, metrics = make_driver([FLAT + INFORMATIVE, FLAT + FLAT, INFORMATIVE + FLAT])
    batch, generation = driver.informative_batch(8)
    assert metrics["train"]["rlvr/sampling_rounds"] == [3]
    assert len(batch["advantages"]) == 8 and batch["num_items_in_batch"].item() == 8 * 3
    assert [rows.tolist() for rows in generation.trained] == [[4, 5, 6, 7], [0, 1, 2, 3]]
    torch.testing.assert_close(generation.advantages, batch["advantages"])
    assert len(generation.rounds) == 2 and generation.has_signal
    assert all(len(r.prompt_indices) == 2 for r in generation.rounds)  # a dataset row per group, from the stream


def test_the_record_is_immutable():
    driver, _ = make_driver([INFORMATIVE + INFORMATIVE])
    _, generation = driver.informative_batch(8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        generation.advantages = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        generation.rounds[0].rewards = None


def test_no_informative_group_gives_an_empty_batch_and_record(caplog):
    driver, metrics = make_driver([FLAT + FLAT] * 3, max_sampling_rounds=3)
    with caplog.at_level(logging.WARNING):
        batch, generation = driver.informative_batch(8)
    assert not generation.has_signal and generation.advantages is None
    assert batch["completion_mask"].sum() == 0 and batch["num_items_in_batch"] == 0
    assert "reward" not in metrics["train"]  # no trained row: no metric of the rows trained on


def test_trls_per_row_figures_are_the_trained_rows_and_the_generations_pass_through():
    driver, metrics = make_driver([FLAT + INFORMATIVE, INFORMATIVE + FLAT])
    driver.informative_batch(8)
    assert metrics["train"]["reward"] == [0.5]  # one value, of the 8 trained rows (TRL logged 0.75 and 0.75)
    assert metrics["train"]["num_tokens"] == [8.0]  # TRL sets it: the last round's, not a list of rounds


def test_a_figure_no_list_classifies_is_logged_as_of_the_generated_rows(caplog):
    """A newer TRL's metric of every generated row is not left under its name, where it would read as the trained
    rows' (here the generated rows' mean reward 0.75 against the trained rows' 0.5)."""
    driver, metrics = make_driver([FLAT + INFORMATIVE, INFORMATIVE + FLAT], extra_figure="reward_median_new")
    with caplog.at_level(logging.WARNING):
        driver.informative_batch(8)
    assert "reward_median_new" not in metrics["train"]
    assert metrics["train"]["generated/reward_median_new"] == [0.75, 0.75]
    assert any("reward_median_new" in r.getMessage() and "sampling/trained_metrics.py" in r.getMessage() for r in caplog.records)


def test_a_partial_batch_trims_to_full_micro_batches_or_pads_with_fillers():
    """One informative group (4 rows) where an update takes 8 micro-batches: 'trim' trains nothing, 'pad' trains its
    4 rows, the 4 slots left holding fillers (real tokens, no loss token, advantage 0)."""
    rounds = [FLAT + INFORMATIVE]
    trim, _ = make_driver(rounds, steps_per_generation=8, max_sampling_rounds=1)
    batch, generation = trim.informative_batch(8)
    assert not generation.has_signal and batch["completion_mask"].sum() == 0
    pad, metrics = make_driver(rounds, steps_per_generation=8, max_sampling_rounds=1,
                               dynamic_sampling_partial_batch="pad")
    batch, generation = pad.informative_batch(8)
    assert len(batch["advantages"]) == 8 and metrics["train"]["rlvr/filler_rows"] == [4]
    assert [rows.tolist() for rows in generation.trained] == [[4, 5, 6, 7]]
    torch.testing.assert_close(batch["advantages"][:4], group_advantages(torch.tensor(INFORMATIVE), G))
    torch.testing.assert_close(generation.advantages, batch["advantages"][:4])
    assert batch["completion_mask"][:4].all() and not batch["completion_mask"][4:].any()
    assert (batch["advantages"][4:] == 0).all() and batch["prompt_mask"][4:].all()  # attended, out of the loss
    assert batch["num_items_in_batch"].item() == 4 * 3  # the kept rows' tokens only
    assert metrics["train"]["reward"] == [0.5]  # TRL's metrics: of the 4 trained rows, not the fillers


def test_padding_keeps_every_kept_row_and_fills_only_the_last_micro_batches():
    """Three informative groups (12 rows), 8 micro-batches of an update: trim keeps 8 rows (a group dropped), pad all
    12 in 16 slots; under batch scaling the fillers' advantages stay 0."""
    rounds = [INFORMATIVE + INFORMATIVE, INFORMATIVE + FLAT]
    trim, _ = make_driver(rounds, steps_per_generation=8, max_sampling_rounds=2, generation_batch_size=8)
    batch, generation = trim.informative_batch(16)
    assert len(batch["advantages"]) == 8 and sum(len(r) for r in generation.trained) == 8
    pad, metrics = make_driver(rounds, steps_per_generation=8, max_sampling_rounds=2,
                               dynamic_sampling_partial_batch="pad", scale_rewards="batch")
    batch, generation = pad.informative_batch(16)
    assert len(batch["advantages"]) == 16 and sum(len(r) for r in generation.trained) == 12
    assert metrics["train"]["rlvr/filler_rows"] == [4]
    assert (batch["advantages"][:12] != 0).all() and (batch["advantages"][12:] == 0).all()
    assert batch["num_items_in_batch"].item() == 12 * 3
