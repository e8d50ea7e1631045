r"""Group-relative advantages and the zero-signal arithmetic (pure functions on tensors).

GRPO (Shao et al., 2024) samples a group of G answers per question and uses the group as its own
baseline, with the population standard deviation (dividing by G)::

    A_i = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps)          scale_rewards="group"
    A_i =  r_i - mean(r_1..r_G)                                     scale_rewards="none" (Dr. GRPO)

Rewards (1, 0, 0, 1) give (+1, -1, -1, +1); (1, 0, 0, 0) gives +1.73 for the right answer and
-0.58 for each wrong one. A group whose rewards are all equal has zero advantage everywhere and
teaches nothing; for a question answered right with probability p that happens with probability
p^G + (1-p)^G (66% at p=0.9, G=4; 19% at G=16).

TRL 1.16 computes the same advantages inside its trainer but with the *sample* standard deviation
(Bessel's correction, dividing by G-1): for (1, 0, 0, 1) it gives +-0.87, not +-1. RLVRTrainer therefore
recomputes them with :func:`group_advantages`, the formula above; ``std="sample"`` (``RLVRConfig.advantage_std``)
keeps TRL's definition, sqrt(G/(G-1)) times the population std.

RLOO (Ahmadian et al., 2024, "Back to Basics: Revisiting REINFORCE-Style Optimization for Learning from Human
Feedback in LLMs") leaves each answer out of its own baseline::

    A_i = r_i - (1/(G-1)) sum_{j != i} r_j  =  G/(G-1) (r_i - mean(r_1..r_G))      baseline="leave_one_out"

The baseline no longer depends on the answer it is subtracted from, so (1/G) sum_i A_i grad log pi(y_i) is an
unbiased estimate of the policy gradient; the group-mean version equals (G-1)/G times it, so its expectation
is (G-1)/G times the true gradient (a scale, not a direction, error; tests/algorithms/test_advantages_rloo.py derives
and checks both exactly). The paper and verl's ``rloo`` estimator do not divide by a std: that is
``scale_rewards="none"``. With ``"group"``/``"batch"`` the leave-one-out difference is divided by the same
population std as GRPO's (so it is G/(G-1) times GRPO's advantage); the std depends on r_i, so exact
unbiasedness then no longer holds, as for GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training").
"""

from __future__ import annotations

import torch

#: ``advantage_baseline`` values: the group mean (GRPO) or the mean of the other answers (RLOO).
BASELINES = ("group_mean", "leave_one_out")
#: ``advantage_std`` values: divide by the count (GRPO's definition) or by count - 1 (Bessel; TRL's ``nanstd``).
STD_KINDS = ("population", "sample")


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    scale_rewards: str = "group",
    eps: float = 1e-4,
    baseline: str = "group_mean",
    std: str = "population",
) -> torch.Tensor:
    """Advantages of a flat reward vector laid out group after group (``len(rewards) % group_size == 0``).

    ``baseline``: "group_mean" subtracts the group's mean (GRPO), "leave_one_out" the mean of the group's other
    answers (RLOO; see the module docstring). ``scale_rewards``: "group" divides by the group's population std,
    "batch" by the whole batch's, "none" does not divide (Dr. GRPO; RLOO as published). NaN rewards (unscorable
    answers) are left out of the statistics and get advantage 0; with the leave-one-out baseline a group with
    fewer than two scored answers gets 0 everywhere. ``std``: "population" (divide by n) or "sample" (by n - 1,
    as TRL's ``nanstd``; a group with one scored answer then has no std and gets 0).
    """
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards={scale_rewards!r} is not valid; allowed values: 'group', 'batch', 'none'")
    if baseline not in BASELINES:
        raise ValueError(f"advantage_baseline={baseline!r} is not valid; allowed values: {', '.join(map(repr, BASELINES))}")
    if std not in STD_KINDS:
        raise ValueError(f"advantage_std={std!r} is not valid; allowed values: {', '.join(map(repr, STD_KINDS))}")
    grouped = rewards.view(-1, group_size)
    centered = grouped - torch.nanmean(grouped, dim=1, keepdim=True)
    if baseline == "leave_one_out":  # r_i - mean of the other n-1 scored answers = n/(n-1) (r_i - mean of n)
        n = (~torch.isnan(grouped)).sum(dim=1, keepdim=True).to(centered.dtype)
        centered = centered * torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    if scale_rewards == "group":
        centered = centered / (_nanstd(grouped, 1, std) + eps)
    elif scale_rewards == "batch":
        centered = centered / (_nanstd(rewards.view(1, -1), 1, std) + eps)
    return torch.nan_to_num(centered.reshape(-1), nan=0.0)


def _nanstd(x: torch.Tensor, dim: int, kind: str = "population") -> torch.Tensor:
    """Standard deviation ignoring NaNs, keeping ``dim``: the mean squared deviation over the count n
    ("population") or times n/(n-1) ("sample", Bessel's correction; NaN for n = 1, as TRL's ``nanstd``)."""
    centered = x - torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean(centered**2, dim=dim, keepdim=True)
    if kind == "sample":
        n = (~torch.isnan(x)).sum(dim=dim, keepdim=True).to(variance.dtype)
        variance = variance * n / (n - 1)
    return variance.sqrt()


def zero_signal_groups(rewards: torch.Tensor, group_size: int, tolerance: float = 0.0) -> torch.Tensor:
    """Boolean mask, one entry per group: True where max(r) - min(r) <= tolerance (exact equality by default).

    NaN rewards (every reward function returned None) are ignored, as in TRL's nan-aware baseline; a group
    with fewer than two scored answers has no signal.
    """
    grouped = rewards.view(-1, group_size)
    valid = ~torch.isnan(grouped)
    high = torch.where(valid, grouped, torch.full_like(grouped, -torch.inf)).amax(dim=1)
    low = torch.where(valid, grouped, torch.full_like(grouped, torch.inf)).amin(dim=1)
    return (valid.sum(dim=1) < 2) | ((high - low) <= tolerance)


def expected_zero_signal_frac(p: float, group_size: int) -> float:
    """p^G + (1-p)^G: the share of groups with no signal if every question were answered right with probability p."""
    return p**group_size + (1.0 - p) ** group_size


def require_finite_rewards(rewards_per_func: torch.Tensor, reward_func_names: list[str]) -> None:
    """Raise if a reward function returned +-inf (NaN is TRL's "not scored by this function", from ``None``).

    An infinite reward does not fail by itself: it becomes NaN advantages (``scale_rewards="none"``) or
    silently zeroes every other answer's advantage (a std of inf), and dynamic sampling keeps such a group as
    informative. It is a bug of the reward function, so training stops here, naming it and the row (in the
    batch gathered over processes), rather than masking it as ``None``, which would change the objective
    without anyone noticing."""
    bad = torch.isinf(rewards_per_func)
    if not bad.any():
        return
    row, col = (int(i) for i in bad.nonzero()[0])
    count = int(bad.sum())
    raise ValueError(
        f"reward function {reward_func_names[col]!r} returned {rewards_per_func[row, col].item()} for row {row} of "
        f"the generation batch ({count} non-finite reward{'s' if count > 1 else ''} in all); rewards must be "
        "finite numbers, or None for an answer the function does not score"
    )
