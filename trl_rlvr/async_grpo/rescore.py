"""The RLVR advantages of one group of TRL's rollout samples, as the asynchronous trainer's reward process sets them.

TRL's rollout process (``_AsyncRolloutLoop._score_group``) scores a group and emits its ``RolloutSample`` rows answer
after answer (an answer may fork into several rows), each row's ``metrics`` holding every reward column unweighted
(``rewards/<name>``, NaN where the function returned None) and its ``advantage`` TRL's. :func:`rescore_rows` reads
the columns back, computes the group's advantages with the RLVR switches (:func:`trl_rlvr.algorithms.group_scores
.group_scores`) and writes them on the rows; with dynamic sampling a zero-signal group is dropped here, before it is
queued (its prompt's slot is refilled by the loop: it keeps ``max_inflight_tasks`` generations in flight).

An answer without a training row (nothing the model wrote to train on) leaves no rewards to read: such a group keeps
TRL's advantages and is counted (``rlvr/rescore_skipped_total``) rather than guessed at.

The ``rlvr/`` rollout metrics of :func:`group_rollout_metrics` mean what ``RLVRTrainer``'s mean
(:func:`trl_rlvr.algorithms.metrics.rollout_metrics`): they describe every scored group, before dynamic sampling's
filter, each a ``(numerator, denominator)`` pair that TRL's asynchronous trainer sums over the logging window.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

from trl_rlvr.algorithms.group_scores import group_scores


@dataclass(frozen=True)
class GroupScoring:
    """What the reward process needs to score a group the RLVR way (picklable: it travels to the spawned process).

    ``weights``: of the reward functions, in their order (columns after them, an environment's own reward, weigh 1);
    ``correctness_checks``: indices of the columns whose None makes a row unscorable."""

    weights: tuple[float, ...]
    correctness_checks: tuple[int, ...] = ()
    scale_rewards: str = "group"
    baseline: str = "group_mean"
    std: str = "population"
    dynamic_sampling: bool = False
    tolerance: float = 0.0
    success: int | None = None  # the success reward's column (rlvr/accuracy), None: no accuracy metrics
    success_threshold: float = 1.0


def rescore_rows(samples: list, rows_per_answer: list[int], reward_func_names: list[str], scoring: GroupScoring,
                 answers: dict | None = None) -> tuple[list, dict[str, float | tuple[float, float]]]:
    """(the rows to queue, metrics) for one group's rows; ``rows_per_answer[i]`` rows belong to answer ``i``.

    Metrics, in TRL's async conventions (a ``total`` word: a counter; a pair: a rate): ``rlvr/unscorable_frac``,
    ``rlvr/ds_dropped_groups_total``, ``rlvr/ds_scored_groups_total``, ``rlvr/rescore_skipped_total``, and with
    ``answers`` (per answer ``lengths``, ``truncated``, ``tool_calls`` or None) :func:`group_rollout_metrics`."""
    if sum(rows_per_answer) != len(samples):
        raise ValueError(f"rescore_rows: {len(samples)} rows for answers of {rows_per_answer} rows")
    if not samples or 0 in rows_per_answer:
        return samples, {"rlvr/rescore_skipped_total": 1.0}
    starts = [0, *accumulate(rows_per_answer)][:-1]
    columns = [f"rewards/{name}" for name in reward_func_names]
    rewards = torch.tensor([[samples[s].metrics[c] for c in columns] for s in starts], dtype=torch.float64)
    weights = [*scoring.weights, *[1.0] * (len(columns) - len(scoring.weights))]
    scores = group_scores(rewards, weights, scoring.correctness_checks, scale_rewards=scoring.scale_rewards,
                          baseline=scoring.baseline, std=scoring.std, tolerance=scoring.tolerance)
    metrics = {"rlvr/unscorable_frac": (float(scores.unscorable.sum()), float(len(starts))),
               "rlvr/ds_scored_groups_total": 1.0}
    kept = not (scoring.dynamic_sampling and not scores.informative)
    if answers is not None:
        success = rewards[:, scoring.success] if scoring.success is not None else None
        metrics.update(group_rollout_metrics(success, scoring.success_threshold, bool(scores.informative), kept,
                                             **answers))
    if not kept:
        return [], {**metrics, "rlvr/ds_dropped_groups_total": 1.0}
    for answer, (start, count) in enumerate(zip(starts, rows_per_answer)):
        for sample in samples[start:start + count]:
            sample.advantage = float(scores.advantages[answer])
            sample.metrics["reward"] = float(scores.rewards[answer])
    return samples, {**metrics, "rlvr/ds_dropped_groups_total": 0.0}


def group_rollout_metrics(success_scores: torch.Tensor | None, success_threshold: float, informative: bool,
                          kept: bool, lengths: list[int], truncated: list[bool], tool_calls: list[int] | None = None
                          ) -> dict[str, tuple[float, float]]:
    """One scored group's share of the ``rlvr/`` rollout metrics, as pairs (numerator, denominator):
    ``rlvr/accuracy`` (answers whose success score >= ``success_threshold``; NaN counts as wrong),
    ``rlvr/length_right`` / ``rlvr/length_wrong`` (completion tokens), ``rlvr/truncated_frac``,
    ``rlvr/zero_signal_frac``, ``rlvr/kept_groups_frac`` and, with ``tool_calls``, ``rlvr/tool_calls_per_rollout``."""
    n = float(len(lengths))
    length = torch.tensor(lengths, dtype=torch.float64)
    out = {"rlvr/truncated_frac": (float(sum(bool(t) for t in truncated)), n),
           "rlvr/zero_signal_frac": (float(not informative), 1.0),
           "rlvr/kept_groups_frac": (float(kept), 1.0)}
    if success_scores is not None:
        right = success_scores >= success_threshold  # NaN compares False
        out["rlvr/accuracy"] = (float(right.sum()), n)
        out["rlvr/length_right"] = (float(length[right].sum()), float(right.sum()))
        out["rlvr/length_wrong"] = (float(length[~right].sum()), float((~right).sum()))
    if tool_calls is not None:
        out["rlvr/tool_calls_per_rollout"] = (float(sum(tool_calls)), n)
    return out
