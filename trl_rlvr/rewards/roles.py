"""Which reward functions of a run decide what: the success reward (right or wrong) and the correctness checks
(whose ``None`` makes a row unscorable, :mod:`trl_rlvr.algorithms.unscorable`)."""

from __future__ import annotations

from collections.abc import Sequence


def success_reward_index(reward_funcs: Sequence, reward_func_names: Sequence[str], name: str | None) -> int | None:
    """Index of the reward that decides "right": ``success_reward`` by ``name``, else the first reward function that
    declares ``verifies_correctness = True`` (``boxed_math``, ``code_sandbox``), else the first one; None without
    rewards. A ``ValueError`` naming ``success_reward`` for a name that is not a reward function of the run."""
    if not reward_func_names:
        return None
    if name is None:
        verifiers = [i for i, f in enumerate(reward_funcs) if getattr(f, "verifies_correctness", False)]
        return verifiers[0] if verifiers else 0
    if name not in reward_func_names:
        raise ValueError(f"success_reward={name!r} is not a reward function here; known: {list(reward_func_names)}")
    return list(reward_func_names).index(name)


def correctness_check_indices(reward_func_names: Sequence[str], names: Sequence[str] | None,
                              success_index: int | None) -> list[int]:
    """Indices of the rewards whose ``None`` makes a row unscorable (``correctness_rewards``; default: the success
    reward). A ``ValueError`` naming ``correctness_rewards`` for a name that is not a reward function of the run."""
    if names is None:
        return [] if success_index is None else [success_index]
    known = list(reward_func_names or [])
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"correctness_rewards names {unknown}, not reward functions here; known: {known}")
    return [known.index(n) for n in names]
