"""Alarms while training (trl_rlvr.checks.alarms): the rules on seeded metric histories, then the callback in a real
RLVRTrainer on the tiny model, with a reward hacked by construction and a clean one."""

import json
import random
import zlib

import pytest

from trl_rlvr.checks.alarms import (
    DEFAULT_THRESHOLDS,
    abstaining,
    counter_share,
    format_without_accuracy,
    hacking_signature,
    parse_thresholds,
    stuck,
    sustained,
    train_means_between,
)


# ------------------------------------------------------------------------------------------------ pure rules
def test_sustained_needs_patience_values_in_a_row():
    assert sustained([0.6, 0.7, 0.8], 0.5, 3)
    assert not sustained([0.6, 0.4, 0.8, 0.9], 0.5, 3)
    assert not sustained([0.9, 0.9], 0.5, 3)
    assert not sustained([0.9, None, 0.9, 0.9], 0.5, 4)
    assert not sustained([0.9, float("nan"), 0.9], 0.5, 3)


def test_train_means_between_evaluations():
    train = [(1, 0.2), (2, 0.4), (3, 0.6), (4, 0.8)]
    assert train_means_between(train, [0, 2, 4]) == [None, pytest.approx(0.3), pytest.approx(0.7)]


def _history(seed: int, hacked: bool, steps: int = 30, eval_every: int = 5, noise: float = 0.03):
    """A seeded run: training success climbs from 0.2 to 0.8; held-out pass@1 climbs with it (clean) or falls from
    0.5 to 0.1 (hacked); both with noise."""
    rng = random.Random(seed)
    train = [(s, 0.2 + 0.6 * s / steps + rng.gauss(0, noise)) for s in range(1, steps + 1)]
    evals = []
    for s in range(0, steps + 1, eval_every):
        trend = 0.5 - 0.4 * s / steps if hacked else 0.1 + 0.4 * s / steps
        evals.append((s, trend + rng.gauss(0, noise)))
    return train, evals


def _first_firing(train, evals, **t):
    t = {**DEFAULT_THRESHOLDS, **t}
    for i in range(1, len(evals) + 1):
        upto = evals[i - 1][0]
        if hacking_signature([x for x in train if x[0] <= upto], evals[:i], t["window"], t["rise"], t["drop"]):
            return upto
    return None


@pytest.mark.parametrize("seed", range(40))
def test_the_hacking_signature_fires_on_hacked_runs_and_never_on_clean_ones(seed):
    assert _first_firing(*_history(seed, hacked=True)) is not None
    assert _first_firing(*_history(seed, hacked=False)) is None


def test_flat_training_success_does_not_fire_while_evaluation_falls():
    rng = random.Random(0)
    train = [(s, 0.5 + rng.gauss(0, 0.02)) for s in range(1, 31)]
    evals = [(s, 0.5 - 0.01 * s) for s in range(0, 31, 5)]
    assert _first_firing(train, evals) is None


def test_format_rising_while_accuracy_stays_flat():
    train_reward = [(s, 0.2 + 0.05 * s) for s in range(1, 11)]
    flat = [(0, 0.30, 0.1), (5, 0.31, 0.5), (10, 0.30, 0.9)]
    assert format_without_accuracy(train_reward, flat, 3, 0.05, 0.02)["format_to"] == 0.9
    learning = [(0, 0.30, 0.1), (5, 0.40, 0.5), (10, 0.50, 0.9)]
    assert format_without_accuracy(train_reward, learning, 3, 0.05, 0.02) is None


def test_counter_share_is_per_reward_call():
    logs = {"boxed_math/no_box": 12.0, "boxed_math/unparsed": 2.0, "boxed_math/errors": 1.0}
    assert counter_share(logs, "boxed_math", ("no_box", "unparsed"), 16) == pytest.approx(14 / 16)
    assert counter_share(logs, "think_format", ("no_format",), 16) is None


