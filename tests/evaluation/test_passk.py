"""pass@k and maj@k (trl_rlvr.evaluation.passk) against brute-force enumeration of all k-subsets, edge cases and errors;
answer classes by the verifier's equivalence (trl_rlvr.rewards.voting, boxed_math's extract_answer / same_answers)."""

import itertools
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.evaluation.passk import maj_at_k, mean_pass_at_k, pass_at_k
from trl_rlvr.rewards.voting import answer_classes, supports_voting


# ------------------------------------------------------------------------------------------------ brute force
def brute_pass_at_k(flags, k):
    subsets = list(itertools.combinations(range(len(flags)), k))
    return Fraction(sum(any(flags[i] for i in s) for s in subsets), len(subsets))


def brute_maj_at_k(votes, right, k):
    """Mean over all k-subsets of: the majority class is right (ties: r/t; no vote in the subset: 0)."""
    total = Fraction(0)
    subsets = list(itertools.combinations(range(len(votes)), k))
    for s in subsets:
        counts = {}
        for i in s:
            if votes[i] is not None:
                counts[votes[i]] = counts.get(votes[i], 0) + 1
        if not counts:
            continue
        top = max(counts.values())
        tied = [c for c, x in counts.items() if x == top]
        total += Fraction(sum(right[c] for c in tied), len(tied))
    return total / len(subsets)


def test_pass_at_k_matches_brute_force_on_random_cases():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 11)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        flags = [True] * c + [False] * (n - c)
        rng.shuffle(flags)
        assert abs(pass_at_k(n, c, k) - float(brute_pass_at_k(flags, k))) <= 1e-12, (n, c, k)


def test_pass_at_k_edge_cases():
    for n in (1, 2, 5, 16):
        for k in range(1, n + 1):
            assert pass_at_k(n, 0, k) == 0.0  # c = 0: never
            assert pass_at_k(n, n, k) == 1.0  # c = n: always
        for c in range(1, n + 1):
            assert pass_at_k(n, c, n) == 1.0  # k = n: any right sample is among them
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-15)  # pass@1 = mean accuracy
    # large n: exact integer arithmetic, no overflow or cancellation
    assert pass_at_k(1000, 1, 1) == pytest.approx(1e-3, rel=1e-12)
    assert pass_at_k(1000, 999, 500) == 1.0
    assert mean_pass_at_k(4, [0, 2, 4], 2) == pytest.approx((0 + 5 / 6 + 1) / 3, abs=1e-15)


@pytest.mark.parametrize(
    ("n", "c", "k", "message"),
    [
        (4, 1, 5, "k=5 > n=4"),
        (4, 1, 0, "k must be a positive integer"),
        (4, 1, -1, "k must be a positive integer"),
        (4, 5, 2, r"c \(right samples\) must be an integer in \[0, n=4\]"),
        (4, -1, 2, r"c \(right samples\)"),
        (0, 0, 1, "n \\(samples per question\\) must be a positive integer"),
        (4, 1, 1.0, "k must be a positive integer"),
        (4, True, 1, r"c \(right samples\)"),
    ],
)
def test_pass_at_k_rejects_bad_arguments(n, c, k, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)


def test_maj_at_k_matches_brute_force_on_random_cases():
    rng = random.Random(1)
    for _ in range(400):
        n = rng.randint(1, 10)
        n_classes = rng.randint(1, 4)
        votes = [None if rng.random() < 0.25 else rng.randrange(n_classes) for _ in range(n)]
        right = {c: rng.random() < 0.4 for c in range(n_classes)}
        k = rng.randint(1, n)
        assert abs(maj_at_k(votes, right, k) - float(brute_maj_at_k(votes, right, k))) <= 1e-12, (votes, right, k)


def test_maj_at_k_hand_built_cases():
    right = {"A": True, "B": False, "C": False}
    # a clear majority
    assert maj_at_k(["A", "A", "B"], right, 3) == 1.0
    assert maj_at_k(["B", "B", "A"], right, 3) == 0.0
    # ties are split evenly (the expected score of a uniform random tie-break), whatever the sample order
    assert maj_at_k(["A", "B"], right, 2) == 0.5
    assert maj_at_k(["B", "A"], right, 2) == 0.5
    assert maj_at_k(["A", "B", "C"], right, 3) == pytest.approx(1 / 3)
    assert maj_at_k(["A", "A", "B", "B", "C"], right, 5) == 0.5
    # no-answer samples cast no vote: the answered minority decides
    assert maj_at_k([None, None, None, "A"], right, 4) == 1.0
    # ... and a subset without any vote scores 0: k=1 is the share of right samples; k=2 from 6 subsets
    assert maj_at_k([None, None, "A"], right, 1) == pytest.approx(1 / 3)
    assert maj_at_k([None, None, "A"], right, 2) == pytest.approx(2 / 3)
    assert maj_at_k([None, None], right, 2) == 0.0
    # maj@1 is the accuracy of single samples
    assert maj_at_k(["A", "B", "B", None], right, 1) == 0.25
    # maj@k for k < n: expected majority accuracy over all k-subsets (A,A,B: 2 of 3 pairs have a majority A...
    # and the pair (A,B) ties: 1/2) -> (1 + 1/2 + 1/2) / 3
    assert maj_at_k(["A", "A", "B"], right, 2) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="k=4 > n=3"):
        maj_at_k(["A", "A", "B"], right, 4)
    with pytest.raises(ValueError, match="no verdict"):
        maj_at_k(["A", "Z"], right, 1)


