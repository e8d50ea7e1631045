"""overlong: DAPO's soft overlong penalty as a reward plugin, the same formula as trl_rlvr.shaping."""

import pickle

import pytest

from reward_plugins.overlong import overlong
from trl_rlvr.shaping import overlong_penalties


def test_uses_completion_ids_and_shaping_formula():
    f = overlong(max_completion_length=20, buffer_length=10, penalty_factor=0.5)
    ids = [[1] * n for n in (5, 10, 15, 20, 25)]
    out = f(prompts=["p"] * 5, completions=["x"] * 5, completion_ids=ids)
    assert out == overlong_penalties([5, 10, 15, 20, 25], 20, 10, 0.5)
    assert out == [0.0, 0.0, -0.25, -0.5, -0.5]


def test_is_the_single_implementation(monkeypatch):
    import reward_plugins.overlong as mod

    calls = []
    monkeypatch.setattr(mod, "overlong_penalties", lambda *a: calls.append(a) or [0.0])
    mod.overlong(max_completion_length=4, buffer_length=2)(None, ["x"], completion_ids=[[1, 2, 3]])
    assert calls == [([3], 4, 2, 1.0)]


def test_without_completion_ids_uses_text_length():
    f = overlong(max_completion_length=4, buffer_length=2)
    assert f(None, ["ab", "abc", [{"role": "assistant", "content": "abcdef"}]]) == [0.0, -0.5, -1.0]


def test_validation_pickle_and_name():
    with pytest.raises(ValueError, match="overlong_buffer_length"):
        overlong(max_completion_length=4, buffer_length=8)
    f = pickle.loads(pickle.dumps(overlong(max_completion_length=8, buffer_length=4)))
    assert f.__name__ == "overlong"
    assert f(None, ["x"], completion_ids=[[0] * 6]) == [-0.5]
