r"""The random-reward control of an RL run: the run's own rewards, shuffled within each batch.

A gain from RL may come from the update itself (format, sharper sampling) rather than from the reward's signal:
Qwen2.5-Math gains about 21 points on MATH-500 with random rewards (Shao et al., 2025, "Spurious Rewards:
Rethinking Training Signals in RLVR", arXiv 2506.10947). The control keeps everything of the run but the link
between an answer and its reward: the same batch, the same reward values (their mean and spread, hence the same
share of zero-signal groups in expectation and updates of the same size), each answer given another answer's
rewards. RL that beats its control by a margin learned from the reward.

One permutation ``pi`` of the batch, drawn from ``(seed, batch)``, is shared by every reward function of the run,
so that an answer's whole reward vector moves together: ``r'_f[i] = r_f[pi(i)]`` for every reward function ``f``.
The permutation depends only on the seed and the batch's prompts and completions (a SHA-256 of their ``repr``), so
it is reproducible, identical for the reward functions TRL calls one after another on the same batch, and keeps no
state between batches.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Any


def batch_permutation(prompts: Sequence, completions: Sequence, seed: int) -> list[int]:
    """The permutation of a batch of ``len(completions)`` answers: a seeded shuffle of ``range(n)`` whose seed is
    ``seed`` and a SHA-256 of the batch's prompts and completions."""
    digest = hashlib.sha256(repr((seed, list(prompts), list(completions))).encode("utf-8", "surrogatepass")).digest()
    order = list(range(len(completions)))
    random.Random(int.from_bytes(digest[:16], "big")).shuffle(order)
    return order


class ShuffledReward:
    """``reward``'s scores of a batch, permuted by :func:`batch_permutation` (score ``i`` is answer ``pi(i)``'s).

    A TRL reward function like the one it wraps: the same ``__name__`` (TRL logs ``rewards/<name>/mean``; the
    trainer's ``success_reward`` finds it by that name) and every other attribute read through to ``reward``
    (``required_columns``, ``verifies_correctness``, ...)."""

    def __init__(self, reward: Callable[..., list], seed: int = 0):
        self.reward, self.seed = reward, int(seed)
        self.__name__ = getattr(reward, "__name__", type(reward).__name__)

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list:
        scores = list(self.reward(prompts=prompts, completions=completions, **kwargs))  # as TRL calls it
        if len(scores) != len(completions):
            raise ValueError(f"reward {self.__name__!r} returned {len(scores)} scores for {len(completions)} answers")
        return [scores[j] for j in batch_permutation(prompts, completions, self.seed)]

    def __getattr__(self, name: str) -> Any:  # only called for names this object lacks
        if name == "reward":  # not yet set (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.reward, name)

    def __repr__(self) -> str:
        return f"ShuffledReward({self.reward!r}, seed={self.seed})"


def shuffled_rewards(reward_funcs: Sequence[Callable[..., list]], seed: int = 0) -> list[ShuffledReward]:
    """The random-reward control of ``reward_funcs``: each wrapped in :class:`ShuffledReward` with the same
    ``seed``, so that one permutation per batch moves every reward of an answer together."""
    return [ShuffledReward(f, seed) for f in reward_funcs]