def test_maj_at_k_is_fast_for_many_samples():
    rng = random.Random(2)
    votes = [None if rng.random() < 0.2 else rng.randrange(12) for _ in range(64)]
    right = {c: c == 3 for c in range(12)}
    value = maj_at_k(votes, right, 32)  # C(64, 32) ~ 1.8e18 subsets: only the dynamic program can do it
    assert 0.0 <= value <= 1.0


# ------------------------------------------------------------------------------------------------ voting
class ExactText:
    """A plugin with only extract_answer: answers are compared as text."""

    def extract_answer(self, completion):
        return completion.split("=")[-1].strip() or None


class Raising:
    def extract_answer(self, completion):
        raise RuntimeError("hostile")


def test_answer_classes_without_same_answer_compare_text_and_survive_a_raising_plugin():
    answers, classes = answer_classes(ExactText(), [["x = 3", "y = 3", "z = 03", "="]])
    assert answers == [["3", "3", "03", None]]
    assert classes == [[0, 0, 1, None]]
    assert answer_classes(Raising(), [["a", "b"]]) == ([[None, None]], [[None, None]])
    assert not supports_voting(lambda completions, **kw: [0.0])
    with pytest.raises(TypeError, match="maj@k is not defined"):
        answer_classes(lambda completions, **kw: [0.0], [["a"]])


@pytest.fixture(scope="module")
def boxed():
    from reward_plugins.boxed_math import boxed_math

    return boxed_math(num_workers=1)


def test_boxed_math_groups_equivalent_answers_written_differently(boxed):
    completions = [
        "</think> \\boxed{\\frac{1}{2}}",
        "</think> so \\boxed{0.5}",
        "</think> \\boxed{1/2}",
        "</think> \\boxed{3}",
        "</think> \\boxed{3}",
        "<think>unclosed \\boxed{1/2}",  # a box inside unclosed reasoning: no answer, as for the reward
        "</think> \\boxed{3 \\text{ (or 4)}}",  # a hedge: not the same answer as 3
        "</think> \\boxed{\\dfrac{1}{2}}",
    ]
    answers, classes = answer_classes(boxed, [completions])
    assert answers[0][5] is None
    assert classes == [[0, 0, 0, 1, 1, None, 2, 0]]
    # by text alone, "3" (2 votes) would beat \frac{1}{2}, 0.5, 1/2, \dfrac{1}{2} (1 vote each): the verifier
    # makes 1/2 the majority with 4 votes
    right = {0: True, 1: False, 2: False}
    assert maj_at_k(classes[0], right, len(completions)) == 1.0
    text_classes = [None if a is None else a for a in answers[0]]
    text_right = {a: a in ("\\frac{1}{2}", "0.5", "1/2", "\\dfrac{1}{2}") for a in answers[0] if a}
    assert maj_at_k(text_classes, text_right, len(completions)) == 0.0


def test_boxed_math_same_answers(boxed):
    pairs = [("\\frac{1}{2}", "0.5"), ("0.5", "\\frac{1}{2}"), ("2", "3"), ("3", "3 \\text{ (or 4)}"),
             ("3 \\text{ (or 4)}", "3"), ("x^2+2x+1", "(x+1)^2"), ("10\\%", "0.1"), ("\\frac12", "\\tfrac{1}{2}")]
    assert boxed.same_answers(pairs) == [True, True, False, False, False, True, True, True]
    assert boxed.same_answer("4", "4.0") is True


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300) | st.builds(lambda a, b: f"{a}</think>\\boxed{{{b}", st.text(max_size=50), st.text(max_size=50)))
def test_boxed_math_extract_answer_never_raises_on_hostile_text(text):
    from reward_plugins.boxed_math import boxed_math

    reward = boxed_math(prestart=False)
    answer = reward.extract_answer(text)
    assert answer is None or isinstance(answer, str)
    assert reward.extract_answer([{"role": "assistant", "content": text}]) == answer
    assert reward.extract_answer(None) is None and reward.extract_answer(12) is None


def test_score_question_votes_with_the_verifier_and_counts_no_answers(boxed):
    from trl_rlvr.evaluation.evaluate import score_question

    texts = ["</think> \\boxed{\\frac{1}{2}}", "</think> \\boxed{0.5}", "</think> \\boxed{1/2}", "</think> \\boxed{3}",
             "</think> \\boxed{3}", "</think> \\boxed{3}", "</think> no box", "</think> \\boxed{3}"]
    samples = [(t, [0] * (i + 1), i != 6) for i, t in enumerate(texts)]
    rec = score_question(samples, {"answer": "\\frac{1}{2}"}, "prompt", boxed, None, [1, 2, 8],
                         success_threshold=1.0, format_threshold=1.0)
    assert rec["right"] == 3 and rec["no_answer"] == 1
    assert rec["answers"][0][1:] == [4, False] and rec["answers"][1][1:] == [3, True]  # [text, votes, right]
    assert rec["maj@k"][8] == 0.0  # 3 \times 4 beats 1/2 \times 3 (7 voters: the unboxed sample is silent)
    assert rec["maj@k"][1] == pytest.approx(3 / 8) and rec["pass@k"][1] == pytest.approx(3 / 8)
    assert rec["pass@k"][8] == 1.0
    samples[7] = ("</think> no box either", [0], True)  # 3 votes each: a tie
    rec = score_question(samples, {"answer": "\\frac{1}{2}"}, "prompt", boxed, None, [8],
                         success_threshold=1.0, format_threshold=1.0)
    assert rec["maj@k"][8] == 0.5
    samples[7] = ("</think> \\boxed{\\tfrac{1}{2}}", [0], True)  # a fourth way of writing 1/2: it wins
    rec = score_question(samples, {"answer": "\\frac{1}{2}"}, "prompt", boxed, None, [8],
                         success_threshold=1.0, format_threshold=1.0)
    assert rec["maj@k"][8] == 1.0
