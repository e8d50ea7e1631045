"""pass@k and maj@k from n samples per question: exact, pure functions (standard library only).

**pass@k** (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1): with ``n`` samples of
which ``c`` are right, the unbiased estimator of the probability that at least one of ``k`` samples is right is

    pass@k = 1 - C(n - c, k) / C(n, k)

i.e. one minus the share of the ``k``-subsets of the ``n`` samples that hold no right sample. ``pass@1 = c / n``
(the mean@n accuracy). Computed with exact integers; the one rounding is the final division.

**maj@k** (majority vote, self-consistency; Wang et al. 2022): every sample votes for the class of its final
answer (answers grouped by the verifier's own equivalence, see :mod:`trl_rlvr.rewards.voting`); a sample with no
extractable answer casts no vote. For one ``k``-subset of the samples, the majority class is the one with the
most votes; the subset scores 1 if that class is right, 0 if it is wrong or no sample in the subset voted. A tie
between ``t`` classes of which ``r`` are right scores ``r / t``: the expected score of a uniformly random
tie-break, so the value does not depend on the order of the samples. maj@k is the mean of this score over all
``C(n, k)`` subsets (the expected majority-vote accuracy of ``k`` samples drawn without replacement from the
``n``), computed exactly (:func:`maj_at_k`); ``maj@n`` is the vote of all ``n`` samples.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from fractions import Fraction
from math import comb

__all__ = ["check_k", "mean_pass_at_k", "maj_at_k", "pass_at_k"]


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_k(n: int, k: int) -> None:
    """``ValueError`` unless ``1 <= k <= n`` (pass@k and maj@k need at least k samples)."""
    if not _is_int(n) or n < 1:
        raise ValueError(f"n (samples per question) must be a positive integer, got {n!r}")
    if not _is_int(k) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if k > n:
        raise ValueError(f"k={k} > n={n}: pass@k and maj@k need at least k samples per question (raise n)")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al.'s unbiased pass@k for ``c`` right answers out of ``n`` samples: ``1 - C(n-c, k) / C(n, k)``."""
    check_k(n, k)
    if not _is_int(c) or not 0 <= c <= n:
        raise ValueError(f"c (right samples) must be an integer in [0, n={n}], got {c!r}")
    return 1.0 - comb(n - c, k) / comb(n, k)  # int / int: correctly rounded


def mean_pass_at_k(n: int, right_counts: Sequence[int], k: int) -> float:
    """pass@k averaged over questions (each with ``n`` samples, ``right_counts[q]`` of them right)."""
    if not right_counts:
        raise ValueError("mean_pass_at_k: no questions")
    return sum(pass_at_k(n, c, k) for c in right_counts) / len(right_counts)


def maj_at_k(votes: Sequence[Hashable | None], right: Mapping[Hashable, bool], k: int) -> float:
    """Expected majority-vote accuracy of ``k`` of the samples (see the module docstring for the definition).

    ``votes[i]`` is the answer class of sample ``i`` (``None``: no answer, no vote); ``right[cls]`` says whether
    that class is the right answer. Exact: a dynamic program over the classes whose state is (samples chosen,
    top vote count, classes at the top, right classes at the top), weighted by the number of ways to choose
    them; the samples without a vote fill the rest of the subset. Cost O(C * k^3 * T^2) for C classes and at
    most T of them tied, independent of C(n, k).
    """
    n = len(votes)
    check_k(n, k)
    sizes: dict[Hashable, int] = defaultdict(int)
    no_vote = 0
    for v in votes:
        if v is None:
            no_vote += 1
        else:
            sizes[v] += 1
    missing = [c for c in sizes if c not in right]
    if missing:
        raise ValueError(f"maj_at_k: no verdict for the answer class(es) {missing[:3]}")
    # state (chosen, top, tied, tied_right) -> number of ways; the empty choice has top 0
    states: dict[tuple[int, int, int, int], int] = {(0, 0, 0, 0): 1}
    for cls, size in sizes.items():
        good = bool(right[cls])
        nxt: dict[tuple[int, int, int, int], int] = defaultdict(int)
        for (j, top, tied, tied_right), ways in states.items():
            for x in range(0, min(size, k - j) + 1):
                w = ways * comb(size, x)
                if x == 0 or x < top:
                    key = (j + x, top, tied, tied_right)
                elif x == top:
                    key = (j + x, top, tied + 1, tied_right + good)
                else:
                    key = (j + x, x, 1, int(good))
                nxt[key] += w
        states = nxt
    total = Fraction(0)
    for (j, top, tied, tied_right), ways in states.items():
        rest = k - j
        if top == 0 or rest > no_vote:
            continue  # no vote in the subset (scores 0), or not enough silent samples to fill it
        total += Fraction(ways * comb(no_vote, rest) * tied_right, tied)
    return float(total / comb(n, k))
