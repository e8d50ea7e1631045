"""Alarms while training: a warning with the numbers when a run goes quietly wrong (on by default in RLVRTrainer).

:class:`RLVRAlarmsCallback` reads every training log and, when a
:class:`~trl_rlvr.evaluation.callback.SampledEvalCallback` runs, every sampled evaluation. Each alarm fires at most
once per ``train()`` call: a ``logger.warning`` that gives the numbers and what to change, and
``rlvr/alarm/<name> = 1`` in the next training log (so it reaches every ``report_to`` integration and
``state.log_history``). The rules are pure functions of the metric histories, tested on their own.

The four level alarms judge a level together with its trend (:func:`stuck`): the last ``patience`` logging steps
all at or above the threshold, *and* not coming down: their mean is less than ``improvement`` below the mean of the
``patience`` steps before them. A run starts where RL has not yet had a chance (a base model does not write the
answer form; the first steps of the project's main job read 94%, 94%, 94% unreadable, then 50%, 44%, 19%), so a
high level alone is no evidence of a problem: a level that stays high for ``2 x patience`` steps without falling is.

- ``truncation``: ``rlvr/truncated_frac`` >= ``truncated_frac``, stuck;
- ``unreadable/<reward>``: the answers the reward reports it could not read (``<reward>/no_box``, ...:
  :data:`trl_rlvr.checks.verdicts.UNREADABLE_COUNTERS`, per reward call) >= ``unreadable_frac`` of the answers, stuck;
- ``reward_failures/<reward>``: its ``errors`` + ``timeouts`` >= ``reward_failure_frac`` of the answers, stuck;
- ``infra_failures/<reward>``: its ``infra_errors`` (the reward's machinery failed: a worker lost, a sandbox that
  did not start; those answers are not scored) >= ``reward_failure_frac`` of the answers, stuck;
- ``zero_signal``: ``rlvr/zero_signal_frac`` >= ``zero_signal_frac``, stuck;
- ``void_turns``: with ``void_turn_action``, the share of void rollouts (``rlvr/void_turn_rollouts``, rollouts that
  give no answer) rose by >= ``rise`` over ``2 x patience`` logging steps (the mean of the last ``patience`` against
  the ``patience`` before) while the training success rate (``rlvr/accuracy``) rose by less than ``flat``
  (:func:`abstaining`): under ``"zero_advantage"`` and ``"drop"`` giving no answer is never pushed down while a wrong
  guess is, so a policy can learn to abstain;
- ``reward_hacking``: over the last ``window`` sampled evaluations, the training success rate (``rlvr/accuracy``)
  rose by >= ``rise`` while held-out ``eval/pass@1`` fell by >= ``drop``: the policy found a way to the reward
  that is not the task;
- ``format_without_accuracy``: over the same window, held-out ``eval/format_rate`` rose by >= ``rise`` and the
  training reward rose by >= ``rise`` while held-out ``eval/pass@1`` moved by less than ``flat``;
- ``stale_is`` (the asynchronous trainer, :mod:`trl_rlvr.algorithms.stale_is`): for the last ``patience`` logging
  steps, the importance weights' effective sample size ``stale_is/ess_frac`` < ``stale_is_ess_frac`` or the spread
  of the log-ratio ``stale_is/log_ratio_std`` > ``stale_is_log_ratio_std`` (:func:`stale_weights`). The two bounds
  are one bound for a log-normal ratio (``ess_frac = exp(-sigma^2)``: half the tokens' worth at ``sigma =
  sqrt(ln 2) = 0.83`` nats); the spread is also read on the raw ratio, which the truncation hides from the ESS of
  the truncated weights. Not calibrated on a run (no asynchronous run of this project exists yet).

Thresholds: ``RLVRConfig.alarm_thresholds``, a mapping that overrides any of :data:`DEFAULT_THRESHOLDS`;
``RLVRConfig.alarms=False`` turns the alarms off.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence

from transformers import TrainerCallback

from trl_rlvr._compat.grpo_adapter import metrics_to_log
from trl_rlvr.algorithms.multi_turn import VOID_TURN_ADVANTAGE_ACTIONS
from trl_rlvr.checks.verdicts import FAILURE_COUNTERS, INFRA_COUNTERS, UNREADABLE_COUNTERS

logger = logging.getLogger(__name__)

#: The thresholds and their defaults (``RLVRConfig.alarm_thresholds`` overrides any of them).
DEFAULT_THRESHOLDS = {
    "truncated_frac": 0.5,  # share of answers cut off at max_completion_length
    "unreadable_frac": 0.9,  # share of answers a reward could not read
    "reward_failure_frac": 0.05,  # share of answers a reward failed to check (errors + timeouts)
    "zero_signal_frac": 0.9,  # share of groups whose rewards are all equal
    "patience": 3,  # logging steps in a row above a threshold (and as many before them, for the trend)
    "improvement": 0.1,  # a level whose mean fell by at least this much from the steps before is coming down
    "window": 3,  # sampled evaluations compared (first and last) for the reward-hacking signature
    "rise": 0.05,  # training success (or format rate) rising by at least this much over the window
    "drop": 0.05,  # held-out pass@1 falling by at least this much over the window
    "flat": 0.02,  # held-out pass@1 moving by less than this counts as flat
    "stale_is_ess_frac": 0.5,  # effective sample size of the importance weights, over the token count
    "stale_is_log_ratio_std": 0.83,  # nats: sqrt(ln 2), where a log-normal ratio's ess_frac is 0.5
}
_FRACTIONS = ("truncated_frac", "unreadable_frac", "reward_failure_frac", "zero_signal_frac", "improvement", "rise",
              "drop", "flat", "stale_is_ess_frac")


def parse_thresholds(value) -> dict:
    """``alarm_thresholds`` (None, a mapping or a JSON string) -> the full, validated thresholds; a ``ValueError``
    names an unknown key or a value out of range."""
    if value is None:
        given = {}
    elif isinstance(value, str):
        try:
            given = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"alarm_thresholds must be a JSON object (name -> value): {err}") from err
    else:
        given = value
    if not isinstance(given, dict):
        raise ValueError(f"alarm_thresholds must be a mapping name -> value, got {value!r}")
    unknown = sorted(set(given) - set(DEFAULT_THRESHOLDS))
    if unknown:
        raise ValueError(f"alarm_thresholds: unknown key(s) {unknown}; known: {sorted(DEFAULT_THRESHOLDS)}")
    out = {**DEFAULT_THRESHOLDS, **given}
    for key in _FRACTIONS:
        if not isinstance(out[key], (int, float)) or not 0 <= out[key] <= 1:
            raise ValueError(f"alarm_thresholds: {key} must be a number in [0, 1], got {out[key]!r}")
    if not isinstance(out["stale_is_log_ratio_std"], (int, float)) or not out["stale_is_log_ratio_std"] > 0:
        raise ValueError(f"alarm_thresholds: stale_is_log_ratio_std must be a positive number, got "
                         f"{out['stale_is_log_ratio_std']!r}")
    for key, least in (("patience", 1), ("window", 2)):
        if not isinstance(out[key], int) or out[key] < least:
            raise ValueError(f"alarm_thresholds: {key} must be an integer >= {least}, got {out[key]!r}")
    return out


# ------------------------------------------------------------------------------------------------ rules
def sustained(values: Sequence[float], threshold: float, patience: int) -> bool:
    """The last ``patience`` values are all >= ``threshold`` (a missing or NaN value breaks the run)."""
    tail = list(values)[-patience:]
    return len(tail) == patience and all(v is not None and not math.isnan(v) and v >= threshold for v in tail)


def _mean(values) -> float | None:
    known = [v for v in values if v is not None and not math.isnan(v)]
    return sum(known) / len(known) if known else None


def stuck(values: Sequence[float], threshold: float, patience: int, improvement: float) -> dict | None:
    """A level that is high and not coming down, or None.

    Fires when the last ``patience`` values are all >= ``threshold`` (:func:`sustained`) and the ``patience`` values
    before them are known and their mean is less than ``improvement`` above the last ones' mean: with ``recent`` the
    last ``patience`` values and ``before`` the ``patience`` before them, ``mean(before) - mean(recent) <
    improvement``. Needs ``2 * patience`` values: before that the trend is unknown, and the start of a run is where
    a level is expected to be high (the model has not learned yet). Returns the two windows."""
    values = list(values)
    if len(values) < 2 * patience or not sustained(values, threshold, patience):
        return None
    recent, before = values[-patience:], values[-2 * patience : -patience]
    earlier = _mean(before)
    if earlier is None or earlier - _mean(recent) >= improvement:
        return None
    return {"recent": recent, "before": before}


def abstaining(void: Sequence[float | None], accuracy: Sequence[float | None], patience: int, rise: float,
               flat: float) -> dict | None:
    """The void share rising while accuracy does not, or None: with ``recent`` the last ``patience`` logging steps and
    ``before`` the ``patience`` before them, ``mean(void[recent]) - mean(void[before]) >= rise`` and
    ``mean(accuracy[recent]) - mean(accuracy[before]) < flat``. Needs ``2 * patience`` steps with both known."""
    void, accuracy = list(void), list(accuracy)
    if len(void) < 2 * patience or len(accuracy) < 2 * patience:
        return None
    windows = [_mean(x[-2 * patience : -patience]) for x in (void, accuracy)] + [
        _mean(x[-patience:]) for x in (void, accuracy)]
    if any(w is None for w in windows):
        return None
    void_before, acc_before, void_now, acc_now = windows
    if void_now - void_before >= rise and acc_now - acc_before < flat:
        return {"void_from": void_before, "void_to": void_now, "accuracy_from": acc_before, "accuracy_to": acc_now}
    return None


def train_means_between(train: Sequence[tuple[int, float]], steps: Sequence[int]) -> list[float | None]:
    """For each evaluation step, the mean of the training values logged since the previous one (inclusive of its
    own step; the first takes everything up to it); None where nothing was logged."""
    out, low = [], -math.inf
    for step in steps:
        vals = [v for s, v in train if low < s <= step and v is not None and not math.isnan(v)]
        out.append(sum(vals) / len(vals) if vals else None)
        low = step
    return out


def hacking_signature(train: Sequence[tuple[int, float]], evals: Sequence[tuple[int, float]], window: int,
                      rise: float, drop: float) -> dict | None:
    """The reward-hacking signature over the last ``window`` evaluations, or None.

    ``train``: (step, training success rate) per log; ``evals``: (step, held-out pass@1) per sampled evaluation.
    Fires when held-out pass@1 fell by >= ``drop`` from the window's first evaluation to its last while the training
    success rate logged before the last rose by >= ``rise`` over the training values logged by the first (or, for an
    evaluation before any training log, the first interval that has some)."""
    if len(evals) < window:
        return None
    last = list(evals)[-window:]
    means = train_means_between(train, [s for s, _ in evals])[-window:]
    start = next((i for i, m in enumerate(means) if m is not None), None)
    if start is None or start == window - 1 or means[-1] is None:
        return None
    train_delta, eval_delta = means[-1] - means[start], last[-1][1] - last[0][1]
    if train_delta >= rise and eval_delta <= -drop:
        return {"train_from": means[start], "train_to": means[-1], "eval_from": last[0][1], "eval_to": last[-1][1],
                "steps": (last[0][0], last[-1][0])}
    return None


def format_without_accuracy(train_reward: Sequence[tuple[int, float]], evals: Sequence[tuple[int, float, float]],
                            window: int, rise: float, flat: float) -> dict | None:
    """Held-out format rate and the training reward rose by >= ``rise`` over the last ``window`` evaluations while
    held-out pass@1 moved by less than ``flat``; ``evals``: (step, pass@1, format rate)."""
    if len(evals) < window:
        return None
    last = list(evals)[-window:]
    means = train_means_between(train_reward, [s for s, *_ in evals])[-window:]
    start = next((i for i, m in enumerate(means) if m is not None), None)
    if start is None or start == window - 1 or means[-1] is None or last[0][2] is None or last[-1][2] is None:
        return None
    fmt_delta, acc_delta, reward_delta = last[-1][2] - last[0][2], last[-1][1] - last[0][1], means[-1] - means[start]
    if fmt_delta >= rise and reward_delta >= rise and abs(acc_delta) < flat:
        return {"format_from": last[0][2], "format_to": last[-1][2], "eval_from": last[0][1], "eval_to": last[-1][1],
                "reward_from": means[start], "reward_to": means[-1], "steps": (last[0][0], last[-1][0])}
    return None


def stale_weights(ess: Sequence[float | None], log_std: Sequence[float | None], min_ess: float, max_log_std: float,
                  patience: int) -> dict | None:
    """The importance weights blown up for the last ``patience`` logging steps, or None: in each, ``ess <
    min_ess`` or ``log_std > max_log_std`` (a missing or NaN value is no evidence either way; both missing breaks
    the run). Returns the windows' values."""
    ess, log_std = list(ess)[-patience:], list(log_std)[-patience:]
    if len(ess) < patience or len(log_std) < patience:
        return None

    def known(v):
        return v is not None and not math.isnan(v)

    for e, s in zip(ess, log_std):
        if not ((known(e) and e < min_ess) or (known(s) and s > max_log_std)):
            return None
    return {"ess": ess, "log_std": log_std}