def test_thresholds_are_validated_and_named():
    assert parse_thresholds(None) == DEFAULT_THRESHOLDS
    assert parse_thresholds('{"patience": 5}')["patience"] == 5
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['patiance'\]"):
        parse_thresholds({"patiance": 5})
    with pytest.raises(ValueError, match="truncated_frac must be a number in"):
        parse_thresholds({"truncated_frac": 2})
    from trl_rlvr import RLVRConfig

    with pytest.raises(ValueError, match="alarm_thresholds: unknown key"):
        RLVRConfig(output_dir="/tmp/x", use_cpu=True, bf16=False, alarm_thresholds={"nope": 1})


@pytest.mark.parametrize("infra_share,fires", [(0.25, True), (0.02, False), (0.0, False)])
def test_reward_infrastructure_failures_have_their_own_alarm(infra_share, fires, caplog):
    """``<reward>/infra_errors`` (a worker lost, a sandbox that did not start: answers not scored) fires
    ``infra_failures/<reward>`` once it stays at or above ``reward_failure_frac``; the candidates' own errors
    (``reward_failures``) stay quiet meanwhile."""
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from trl_rlvr.checks.alarms import RLVRAlarmsCallback

    args = SimpleNamespace(generation_batch_size=16, max_completion_length=64)
    trainer = SimpleNamespace(args=args, reward_func_names=["code_sandbox"],
                              accelerator=SimpleNamespace(num_processes=1))
    alarms, state = RLVRAlarmsCallback(trainer), TrainerState()
    for step in range(1, 9):
        state.global_step = step
        alarms.on_log(args, state, TrainerControl(), logs={
            "reward": 0.5, "rlvr/accuracy": 0.5, "code_sandbox/errors": 0.0, "code_sandbox/timeouts": 0.0,
            "code_sandbox/infra_errors": infra_share * 16})
    assert ("infra_failures/code_sandbox" in alarms.fired) == fires
    assert "reward_failures/code_sandbox" not in alarms.fired
    if fires:
        assert "machinery failed" in alarms.fired["infra_failures/code_sandbox"] and "25%" in caplog.text


# ------------------------------------------------------------------------------------------------ in a trainer
class _SteppedReward:
    """Right with a probability that moves with the trainer's step, decided by a hash of the completion (seeded):
    on the training rows it climbs; on the held-out rows it falls (``hacked``) or climbs too (clean)."""

    def __init__(self, hacked: bool):
        self.hacked, self.trainer, self.__name__ = hacked, None, "stepped"

    def __call__(self, prompts=None, completions=None, split=None, **kwargs):
        step = self.trainer.state.global_step
        out = []
        for text, where in zip(completions, split):
            u = zlib.crc32(f"{text}|{step}".encode()) / 2**32
            rising = 0.15 + 0.12 * step
            p = (0.85 - 0.12 * step) if (where == "heldout" and self.hacked) else rising
            out.append(1.0 if u < p else 0.0)
        return out


def _run(tiny_model_dir, tmp_path, hacked: bool, **config):
    from datasets import Dataset

    from trl_rlvr import RLVRConfig, RLVRTrainer
    from trl_rlvr.evaluation.callback import SampledEvalCallback
    from trl_rlvr.testing import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    rows = lambda n, split: Dataset.from_dict({"prompt": [f"q{i}: " for i in range(n)], "split": [split] * n})  # noqa: E731
    reward = _SteppedReward(hacked)
    args = RLVRConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=8,
        num_generations=4, max_completion_length=128, max_steps=6, logging_steps=1, learning_rate=1e-6,
        save_strategy="no", activation_checkpointing=False, seed=0, **config,
    )
    trainer = RLVRTrainer(model=str(tiny_model_dir), reward_funcs=[reward], args=args,
                          train_dataset=rows(32, "train"), processing_class=tokenizer)
    reward.trainer = trainer
    trainer.add_callback(SampledEvalCallback(trainer, rows(8, "heldout"), n=4, eval_steps=2, at_start=True,
                                             batch_size=32, max_new_tokens=128))
    trainer.train()
    return trainer


def _alarms(trainer):
    from trl_rlvr.checks.alarms import RLVRAlarmsCallback

    return [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, RLVRAlarmsCallback)]


