"""The ``rlvr/`` diagnostics of one generation batch (pure functions).

- ``rlvr/accuracy``: share of answers counted right by the success reward (score >= threshold);
- ``rlvr/length_right`` / ``rlvr/length_wrong``: mean completion tokens of right / wrong answers: the
  length-bias signal of Liu et al. (2025) (NaN, i.e. not logged, when there is no such answer);
- ``rlvr/zero_signal_frac``: share of groups whose total rewards are all equal (zero advantage);
- ``rlvr/zero_signal_expected``: p^G + (1-p)^G with p = the batch's accuracy, the waste if every question
  were equally hard; the gap to the measured share shows how uneven the difficulty is;
- ``rlvr/truncated_frac``: share of answers cut off at ``max_completion_length``.

With tools (``tools=`` or ``environment_factory=``), ``tool_metrics``:

- ``rlvr/tool_calls_per_rollout``: tool results per rollout (every tool; TRL's ``tools/call_frequency`` is per
  batch and counts calls whose results were then dropped for length);
- ``rlvr/tool_errors_per_rollout``, ``rlvr/tool_timeouts_per_rollout``, ``rlvr/tool_restarts_per_rollout``: over
  the rollouts whose environment keeps ``stats`` (``PythonEnvironment``): cells that raised, that ran out of time,
  and interpreters that died or hung and were replaced. (Cells that printed an error they caught,
  ``stats["printed_errors"]``, count in resample-on-correct's selection, :func:`shown_tool_errors`.)

``rlvr/unscorable_frac`` (logged by the trainer, :mod:`trl_rlvr.algorithms.unscorable`): the share of rows whose
correctness check returned None, left out of every baseline.

``rlvr/clip_low_frac`` / ``rlvr/clip_high_frac`` are TRL's own ``clip_ratio/low_mean`` / ``high_mean``
(tokens whose gradient the asymmetric clip zeroes), re-published under the same prefix by the trainer.
"""

from __future__ import annotations

import math

import torch

from trl_rlvr.algorithms.advantages import expected_zero_signal_frac, zero_signal_groups


def rollout_metrics(
    rewards: torch.Tensor,
    success_scores: torch.Tensor,
    lengths: torch.Tensor,
    truncated: torch.Tensor,
    group_size: int,
    success_threshold: float = 1.0,
    tolerance: float = 0.0,
) -> dict[str, float]:
    """Diagnostics of one generation batch; every argument covers the global batch, group after group.

    Args:
        rewards: (N,) total (weighted) reward of each answer, the quantity the advantages are computed from.
        success_scores: (N,) score of the success reward (NaN where it did not apply).
        lengths: (N,) completion lengths in tokens.
        truncated: (N,) bool, answer cut off by the length limit.
        group_size: answers per question (G).
    """
    right = success_scores >= success_threshold  # NaN compares False: unscored answers count as wrong
    lengths = lengths.float()
    accuracy = right.float().mean().item()
    return {
        "rlvr/accuracy": accuracy,
        "rlvr/length_right": lengths[right].mean().item() if right.any() else math.nan,
        "rlvr/length_wrong": lengths[~right].mean().item() if (~right).any() else math.nan,
        "rlvr/zero_signal_frac": zero_signal_groups(rewards, group_size, tolerance).float().mean().item(),
        "rlvr/zero_signal_expected": expected_zero_signal_frac(accuracy, group_size),
        "rlvr/truncated_frac": truncated.float().mean().item(),
    }


#: The ``stats`` counters of an environment that :func:`tool_rollout_rows` reads, in its columns' order.
STATS_COUNTERS = ("errors", "timeouts", "restarts")
#: The counters of the errors a rollout shows (a cell that raised, timed out or exited; a printed error): what
#: resample-on-correct selects on. Each cell counts in one of them at most (``PythonEnvironment``).
SHOWN_ERROR_COUNTERS = ("errors", "timeouts", "printed_errors")


def _stats(env) -> dict | None:
    stats = getattr(env, "stats", None)
    return stats if isinstance(stats, dict) else None


def tool_rollout_rows(completions: list, environments: list) -> list[list[float]]:
    """Per rollout ``[has_stats, tool results, *STATS_COUNTERS]`` (the input of :func:`tool_metrics`): the tool
    messages of its completion, and the ``stats`` of its environment where it keeps them (``PythonEnvironment``);
    an environment without ``stats`` (or none) gives zeros and ``has_stats`` 0."""
    rows = []
    for completion, env in zip(completions, environments, strict=True):
        calls = sum(1 for m in completion if isinstance(m, dict) and m.get("role") == "tool")
        stats = _stats(env)
        counters = [float(stats.get(k, 0)) if stats else 0.0 for k in STATS_COUNTERS]
        rows.append([1.0 if stats else 0.0, calls, *counters])
    return rows


def shown_tool_errors(environments: list) -> list[float]:
    """Per rollout, the tool errors it shows: the sum of its environment's :data:`SHOWN_ERROR_COUNTERS` (0 for an
    environment without ``stats``). A caught error still counts when its traceback or error line is printed."""
    return [float(sum(stats.get(k, 0) for k in SHOWN_ERROR_COUNTERS)) if (stats := _stats(env)) else 0.0
            for env in environments]


def tool_metrics(rows: torch.Tensor) -> dict[str, float]:
    """Tool metrics of one generation batch from ``rows`` (N, 2 + len(STATS_COUNTERS)): per rollout ``[has_stats,
    tool results, *STATS_COUNTERS]`` (the counters 0 where ``has_stats`` is 0; their means are over the rollouts
    that have stats, absent when none has)."""
    has_stats, calls = rows[:, 0] > 0, rows[:, 1]
    out = {"rlvr/tool_calls_per_rollout": calls.mean().item()}
    if has_stats.any():
        for i, name in enumerate(STATS_COUNTERS, start=2):
            out[f"rlvr/tool_{name}_per_rollout"] = rows[has_stats, i].mean().item()
    return out
