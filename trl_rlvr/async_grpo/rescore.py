"""The RLVR advantages of one group of TRL's rollout samples, as the asynchronous trainer's reward process sets them.

TRL's rollout process (``_AsyncRolloutLoop._score_group``) scores a group and emits its ``RolloutSample`` rows answer
after answer (an answer may fork into several rows), each row's ``metrics`` holding every reward column unweighted
(``rewards/<name>``, NaN where the function returned None) and its ``advantage`` TRL's. :func:`rescore_rows` reads
the columns back, computes the group's advantages with the RLVR switches (:func:`trl_rlvr.algorithms.group_scores
.group_scores`) and writes them on the rows; with dynamic sampling a zero-signal group is dropped here, before it is
queued (its prompt's slot is refilled by the loop: it keeps ``max_inflight_tasks`` generations in flight).

An answer without a training row (nothing the model wrote to train on) leaves no rewards to read: such a group keeps
TRL's advantages and is counted (``rlvr/rescore_skipped_total``) rather than guessed at.
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


def rescore_rows(samples: list, rows_per_answer: list[int], reward_func_names: list[str], scoring: GroupScoring
                 ) -> tuple[list, dict[str, float | tuple[float, float]]]:
    """(the rows to queue, metrics) for one group's rows; ``rows_per_answer[i]`` rows belong to answer ``i``.

    Metrics, in TRL's async conventions (a ``total`` word: a counter; a pair: a rate): ``rlvr/unscorable_frac``,
    ``rlvr/ds_dropped_groups_total``, ``rlvr/ds_scored_groups_total``, ``rlvr/rescore_skipped_total``."""
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
    if scoring.dynamic_sampling and not scores.informative:
        return [], {**metrics, "rlvr/ds_dropped_groups_total": 1.0}
    for answer, (start, count) in enumerate(zip(starts, rows_per_answer)):
        for sample in samples[start:start + count]:
            sample.advantage = float(scores.advantages[answer])
            sample.metrics["reward"] = float(scores.rewards[answer])
    return samples, {**metrics, "rlvr/ds_dropped_groups_total": 0.0}