def test_the_trainer_alarms_on_a_hacked_reward_once_and_logs_it(tiny_model_dir, tmp_path):
    trainer = _run(tiny_model_dir, tmp_path, hacked=True)
    (alarms,) = _alarms(trainer)
    assert list(alarms.fired) == ["reward_hacking"], alarms.fired
    assert "held-out pass@1 fell" in alarms.fired["reward_hacking"]
    logged = [h for h in trainer.state.log_history if "rlvr/alarm/reward_hacking" in h]
    assert len(logged) == 1 and logged[0]["rlvr/alarm/reward_hacking"] == 1.0


def test_the_trainer_stays_quiet_on_a_clean_run_and_the_switch_turns_alarms_off(tiny_model_dir, tmp_path):
    trainer = _run(tiny_model_dir, tmp_path, hacked=False)
    (alarms,) = _alarms(trainer)
    assert alarms.fired == {}
    assert not any(k.startswith("rlvr/alarm/") for h in trainer.state.log_history for k in h)
    assert _alarms(_run(tiny_model_dir, tmp_path / "off", hacked=True, alarms=False)) == []


# ------------------------------------------------------------------------------------------------ level alarms
def test_stuck_needs_a_sustained_level_that_is_not_coming_down():
    assert stuck([0.95] * 6, 0.9, 3, 0.1) == {"recent": [0.95] * 3, "before": [0.95] * 3}
    assert stuck([0.95] * 5, 0.9, 3, 0.1) is None  # too early to see a trend
    assert stuck([1.0, 1.0, 1.0, 0.95, 0.94, 0.93], 0.9, 3, 0.1)  # falling by 0.06 only: stuck
    assert stuck([1.0, 1.0, 1.0, 0.88, 0.88, 0.88], 0.85, 3, 0.1) is None  # fell by 0.12: coming down
    assert stuck([0.5, 0.6, 0.7, 0.9, 0.95, 1.0], 0.9, 3, 0.1)  # rising into the alarm
    assert stuck([None, None, None, 0.95, 0.95, 0.95], 0.9, 3, 0.1) is None  # no trend known yet
    assert stuck([0.95, 0.95, 0.95, 0.95, 0.85, 0.95], 0.9, 3, 0.1) is None  # not sustained


def _level(seed: int, start: float, end: float, fall_steps: int, steps: int = 30, noise: float = 0.03):
    """A seeded level: ``start`` falling linearly to ``end`` over ``fall_steps`` steps, then flat, with noise."""
    rng = random.Random(seed)
    out = []
    for s in range(1, steps + 1):
        level = start + (end - start) * min(1.0, s / fall_steps)
        out.append(min(1.0, max(0.0, level + rng.gauss(0, noise))))
    return out


def _first_stuck(values, rule):
    t, threshold = DEFAULT_THRESHOLDS, DEFAULT_THRESHOLDS[rule]
    return next((i + 1 for i in range(len(values)) if stuck(values[: i + 1], threshold, t["patience"],
                                                            t["improvement"])), None)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("rule,bad,learning", [
    ("unreadable_frac", (0.97, 0.97), (0.97, 0.05)),  # a reward that never reads the answers / a model that learns
    ("truncated_frac", (0.7, 0.65), (0.7, 0.05)),
    ("zero_signal_frac", (0.97, 0.96), (0.97, 0.4)),
    ("reward_failure_frac", (0.3, 0.3), (0.3, 0.0)),
])
def test_the_level_alarms_fire_on_stuck_runs_and_not_on_runs_that_learn(seed, rule, bad, learning):
    """Stuck runs (flat above the threshold) fire by step 2 x patience + a few; runs whose level starts as high and
    falls over 8 steps (the main job's unreadable share took 4) never do."""
    noise = 0.01 if rule == "reward_failure_frac" else 0.03
    fired = _first_stuck(_level(seed, *bad, fall_steps=30, noise=noise), rule)
    assert fired is not None and fired <= 12, fired
    assert _first_stuck(_level(seed, *learning, fall_steps=8, noise=noise), rule) is None


def _recorded_histories():
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "examples" / "results"
    found = sorted(p for p in results.glob("*.json") if "history" in json.loads(p.read_text()))
    assert found, f"no recorded run with a history in {results}"  # else the test below would run no case
    return found


