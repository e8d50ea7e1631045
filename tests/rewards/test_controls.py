"""The random-reward control (trl_rlvr.rewards.controls): one permutation per batch, shared by every reward."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.rewards.controls import ShuffledReward, batch_permutation, shuffled_rewards


def correct(prompts, completions, answer, **kwargs):
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer, strict=True)]


def length(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


correct.required_columns = ("answer",)
correct.verifies_correctness = True


texts = st.lists(st.text(max_size=12), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(completions=texts, seed=st.integers(0, 2**32))
def test_the_scores_are_a_permutation_of_the_rewards_and_the_same_for_every_reward(completions, seed):
    prompts = [f"p{i // 4}" for i in range(len(completions))]
    answer = completions[::-1]
    wrapped_correct, wrapped_length = shuffled_rewards([correct, length], seed)
    plain_c, plain_l = correct(prompts, completions, answer), length(prompts, completions)
    got_c = wrapped_correct(prompts, completions, answer=answer)
    got_l = wrapped_length(prompts, completions, answer=answer)
    assert sorted(got_c) == sorted(plain_c) and sorted(got_l) == sorted(plain_l)  # the same values
    order = batch_permutation(prompts, completions, seed)
    assert sorted(order) == list(range(len(completions)))
    # an answer's whole reward vector moves together: score i of every reward is answer order[i]'s
    assert list(zip(got_c, got_l, strict=True)) == [(plain_c[j], plain_l[j]) for j in order]
    assert got_c == wrapped_correct(prompts, completions, answer=answer)  # reproducible, no state between calls


def test_the_link_between_answer_and_reward_is_broken():
    """Over many batches, an answer's shuffled reward is its own no more often than chance (1/n)."""
    n, batches, own = 16, 400, 0
    for b in range(batches):
        completions = [f"batch {b} answer {i}" for i in range(n)]
        order = batch_permutation(["q"] * n, completions, seed=0)
        own += sum(order[i] == i for i in range(n))
    assert own / (n * batches) == pytest.approx(1 / n, abs=0.03)  # 0.0625 expected
    assert batch_permutation(["q"] * n, completions, 0) != batch_permutation(["q"] * n, completions, 1)


def test_it_is_a_trl_reward_function_with_the_wrapped_ones_attributes():
    from trl_rlvr.rewards import check_reward_function
    from trl_rlvr.rewards.registry import load_reward

    wrapped = ShuffledReward(correct, seed=3)
    assert wrapped.__name__ == "correct" and wrapped.required_columns == ("answer",) and wrapped.verifies_correctness
    check_reward_function(wrapped, "shuffled correct")
    boxed = ShuffledReward(load_reward("boxed_math"))
    assert boxed.__name__ == "boxed_math" and boxed.verifies_correctness
    scores = boxed(["q", "q"], ["\\boxed{4}", "\\boxed{5}"], solution=["4", "4"])
    assert sorted(scores) == [0.0, 1.0]
    assert pickle.loads(pickle.dumps(ShuffledReward(length, 1)))(["q"], ["ab"]) == [2.0]


def test_a_reward_that_returns_the_wrong_number_of_scores_is_named():
    with pytest.raises(ValueError, match="'short'"):
        def short(prompts, completions, **kwargs):
            return [1.0]

        ShuffledReward(short)(["q", "q"], ["a", "b"])
