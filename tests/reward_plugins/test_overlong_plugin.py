"""overlong: DAPO's soft overlong penalty as a reward plugin. It is TRL's get_soft_overlong_punishment, named
and validated; its size is the reward weight. Checked here against a reference written from the paper."""

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trl.rewards import get_soft_overlong_punishment

from reward_plugins.overlong import overlong
from trl_rlvr.rewards.registry import load_reward


def dapo_eq13(length: int, l_max: int, l_cache: int) -> float:
    """R_length of Yu et al. (2025), "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", eq. 13."""
    if length <= l_max - l_cache:
        return 0.0
    if length <= l_max:
        return ((l_max - l_cache) - length) / l_cache
    return -1.0


def _ids(*lengths):
    return [[7] * n for n in lengths]


def test_hand_computed_values():
    # L_max = 20, L_cache = 4: free up to 16 tokens, linear to -1 at 20, -1 beyond
    f = overlong(max_completion_length=20, buffer_length=4)
    out = f(prompts=["p"] * 8, completions=["x"] * 8, completion_ids=_ids(0, 16, 17, 18, 19, 20, 21, 100))
    assert out == pytest.approx([0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0])


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 64).flatmap(lambda l_max: st.tuples(st.just(l_max), st.integers(1, l_max))),
    st.lists(st.integers(0, 80), min_size=1, max_size=8),
)
def test_trls_implementation_is_dapo_eq13(budget, lengths):
    """TRL's formula does not differ from the paper's (so there is no reason to keep our own)."""
    l_max, l_cache = budget
    out = overlong(max_completion_length=l_max, buffer_length=l_cache)(completion_ids=_ids(*lengths))
    assert out == pytest.approx([dapo_eq13(n, l_max, l_cache) for n in lengths], abs=1e-12)


def test_is_trls_function_named_overlong_and_picklable():
    f = pickle.loads(pickle.dumps(overlong(max_completion_length=8, buffer_length=4)))
    assert type(f.punishment) is type(get_soft_overlong_punishment(8, 4))  # the one implementation
    assert f.__name__ == "overlong"  # TRL logs rewards/overlong/mean
    assert f(completion_ids=_ids(6)) == [-0.5]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.booleans(), max_size=40), min_size=1, max_size=6))
def test_with_a_tool_mask_only_model_written_tokens_count(masks):
    """Given TRL's tool_mask (1: written by the model, 0: a tool's result), the penalty is that of the
    model-written tokens alone: how long the tool's replies were does not matter."""
    l_max, l_cache = 16, 8
    f = overlong(max_completion_length=l_max, buffer_length=l_cache)
    ids = [list(range(len(m))) for m in masks]
    out = f(completion_ids=ids, tool_mask=[[int(b) for b in m] for m in masks])
    assert out == pytest.approx([dapo_eq13(sum(m), l_max, l_cache) for m in masks], abs=1e-12)


def test_validation_names_the_field():
    with pytest.raises(ValueError, match="overlong: overlong_buffer_length"):
        overlong(max_completion_length=4, buffer_length=8)
    with pytest.raises(ValueError, match="overlong: overlong_buffer_length must be a positive integer"):
        overlong(max_completion_length=4, buffer_length=0)
    with pytest.raises(ValueError, match="overlong: max_completion_length"):
        overlong(max_completion_length=None, buffer_length=4)


def test_penalty_size_is_the_reward_weight_not_an_option():
    with pytest.raises(ValueError, match="'overlong'.*no option 'penalty_factor'"):
        load_reward("overlong", max_completion_length=8, buffer_length=4, penalty_factor=0.5)
