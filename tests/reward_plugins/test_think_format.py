"""think_format: the R1-Zero output format (1.0 or 0.0)."""

import pickle

import pytest

from reward_plugins.think_format import think_format


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>2 + 3 = 5</think> \\boxed{5}", 1.0),
        ("  <think>reason</think>\nThe answer is 5.", 1.0),
        ("<think>reason</think>", 0.0),  # empty answer
        ("<think>reason</think>   \n ", 0.0),
        ("<think>reason", 0.0),  # unclosed
        ("<think>a</think> b <think>c</think> d", 0.0),  # a second think block
        ("<think>a <think> b</think> c", 0.0),
        ("<think>a</think> b </think>", 0.0),
        ("answer first <think>a</think> b", 0.0),
        ("no tags at all", 0.0),
        ("", 0.0),
    ],
)
def test_default_format(text, expected):
    assert think_format()(None, [text]) == [expected]


def test_answer_tags_and_custom_names():
    f = think_format(answer_tag="answer")
    assert f(None, ["<think>r</think>\n<answer>5</answer>"]) == [1.0]
    assert f(None, ["<think>r</think> <answer> </answer>"]) == [0.0]
    assert f(None, ["<think>r</think> <answer>5</answer> trailing"]) == [0.0]
    assert f(None, ["<think>r</think> 5"]) == [0.0]
    g = think_format(think_tag="reasoning")
    assert g(None, ["<reasoning>r</reasoning> 5", "<think>r</think> 5"]) == [1.0, 0.0]


def test_prefilled_and_conversational():
    f = think_format(prefilled=True)
    assert f(None, ["r</think> 5", "<think>r</think> 5", "r 5"]) == [1.0, 0.0, 0.0]
    conv = [[{"role": "assistant", "content": "<think>r</think> 5"}], [{"role": "assistant", "content": None}]]
    assert think_format()([[{"role": "user", "content": "q"}]] * 2, conv) == [1.0, 0.0]


def test_pickle_name_and_options():
    f = pickle.loads(pickle.dumps(think_format(answer_tag="answer")))
    assert f.__name__ == "think_format"
    assert f(None, ["<think>r</think><answer>1</answer>"]) == [1.0]
    with pytest.raises(ValueError, match="think_tag"):
        think_format(think_tag="<think>")