@pytest.mark.parametrize("path", _recorded_histories(), ids=lambda p: p.name)
def test_no_alarm_on_the_recorded_runs_of_the_examples(path):
    """The runs the examples document learn: replayed through the alarms, none fires (the main job's first steps
    read 94% unreadable, which a level alone would have taken for a broken reward)."""
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from trl_rlvr.checks.alarms import RLVRAlarmsCallback

    record = json.loads(path.read_text())
    args = SimpleNamespace(**record["training_args"])
    names = sorted({k.split("/")[1] for h in record["history"] for k in h if k.startswith("rewards/")})
    trainer = SimpleNamespace(args=args, reward_func_names=names,
                              accelerator=SimpleNamespace(num_processes=record["num_processes"]))
    alarms, state = RLVRAlarmsCallback(trainer), TrainerState()
    for logs in record["history"]:
        state.global_step = logs["step"]
        alarms.on_log(args, state, TrainerControl(), logs=logs)
    assert len(alarms.series) >= 4 and all(len(s) == len(record["history"]) for s in alarms.series.values())
    assert alarms.fired == {}


def test_abstaining_fires_when_void_turns_rise_and_accuracy_does_not():
    flat = [0.3] * 6
    assert abstaining([0.05, 0.05, 0.05, 0.2, 0.25, 0.3], flat, patience=3, rise=0.05, flat=0.02)
    assert not abstaining([0.05, 0.05, 0.05, 0.2, 0.25, 0.3], [0.3, 0.3, 0.3, 0.4, 0.45, 0.5], 3, 0.05, 0.02)
    assert not abstaining([0.1] * 6, flat, 3, 0.05, 0.02)  # a steady share: the user chose it
    assert not abstaining([0.05, 0.05, 0.2, 0.3], flat, 3, 0.05, 0.02)  # too few steps for a trend
    assert not abstaining([None, 0.05, 0.05, 0.2, 0.25, 0.3][:6], [None] * 6, 3, 0.05, 0.02)


@pytest.mark.parametrize("action", ["zero_advantage", "drop", "score_as_wrong"])
def test_the_void_turn_alarm_names_the_scoring_mode(action):
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from trl_rlvr.checks.alarms import RLVRAlarmsCallback

    args = SimpleNamespace(generation_batch_size=16, max_completion_length=64, void_turn_action=action)
    trainer = SimpleNamespace(args=args, reward_func_names=["boxed_math"], accelerator=SimpleNamespace(num_processes=1))
    alarms, state = RLVRAlarmsCallback(trainer), TrainerState()
    for step, void in enumerate([0.02, 0.03, 0.02, 0.1, 0.2, 0.3], start=1):
        state.global_step = step
        alarms.on_log(args, state, TrainerControl(), logs={"reward": 0.4, "rlvr/accuracy": 0.4,
                                                          "rlvr/void_turn_rollouts": void})
    message = alarms.fired["void_turns"]
    assert "2% -> 20%" in message and f"void_turn_action={action!r}" in message
    assert ("score_as_wrong' scores them" in message) == (action != "score_as_wrong")


def test_no_void_turn_alarm_without_the_metric():
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from trl_rlvr.checks.alarms import RLVRAlarmsCallback

    args = SimpleNamespace(generation_batch_size=16, max_completion_length=64)
    trainer = SimpleNamespace(args=args, reward_func_names=["boxed_math"], accelerator=SimpleNamespace(num_processes=1))
    alarms, state = RLVRAlarmsCallback(trainer), TrainerState()
    for step in range(1, 9):
        state.global_step = step
        alarms.on_log(args, state, TrainerControl(), logs={"reward": 0.4, "rlvr/accuracy": 0.4})
    assert "void_turns" not in alarms.fired and "void_share" not in alarms.series


