"""think_format: the think block must hold visible reasoning and the answer visible characters (an allowlist:
a letter or a digit, Unicode general category L*/N*); any other think tag, whole or dangling, is malformed. Each
hostile case has a correct one beside it that still scores 1.0."""

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reward_plugins.think_format import think_format

F = think_format()
OK = "<think>2 + 3 = 5</think> The answer is 5."

INVISIBLE = ["", " ", "\u200b", "\u200c\u200d", "\u2060", "\ufeff", "\u00ad", "\u034f", "\u0301\u0302", "\u3164",
             "\u115f", "\uffa0", "\u2800", "\u202e", "\U000e0041", "\ue000", "\u2028", "\u3000", "\x00\x07"]


@pytest.mark.parametrize("inv", INVISIBLE, ids=[repr(s) for s in INVISIBLE])
def test_invisible_reasoning_or_answer_scores_0(inv):
    assert F(None, [f"<think>{inv}</think> 5", f"<think>r</think>{inv}", OK]) == [0.0, 0.0, 1.0]
    g = think_format(answer_tag="answer")
    assert g(None, [f"<think>r</think><answer>{inv}</answer>", "<think>r</think><answer>5</answer>"]) == [0.0, 1.0]
    p = think_format(prefilled=True)
    assert p(None, [f"{inv}</think> 5", f"r</think>{inv}", "r</think> 5"]) == [0.0, 0.0, 1.0]


@pytest.mark.parametrize("tail", ["<think", "</think", "<think>", "</think>", "< think>", "</ THINK>", "<Think",
                                  "<think/>", "<think\n", "</think x"])
def test_a_dangling_or_second_think_tag_is_malformed(tail):
    assert F(None, [f"{OK} {tail}", f"<think>r {tail}</think> 5", OK]) == [0.0, 0.0, 1.0]
    p = think_format(prefilled=True)
    assert p(None, [f"r</think> 5 {tail}", f"{tail} r</think> 5", "r</think> 5"]) == [0.0, 0.0, 1.0]


def test_dangling_answer_tags_and_longer_tag_names():
    g = think_format(answer_tag="answer")
    assert g(None, ["<think>r</think><answer>5<answer</answer>", "<think>r</think><answer>5</answer"]) == [0.0, 0.0]
    assert g(None, ["<think>r</think><answer>5</answer>"]) == [1.0]
    # a longer tag name is not a think tag; letters and digits of other scripts count
    assert F(None, ["<think>see <thinking> notes</think> 5", "<think>理由</think> 答案", "<think>∑ x</think> ٣",
                    "<think>Ⅻ</think> ½"]) == [1.0] * 4


#: Symbols and punctuation that render blank or nearly so; none is a letter or a digit. U+2800 and U+1D159 are
#: of category So (a blocklist of blank characters missed U+1D159).
BLANK_SYMBOLS = ["\u2800", "\U0001d159", "\u3000\u2800", "\U0001d159\U0001d159", "\u2003\U0001d159", ".", "?", "∑",
                 "\u2062", "\U0001f600", "$$", "{}", "---"]


@pytest.mark.parametrize("blank", BLANK_SYMBOLS, ids=[ascii(s) for s in BLANK_SYMBOLS])
def test_symbols_or_punctuation_alone_are_not_visible(blank):
    assert F(None, [f"<think>{blank}</think> 5", f"<think>r</think> {blank}", OK]) == [0.0, 0.0, 1.0]
    g = think_format(answer_tag="answer")
    assert g(None, [f"<think>r</think><answer>{blank}</answer>", "<think>r</think><answer>5</answer>"]) == [0.0, 1.0]
    # beside a letter or a digit they are fine
    assert F(None, [f"<think>{blank} r</think> {blank} 5"]) == [1.0]


def test_the_ignorable_letters_are_exactly_the_default_ignorable_letters_and_digits():
    """The exceptions to L*/N* are Unicode's Default_Ignorable_Code_Point characters of those categories, for
    every code point of the interpreter's Unicode version (``regex`` reads DerivedCoreProperties.txt)."""
    regex = pytest.importorskip("regex")
    from reward_plugins._text import _IGNORABLE_LETTERS

    ignorable = regex.compile(r"\p{Default_Ignorable_Code_Point}")
    found = {chr(c) for c in range(0x110000)
             if unicodedata.category(chr(c))[0] in "LN" and ignorable.match(chr(c))}
    assert found == set(_IGNORABLE_LETTERS)


_visible = st.characters(categories=["L", "N"], exclude_characters="\u115f\u1160\u3164\uffa0")
#: every character that is not a letter or a digit (angle brackets left out: they would make think tags)
_invisible = st.characters(categories=["Cc", "Cf", "Zs", "Zl", "Zp", "Mn", "Mc", "Me", "Co", "Cn", "P", "S"],
                           exclude_characters="<>")
_blank_letters = st.sampled_from("\u115f\u1160\u3164\uffa0\u2800\U0001d159")
invisible_text = st.text(st.one_of(_invisible, _blank_letters), max_size=20)
visible_text = st.builds(lambda a, v, b: a + v + b, invisible_text, st.text(_visible, min_size=1, max_size=20),
                         invisible_text)


@settings(max_examples=300, deadline=None)
@given(invisible_text, visible_text, visible_text)
def test_invisible_parts_never_score_1(inv, vis, vis2):
    assert F(None, [f"<think>{inv}</think>{vis}", f"<think>{vis}</think>{inv}"]) == [0.0, 0.0]
    assert F(None, [f"<think>{vis}</think>{vis2}"]) == [1.0]  # visible ones in the right frame still do
    g = think_format(answer_tag="answer")
    assert g(None, [f"<think>{vis}</think><answer>{inv}</answer>", f"<think>{vis}</think><answer>{vis2}</answer>"]) \
        == [0.0, 1.0]


_tag = st.builds(lambda lt, sp1, sl, sp2, name, end: lt + sp1 + sl + sp2 + name + end,
                 st.just("<"), st.sampled_from(["", " ", "\t"]), st.sampled_from(["", "/"]), st.sampled_from(["", " "]),
                 st.sampled_from(["think", "THINK", "Think", "tHiNk"]), st.sampled_from(["", ">", " ", "/>", "\n", " x>"]))


@settings(max_examples=300, deadline=None)
@given(visible_text, visible_text, _tag, st.integers(0, 2))
def test_any_extra_think_tag_anywhere_is_malformed(vis, vis2, tag, where):
    parts = [vis, vis2, ""]
    parts[where] = parts[where] + tag
    text = f"<think>{parts[0]}</think>{parts[1]}{parts[2]}"
    assert F(None, [text, f"<think>{vis}</think>{vis2}"]) == [0.0, 1.0]
