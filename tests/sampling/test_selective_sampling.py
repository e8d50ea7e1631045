"""Selective sampling: the pure prediction and skip rule, the history in the prompt stream, the trainer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.harness.dynamic_sampling_harness import mixed_reward, run
from tests.harness.launch import launch_on_cpu
from tests.harness.selective_sampling_harness import make_selective_trainer, record_rounds
from trl_rlvr.sampling.dynamic import PromptStream, prompts_for_round
from trl_rlvr.sampling.selective import (
    FORCED_REVISIT_TAIL,
    PromptHistory,
    max_consecutive_skips,
    predicts_zero_signal,
    record_groups,
    revisit_draw,
    should_skip,
)

ROOT = Path(__file__).resolve().parents[2]

# -- the pure rule ----------------------------------------------------------------------------------------------------


def test_a_prompt_is_predicted_zero_signal_only_after_window_zero_signal_groups():
    assert not predicts_zero_signal([], 1)  # never seen: always sampled
    assert predicts_zero_signal([True], 1)
    assert not predicts_zero_signal([True], 2)
    assert not predicts_zero_signal([True, False], 1)
    assert predicts_zero_signal([False, True, True], 2)
    assert not predicts_zero_signal([True, False, True], 2)


def test_max_consecutive_skips_is_the_smallest_k_with_a_tail_below_one_percent():
    for r in (0.05, 0.1, 0.25, 0.5, 0.9):
        k = max_consecutive_skips(r)
        assert (1 - r) ** k <= FORCED_REVISIT_TAIL < (1 - r) ** (k - 1)
    assert max_consecutive_skips(1.0) == 0
    for bad in (0.0, -0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="revisit_probability"):
            max_consecutive_skips(bad)


def test_should_skip_needs_a_prediction_a_draw_above_r_and_skips_left():
    assert should_skip(True, 0, 0.9, 0.25)
    assert not should_skip(False, 0, 0.9, 0.25)
    assert not should_skip(True, 0, 0.1, 0.25)  # revisited
    assert not should_skip(True, max_consecutive_skips(0.25), 0.9, 0.25)  # forced back
    assert not should_skip(True, 0, 0.999, 1.0)  # r = 1 never skips


def test_revisit_draw_is_a_function_of_seed_pass_and_position():
    draws = [revisit_draw(0, e, p) for e in range(20) for p in range(50)]
    assert draws == [revisit_draw(0, e, p) for e in range(20) for p in range(50)]
    assert all(0 <= d < 1 for d in draws) and len(set(draws)) == len(draws)
    assert 0.4 < sum(draws) / len(draws) < 0.6
    assert revisit_draw(1, 0, 0) != revisit_draw(0, 0, 0)


def test_record_groups_counts_revisits_and_how_often_the_prediction_held():
    history = PromptHistory(window=1, revisit_probability=0.5, seed=0)
    assert record_groups(history, [3, 4, 5], [1.0, 0.5, 0.0], [True, False, True]) == (0, 0)  # first sight
    assert record_groups(history, [3, 4, 5], [1.0, 0.25, 0.5], [True, False, False]) == (2, 1)  # 3 held, 5 did not
    assert history.outcomes[5] == [(0.5, False)]  # only the last `window` groups are kept
    with pytest.raises(ValueError, match="one outcome per group"):
        record_groups(history, [3], [1.0, 0.0], [True])


def test_prompts_for_round():
    assert prompts_for_round(16, 16, None, 4, 2) == 16  # today's: a full batch every round
    assert prompts_for_round(3, 16, None, 4, 2) == 16
    assert prompts_for_round(16, 16, 1.25, 4, 2) == 20
    assert prompts_for_round(3, 16, 1.0, 4, 1) == 3  # a refill draws what is missing
    assert prompts_for_round(3, 16, 1.0, 1, 2) == 4  # rows (prompts x G) split over 2 processes
    assert prompts_for_round(3, 16, 1.0, 2, 4) == 4


# -- the history in the stream (hypothesis) ---------------------------------------------------------------------------


def _stream(size, per_round, seed, r, window=1):
    return PromptStream(size, per_round, group_size=2, seed=seed, history=PromptHistory(window, r, seed))


def _simulate(stream, rounds, zero_signal_of):
    """Draw `rounds` rounds, recording every group with the outcome zero_signal_of(index); return the rounds."""
    drawn = []
    for _ in range(rounds):
        prompts = stream.next_indices()[:: stream.group_size]
        record_groups(stream.history, prompts, [0.0] * len(prompts), [zero_signal_of(i) for i in prompts])
        drawn.append(prompts)
    return drawn


@settings(max_examples=60, deadline=None)
@given(size=st.integers(2, 24), per_round=st.integers(1, 6), seed=st.integers(0, 2**31),
       r=st.sampled_from([0.05, 0.1, 0.25, 0.5, 0.9]), rounds=st.integers(1, 60))
def test_no_prompt_is_starved(size, per_round, seed, r, rounds):
    """Every prompt always zero-signal, the worst case: none is passed over more than K(r) times in a row, so each
    comes back within K(r) + 1 of its passes."""
    per_round = min(per_round, size)
    stream = _stream(size, per_round, seed, r)
    passed_over = {}
    skip = stream.history.skip

    def watching(index, epoch, position):
        skipped = skip(index, epoch, position)
        passed_over[index] = passed_over.get(index, 0) + 1 if skipped else 0
        assert passed_over[index] <= max_consecutive_skips(r)
        return skipped

    stream.history.skip = watching
    _simulate(stream, rounds, lambda i: True)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(2, 24), per_round=st.integers(1, 6), seed=st.integers(0, 2**31),
       r=st.sampled_from([0.1, 0.25, 0.5]), window=st.integers(1, 3), rounds=st.integers(2, 40),
       stop=st.integers(1, 39), informative=st.frozensets(st.integers(0, 23)))
def test_decisions_are_deterministic_under_a_seed_and_survive_a_resume(size, per_round, seed, r, window, rounds, stop,
                                                                       informative):
    per_round, stop = min(per_round, size), min(stop, rounds - 1)
    outcome = lambda i: i not in informative  # noqa: E731
    whole = _simulate(_stream(size, per_round, seed, r, window), rounds, outcome)
    assert whole == _simulate(_stream(size, per_round, seed, r, window), rounds, outcome)
    first = _stream(size, per_round, seed, r, window)
    before = _simulate(first, stop, outcome)
    state = json.loads(json.dumps(first.state_dict()))  # as it goes through the checkpoint file
    resumed = _stream(size, per_round, seed, r, window)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == first.state_dict()
    assert before + _simulate(resumed, rounds - stop, outcome) == whole


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 30), per_round=st.integers(1, 8), seed=st.integers(0, 2**31), rounds=st.integers(1, 30))
def test_revisit_probability_one_draws_exactly_what_the_stream_without_history_draws(size, per_round, seed, rounds):
    per_round = min(per_round, size)
    plain = PromptStream(size, per_round, group_size=3, seed=seed)
    selective = PromptStream(size, per_round, group_size=3, seed=seed, history=PromptHistory(1, 1.0, seed))
    for _ in range(rounds):
        expected = plain.next_indices()
        got = selective.next_indices()
        assert got == expected
        record_groups(selective.history, got[::3], [1.0] * per_round, [True] * per_round)
    assert selective.skipped == 0 and selective.state_dict()["position"] == plain.state_dict()["position"]


def test_skipped_prompts_stay_in_the_stream_and_predicted_informative_ones_are_never_skipped():
    stream = _stream(12, 4, seed=3, r=0.25)
    zero = {0, 1, 2, 3, 4, 5}
    rounds = _simulate(stream, 30, lambda i: i in zero)
    seen_late = {i for round_ in rounds[6:] for i in round_}
    assert seen_late == set(range(12))  # the zero-signal prompts still come back
    late = [i for round_ in rounds[6:] for i in round_]
    assert sum(i in zero for i in late) < sum(i not in zero for i in late) / 2  # ... but rarely
    assert stream.skipped > 0


def test_history_with_another_window_is_refused():
    history = PromptHistory(window=2, revisit_probability=0.5, seed=0)
    with pytest.raises(ValueError, match="selective_sampling_window is 2"):
        history.load_state_dict(PromptHistory(3, 0.5, 0).state_dict())


# -- the trainer ------------------------------------------------------------------------------------------------------


def test_revisit_probability_one_is_bit_identical_to_dynamic_sampling_alone(tiny_model_dir):
    outcomes = []
    for extra in ({}, {"selective_sampling": True, "revisit_probability": 1.0}):
        rounds = []
        trainer, seen = run(tiny_model_dir, record_prompts=rounds, max_steps=3, **extra)
        params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        prompts = [[p["prompt"] for p in r] for r in rounds]
        outcomes.append((prompts, seen, params, trainer._round_driver.stream.state_dict()["position"]))
    (prompts0, seen0, params0, pos0), (prompts1, seen1, params1, pos1) = outcomes
    assert prompts0 == prompts1 and pos0 == pos1
    assert len(seen0) == len(seen1)
    for a, b in zip(seen0, seen1):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    for name, param in params0.items():
        torch.testing.assert_close(params1[name], param, atol=0, rtol=0)


@pytest.mark.parametrize("dynamic_sampling", [False, True])
def test_the_trainer_skips_zero_signal_prompts_and_logs_it(tiny_model_dir, dynamic_sampling):
    trainer = make_selective_trainer(tiny_model_dir, dynamic_sampling=dynamic_sampling, max_steps=8)
    rounds = record_rounds(trainer)
    trainer.train()
    first_pass = [i for r in rounds[:2] for i in r]
    assert sorted(first_pass) == list(range(8))  # never seen: every prompt is sampled once
    later = [i for r in rounds[2:] for i in r]
    zero = [i for i in later if i % 3 != 2]
    assert len(zero) < 0.6 * len(later)  # 6 of 8 prompts without the skipping (75%)
    logs = [h for h in trainer.state.log_history if "rlvr/prompts_skipped" in h]
    assert len(logs) == 8 and sum(h["rlvr/prompts_skipped"] for h in logs) > 0
    ratios = [h["rlvr/answers_per_informative_row"] for h in logs if "rlvr/answers_per_informative_row" in h]
    assert ratios and all(ratio >= 1 for ratio in ratios)  # absent where no row had signal
    assert any("rlvr/skipped_would_have_been_zero_signal" in h for h in trainer.state.log_history)
    history = trainer._round_driver.stream.history
    assert all(history.outcomes[i][-1][1] == (i % 3 != 2) or i % 3 == 2 for i in history.outcomes)
    assert history.outcomes[0][-1] == (1.0, True) and history.outcomes[1][-1] == (0.0, True)


def test_history_survives_save_and_resume_exactly(tiny_model_dir, tmp_path, monkeypatch):
    from trl_rlvr.trainer import RLVRTrainer

    settings = dict(output_dir=str(tmp_path), save_strategy="steps", save_steps=1, max_steps=5)
    trainer = make_selective_trainer(tiny_model_dir, **settings)
    trainer.train()
    saved = {s: json.loads((tmp_path / f"checkpoint-{s}" / "rlvr_prompt_stream.json").read_text()) for s in (3, 5)}
    assert saved[5] == json.loads(json.dumps(trainer._round_driver.stream.state_dict()))
    assert saved[3]["history"]["outcomes"] and saved[3] != saved[5]
    restored = []
    load = RLVRTrainer._load_optimizer_and_scheduler

    def recording_load(self, checkpoint):
        load(self, checkpoint)
        restored.append(json.loads(json.dumps(self._round_driver.stream.state_dict())))

    monkeypatch.setattr(RLVRTrainer, "_load_optimizer_and_scheduler", recording_load)
    resumed = make_selective_trainer(tiny_model_dir, **{**settings, "output_dir": str(tmp_path / "resumed")})
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert restored == [saved[3]]
    assert resumed.state.global_step == 5


@pytest.mark.parametrize("metric", ["reward", "success"])
def test_dynamic_sampling_metric_decides_which_groups_are_kept(tiny_model_dir, metric):
    """A shaping term that differs between answers makes every group vary in total reward; with 'success' the
    groups are kept only where the success reward itself varies."""

    def success(prompts, completions, **kwargs):
        return mixed_reward(prompts, completions)

    def shaping(completions, **kwargs):
        return [0.01 * len(c) for c in completions]

    success.verifies_correctness = True
    from tests.harness.loss_harness import make_trainer

    trainer = make_trainer(tiny_model_dir, reward_funcs=[success, shaping], dynamic_sampling=True, max_steps=2,
                           per_device_train_batch_size=8, gradient_accumulation_steps=2, max_completion_length=8,
                           dynamic_sampling_metric=metric, max_sampling_rounds=6)
    kept_success = []
    informative = trainer._round_driver.informative_batch

    def recording(target):
        batch = informative(target)
        kept_success.append(trainer.metrics_to_log("train")["rlvr/kept_groups_frac"][-1])
        return batch

    trainer._round_driver.informative_batch = recording
    trainer.train()
    if metric == "reward":
        assert all(frac > 0.9 for frac in kept_success)  # almost every group varies in length
    else:
        assert all(frac < 0.6 for frac in kept_success)  # only q{3k+2} groups can vary in success


def test_oversample_draws_more_prompts_in_the_first_round_and_only_the_missing_ones_after(tiny_model_dir):
    rounds = []
    run(tiny_model_dir, record_prompts=rounds, max_steps=2, dynamic_sampling_oversample=1.5, max_sampling_rounds=4)
    sizes = [len(r) // 4 for r in rounds]  # prompts per round (G = 4)
    assert sizes[0] == 6  # 1.5 x the 4 groups a batch needs
    assert all(s <= 6 for s in sizes)


def test_config_validation():
    from trl_rlvr import RLVRConfig

    for field, value, match in [("dynamic_sampling_metric", "acc", "dynamic_sampling_metric"),
                                ("dynamic_sampling_oversample", 0.5, "dynamic_sampling_oversample"),
                                ("selective_sampling_window", 0, "selective_sampling_window"),
                                ("revisit_probability", 0.0, "revisit_probability")]:
        with pytest.raises(ValueError, match=match):
            RLVRConfig("out", use_cpu=True, bf16=False, **{field: value})


@pytest.mark.slow
def test_two_processes_take_identical_skip_decisions(tiny_model_dir, tmp_path):
    out = tmp_path / "sel"
    launch_on_cpu("-m", "tests.harness.selective_sampling_harness", tiny_model_dir, out, 6, cwd=ROOT)
    ranks = [torch.load(f"{out}.rank{r}.pt") for r in range(2)]
    assert all(r["num_processes"] == 2 for r in ranks)
    assert ranks[0]["rounds"] == ranks[1]["rounds"] and len(ranks[0]["rounds"]) >= 6
    assert ranks[0]["stream"] == ranks[1]["stream"]
    skipped = [[h["rlvr/prompts_skipped"] for h in r["log_history"] if "rlvr/prompts_skipped" in h] for r in ranks]
    assert skipped[0] == skipped[1] and sum(skipped[0]) > 0