def counter_share(logs: dict, reward: str, keys: Sequence[str], rows_per_call: int) -> float | None:
    """The share of answers counted by ``<reward>/<key>`` for ``keys`` in one training log (the counters are counts
    per reward call and process, averaged by TRL), or None when the reward reports none of them."""
    found = [logs[f"{reward}/{k}"] for k in keys if isinstance(logs.get(f"{reward}/{k}"), (int, float))]
    return min(1.0, sum(found) / rows_per_call) if found and rows_per_call else None


# ------------------------------------------------------------------------------------------------ callback
class RLVRAlarmsCallback(TrainerCallback):
    """The alarms of the module docstring for ``trainer`` (an RLVRTrainer; thresholds from its config)."""

    def __init__(self, trainer, thresholds: dict | None = None):
        self.trainer = trainer
        self.t = parse_thresholds(thresholds if thresholds is not None else getattr(trainer.args, "alarm_thresholds",
                                                                                    None))
        self.reset()

    def reset(self) -> None:
        self.fired: dict[str, str] = {}
        self.series: dict[str, list[float | None]] = {}
        self.train_success: list[tuple[int, float]] = []
        self.train_reward: list[tuple[int, float]] = []
        self.evals: list[tuple[int, float, float | None]] = []

    def rows_per_call(self) -> int:
        """Answers one process scores per reward call: its share of a generation batch (the asynchronous trainer,
        which has no generation batch, scores one group per call)."""
        args = self.trainer.args
        if getattr(args, "generation_batch_size", None) is None:
            return max(1, args.num_generations)
        return max(1, args.generation_batch_size // max(1, self.trainer.accelerator.num_processes))

    def on_train_begin(self, args, state, control, **kwargs):
        self.reset()

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        step = state.global_step
        if "eval/pass@1" in logs:
            self.evals.append((step, logs["eval/pass@1"], logs.get("eval/format_rate")))
            self._check_evaluations()
        elif "rlvr/accuracy" in logs or "reward" in logs:
            self._record_training_log(step, logs)

    def _record_training_log(self, step: int, logs: dict) -> None:
        t, rows = self.t, self.rows_per_call()
        if isinstance(logs.get("rlvr/accuracy"), (int, float)):
            self.train_success.append((step, logs["rlvr/accuracy"]))
        if isinstance(logs.get("reward"), (int, float)):
            self.train_reward.append((step, logs["reward"]))
        values = {"truncation": (logs.get("rlvr/truncated_frac"), t["truncated_frac"]),
                  "zero_signal": (logs.get("rlvr/zero_signal_frac"), t["zero_signal_frac"])}
        for name in self.trainer.reward_func_names:
            values[f"unreadable/{name}"] = (counter_share(logs, name, UNREADABLE_COUNTERS, rows), t["unreadable_frac"])
            values[f"reward_failures/{name}"] = (counter_share(logs, name, FAILURE_COUNTERS, rows),
                                                 t["reward_failure_frac"])
            values[f"infra_failures/{name}"] = (counter_share(logs, name, INFRA_COUNTERS, rows),
                                                t["reward_failure_frac"])
        for name, (value, threshold) in values.items():
            series = self.series.setdefault(name, [])
            series.append(value)
            found = stuck(series, threshold, t["patience"], t["improvement"])
            if found:
                self._fire(name, self._threshold_message(name, found["recent"], found["before"], threshold))
        self._check_void_turns(logs)
        self._check_stale_is(logs)

    def _check_stale_is(self, logs: dict) -> None:
        """The ``stale_is`` alarm (:func:`stale_weights`), from logs that have the ``stale_is/`` metrics."""
        if not any(isinstance(logs.get(k), (int, float)) for k in ("stale_is/ess_frac", "stale_is/log_ratio_std")):
            return
        ess, log_std = self.series.setdefault("stale_is/ess_frac", []), self.series.setdefault("stale_is/std", [])
        for series, key in ((ess, "stale_is/ess_frac"), (log_std, "stale_is/log_ratio_std")):
            series.append(logs[key] if isinstance(logs.get(key), (int, float)) else None)
        t = self.t
        found = stale_weights(ess, log_std, t["stale_is_ess_frac"], t["stale_is_log_ratio_std"], t["patience"])
        if not found:
            return
        numbers = ", ".join("-" if e is None else f"{e:.0%}" for e in found["ess"])
        spreads = ", ".join("-" if s is None else f"{s:.2f}" for s in found["log_std"])
        self._fire("stale_is", (
            f"stale rollouts: the importance weights' effective sample size was {numbers} of the tokens and the "
            f"log-ratio's spread {spreads} nats over the last {t['patience']} logging steps (bounds "
            f"{t['stale_is_ess_frac']:.0%}, {t['stale_is_log_ratio_std']:.2f} nats; not calibrated on a run): the "
            "policy trains on rollouts far from it. Lower max_staleness, sync weights more often "
            "(weight_sync_steps) or lower the learning rate. Alarms: alarm_thresholds (stale_is_ess_frac, "
            "stale_is_log_ratio_std, patience), alarms=False."))

    def _check_void_turns(self, logs: dict) -> None:
        """The ``void_turns`` alarm (:func:`abstaining`), from logs that have ``rlvr/void_turn_rollouts``."""
        if not isinstance(logs.get("rlvr/void_turn_rollouts"), (int, float)):
            return
        void = self.series.setdefault("void_share", [])
        accuracy = self.series.setdefault("void_share/accuracy", [])
        void.append(logs["rlvr/void_turn_rollouts"])
        accuracy.append(logs.get("rlvr/accuracy") if isinstance(logs.get("rlvr/accuracy"), (int, float)) else None)
        t = self.t
        found = abstaining(void, accuracy, t["patience"], t["rise"], t["flat"])
        if not found:
            return
        action = getattr(self.trainer.args, "void_turn_action", "off")
        fix = ("void_turn_action='score_as_wrong' scores them as wrong answers"
               if action in VOID_TURN_ADVANTAGE_ACTIONS else "read the void rollouts")
        self._fire("void_turns", (
            f"rollouts that give no answer (void turns) rose {found['void_from']:.0%} -> {found['void_to']:.0%} over "
            f"the last {2 * t['patience']} logging steps while training success moved {found['accuracy_from']:.0%} "
            f"-> {found['accuracy_to']:.0%}: with void_turn_action={action!r} the policy may be learning to abstain "
            f"rather than answer; {fix}. Alarms: RLVRConfig.alarm_thresholds (patience, rise, flat), alarms=False."))

    def _threshold_message(self, name: str, recent: list[float], before: list[float | None], threshold: float) -> str:
        numbers = ", ".join(f"{v:.0%}" for v in recent)
        earlier = ", ".join("-" if v is None or math.isnan(v) else f"{v:.0%}" for v in before)
        args = self.trainer.args
        what = {
            "truncation": (f"answers cut off at max_completion_length={args.max_completion_length}",
                           "raise max_completion_length, or penalize length (overlong_buffer_length)"),
            "zero_signal": ("groups with no signal (all rewards equal: zero advantage)",
                            ("dynamic_sampling=True trains on informative groups only; an easier task or a larger "
                             "num_generations gives more groups signal")),
        }
        kind, _, reward = name.partition("/")
        if kind == "unreadable":
            text, fix = (f"answers {reward} could not read (scored 0)",
                         "check the prompt asks for the form it reads and the budget leaves room for it")
        elif kind == "reward_failures":
            text, fix = (f"answers {reward} failed to check (errors, timeouts; scored 0)",
                         "raise its timeout (reward_options) or look at the answers it errs on")
        elif kind == "infra_failures":
            text, fix = (f"answers {reward} could not check because its own machinery failed (workers lost, a "
                         "sandbox that did not start; not scored, advantage 0)",
                         "read the warnings that name the cause, and run `trl-rlvr doctor` for the sandbox's needs")
        else:
            text, fix = what[name]
        return (f"{text}: {numbers} over the last {len(recent)} logging steps, after {earlier} (at or above "
                f"{threshold:.0%} and not coming down); {fix}. "
                f"Alarms: RLVRConfig.alarm_thresholds, alarms=False.")

    def _check_evaluations(self) -> None:
        t = self.t
        found = hacking_signature(self.train_success, [(s, p) for s, p, _ in self.evals], t["window"], t["rise"],
                                  t["drop"])
        if found:
            self._fire("reward_hacking", (
                f"training success rose {found['train_from']:.0%} -> {found['train_to']:.0%} while held-out pass@1 fell "
                f"{found['eval_from']:.0%} -> {found['eval_to']:.0%} (steps {found['steps'][0]}-{found['steps'][1]}): "
                "the reward pays for something other than the task (reward hacking). Read recent completions, "
                "tighten the reward, and keep the checkpoint with the best eval/pass@1 (metric_for_best_model)."))
        found = format_without_accuracy(self.train_reward, self.evals, t["window"], t["rise"], t["flat"])
        if found:
            self._fire("format_without_accuracy", (
                f"held-out format rate rose {found['format_from']:.0%} -> {found['format_to']:.0%} and the training "
                f"reward {found['reward_from']:.2f} -> {found['reward_to']:.2f} while held-out pass@1 stayed at "
                f"{found['eval_from']:.0%} -> {found['eval_to']:.0%} (steps {found['steps'][0]}-{found['steps'][1]}): "
                "the reward is being earned by form, not by right answers. If it lasts, lower the format reward's "
                "weight (reward_weights)."))

    def _fire(self, name: str, message: str) -> None:
        if name in self.fired:
            return
        self.fired[name] = message
        logger.warning("trl-rlvr alarm %s: %s", name, message)
        if callable(getattr(self.trainer, "record_alarm", None)):  # a trainer that logs it itself (asynchronous)
            self.trainer.record_alarm(name)
        elif hasattr(self.trainer, "_metrics"):
            metrics_to_log(self.trainer, "train")[f"rlvr/alarm/{name}"].append(1.0)