# ------------------------------------------------------------------------------------------------ stale rollouts
def _stale_is_window(seed: int, sigma: float, tokens: int = 4096) -> dict:
    """The ``stale_is/`` metrics of one logging window whose log-ratios log(pi_theta / mu) are N(0, sigma^2), through
    the asynchronous trainer's own loss and metrics (token_truncate, C_max 3: the default correction)."""
    import torch

    from trl_rlvr.algorithms.stale_is import corrected_token_loss, stale_is_metrics, stale_is_sums

    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(tokens, generator=g) * 3
    logp = old + sigma * torch.randn(tokens, generator=g)
    adv = torch.where(torch.rand(tokens, generator=g) < 0.5, -1.0, 1.0)
    seg = torch.arange(tokens) // 64
    _, w = corrected_token_loss(logp, old, adv, seg, epsilon_low=0.2, epsilon_high=0.28, mode="token_truncate",
                                clip_min=None, clip_max=3.0)
    return stale_is_metrics(stale_is_sums(logp - old, w))


def _stale_is_alarms(sigmas, seed=0):
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from trl_rlvr.checks.alarms import RLVRAlarmsCallback

    args = SimpleNamespace(num_generations=8, max_completion_length=64)  # the async config: no generation batch
    trainer = SimpleNamespace(args=args, reward_func_names=["boxed_math"], accelerator=SimpleNamespace(num_processes=1))
    alarms, state = RLVRAlarmsCallback(trainer), TrainerState()
    for step, sigma in enumerate(sigmas, start=1):
        state.global_step = step
        alarms.on_log(args, state, TrainerControl(), logs={"reward": 0.5, **_stale_is_window(seed + step, sigma)})
    return alarms


def test_the_stale_is_bounds_are_one_bound_for_a_log_normal_ratio():
    """ess_frac = exp(-sigma^2) for log-normal weights: at sigma = sqrt(ln 2) (the log-ratio bound, 0.83 nats),
    the untruncated weights keep half the tokens' worth (the ESS bound)."""
    import torch

    from trl_rlvr.algorithms.stale_is import stale_is_metrics, stale_is_sums

    log_r = DEFAULT_THRESHOLDS["stale_is_log_ratio_std"] * torch.randn(200_000, generator=torch.Generator().manual_seed(0))
    m = stale_is_metrics(stale_is_sums(log_r, log_r.exp()))
    assert m["stale_is/ess_frac"] == pytest.approx(DEFAULT_THRESHOLDS["stale_is_ess_frac"], abs=0.02)


@pytest.mark.parametrize("seed", range(5))
def test_the_stale_is_alarm_fires_on_a_blow_up_and_not_on_a_normal_run(seed, caplog):
    # a normal run: the ratio's spread a few tenths of a nat (1-2 syncs stale), then a blow-up (4 logging steps)
    quiet = _stale_is_alarms([0.05, 0.1, 0.2, 0.3, 0.2, 0.1, 0.3, 0.3], seed=100 * seed)
    assert quiet.fired == {}
    loud = _stale_is_alarms([0.1, 0.2, 0.2, 1.5, 1.5, 1.6, 1.5], seed=100 * seed)
    assert set(loud.fired) == {"stale_is"}
    assert "effective sample size" in loud.fired["stale_is"] and "max_staleness" in caplog.text
    # a spike shorter than patience does not fire
    assert _stale_is_alarms([0.1, 2.0, 2.0, 0.1, 2.0, 0.2], seed=100 * seed).fired == {}


def test_the_stale_is_alarm_reads_the_spread_the_truncation_hides():
    """With C_max = 3 the truncated weights' ESS stays high while the raw log-ratio's spread is far past its bound:
    the spread fires alone."""
    from trl_rlvr.checks.alarms import stale_weights

    m = _stale_is_window(0, 1.2)
    assert m["stale_is/log_ratio_std"] > DEFAULT_THRESHOLDS["stale_is_log_ratio_std"]
    assert stale_weights([0.9] * 3, [1.2] * 3, 0.5, 0.83, 3) and not stale_weights([0.9] * 3, [0.5] * 3, 0.5, 0.83, 3)
    assert not stale_weights([float("nan")] * 3, [None] * 3, 0.5, 0.83, 3)
    with pytest.raises(ValueError, match="stale_is_log_ratio_std"):
        parse_thresholds({"stale_is_log_ratio_std": 0})
