"""boxed_math: where the gold is a value, an answer that restates the question (an operation or function of
values, which math-verify finds equal) scores 0 and is counted as ``boxed_math/unevaluated``; the rule is read
on the parser's syntax tree, so brackets, braces and function forms do not get round it. Every hostile answer
has the plain value beside it, which still scores 1.0."""

from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_plugins.boxed_math import boxed_math


@pytest.fixture(scope="module")
def reward():
    return boxed_math(timeout=5.0)


def scores(reward, answers, golds):
    metrics = {}
    out = reward(None, [rf"\boxed{{{a}}}" for a in answers], answer=golds,
                 log_metric=lambda k, v: metrics.__setitem__(k, v))
    return out, metrics


#: (gold, restated answer that math-verify finds equal, the plain answer)
RESTATED = [
    ("3811122", r"60494 \times (63)", "3811122"),
    ("3811122", r"(60494) \times 63", "3,811,122"),
    ("1024", r"(2)^{10}", "1024"),
    ("1024", r"{2}^{10}", "1024"),
    ("3811122", r"{60494}\cdot{63}", "3811122"),
    ("42", r"\gcd(84,126)", "42"),
    ("252", r"\operatorname{lcm}(84,126)", "252"),
    ("5050", r"\sum_{i=1}^{100} i", "5050"),
    ("10", r"\log_2(1024)", "10"),
    ("10", r"\log_{2}{1024}", "10"),
    ("12", r"\sqrt{144}", "12"),
    ("24", r"4!", "24"),
    ("10", r"\binom{5}{2}", "10"),
    ("4", r"\max(3, 4)", "4"),
    ("(3, 4)", r"(1+2, 2+2)", "(3, 4)"),
    ("(3, 4)", r"(3, (2)\cdot 2)", "(3,4)"),
    (r"\{1, 2\}", r"\{1, 1+1\}", r"\{2, 1\}"),
    ("x = 3", "x = 1+2", "x = 3"),
    ("x = 3", r"x = \frac{6}{2}", "3"),
    (r"\frac{1}{2}", r"\frac{1}{4} + \frac{1}{4}", r"\frac{1}{2}"),
    (r"\frac{1}{2}", r"(0.5)^{1}", "0.5"),
    ("0.25", r"\left(\frac{1}{2}\right)^2", r"\frac14"),
    ("-3", r"-(1+2)", "-3"),
    ("y < 2", "y < 1 + 1", r"(-\infty, 2)"),
    (r"\begin{pmatrix}1 & 2\\ 3 & 4\end{pmatrix}", r"\begin{pmatrix}1 & 1+1\\ 3 & 4\end{pmatrix}",
     r"\begin{pmatrix}1 & 2\\ 3 & 4\end{pmatrix}"),
]


@pytest.mark.parametrize("gold, restated, plain", RESTATED, ids=[r[1] for r in RESTATED])
def test_a_restated_question_scores_0_and_the_value_1(reward, gold, restated, plain):
    out, metrics = scores(reward, [restated, plain], [gold, gold])
    assert out == [0.0, 1.0]
    # counted: unevaluated, or unparsed where the form rules refuse it first (\operatorname{lcm}: a text font)
    assert metrics["boxed_math/unevaluated"] + metrics["boxed_math/unparsed"] == 1.0


#: What still counts as an answer where the gold is a value (docs/rewards.md, "restated").
STILL_ANSWERS = [
    ("0.5", r"\frac{1}{2}"), ("0.5", r"\frac12"), ("0.5", "1/2"), (r"\frac{1}{2}", "0.5"), ("-3", "-3"),
    ("-3", "- 3"), ("1000", "1{,}000"), ("1000", r"1\,000"), ("1000", "1,000"), ("10\\%", "10\\%"), ("0.1", "10\\%"),
    ("30", r"30^\circ"), ("3", "(3)"), ("3", "{3}"), ("(3, 4)", "(3, 4)"), ("x = 3", "x = 3"), ("x = 3", "3"),
    ("x=3, y=4", "x = 3, y = 4"), ("0.00032", r"3.2 \times 10^{-4}"), ("2.5", r"2\frac{1}{2}"),
    ("y < 2", r"(-\infty, 2)"), ("42", "42.0"), (r"\frac{-1}{2}", r"-\frac{1}{2}"), ("5", r"5\text{ cm}"),
]


@pytest.mark.parametrize("gold, answer", STILL_ANSWERS, ids=[a for _, a in STILL_ANSWERS])
def test_values_in_other_notations_still_score_1(reward, gold, answer):
    assert scores(reward, [answer], [gold])[0] == [1.0]


def test_an_integer_gold_needs_an_integer_not_a_fraction(reward):
    assert scores(reward, [r"\frac{84}{2}", "42"], ["42", "42"])[0] == [0.0, 1.0]


@pytest.mark.parametrize("gold, answer", [(r"\sqrt{2}", r"\frac{2}{\sqrt{2}}"), ("x^2+2x+1", "(x+1)^2"),
                                          (r"2\pi", r"\pi + \pi"), (r"\frac{\sqrt{3}}{2}", r"\sin(\pi/3)")])
def test_where_the_gold_is_not_a_value_an_equal_expression_is_an_answer(reward, gold, answer):
    """The rule's reach: an expression is what such a gold asks for; math-verify's equivalence decides."""
    assert scores(reward, [answer], [gold])[0] == [1.0]


# -- property: any value-gold wrapped in a random operation of values scores 0 -----------------------------------

def _bracket(draw, text: str) -> str:
    return draw(st.sampled_from(["{t}", "({t})", "{{{t}}}", r"\left({t}\right)", "{{({t})}}"])).format(t=text)


@st.composite
def restated_integer(draw):
    """(gold, an expression of values equal to it, each operand bracketed at random)."""
    g = draw(st.integers(2, 10**6))
    b = lambda t: _bracket(draw, str(t))  # noqa: E731
    kind = draw(st.sampled_from(["sum", "difference", "product", "power", "quotient", "gcd", "max", "abs", "sqrt",
                                 "neg"]))
    a = draw(st.integers(1, g - 1))
    k = draw(st.integers(2, 9))
    op = draw(st.sampled_from([r"\times", r"\cdot", "*"]))
    expression = {
        "sum": f"{b(a)} + {b(g - a)}",
        "difference": f"{b(g + a)} - {b(a)}",
        "product": f"{b(g)} {op} {b(1)}",
        "power": f"{b(g)}^{{{1}}}",
        "quotient": rf"\frac{{{b(g * k)}}}{{{b(k)}}}",
        "gcd": rf"\gcd({b(g)}, {b(g * k)})",
        "max": rf"\max({b(a)}, {b(g)})",
        "abs": rf"\left|{b(-g)}\right|",
        "sqrt": rf"\sqrt{{{b(g * g)}}}",
        "neg": f"-{b(-g)}",
    }[kind]
    return str(g), expression, str(g)


@st.composite
def restated_fraction(draw):
    p, q = draw(st.integers(1, 50)), draw(st.integers(2, 50))
    f = Fraction(p, q)
    if f.denominator == 1:
        f += Fraction(1, 7)
    gold = rf"\frac{{{f.numerator}}}{{{f.denominator}}}"
    half = f / 2
    expression = draw(st.sampled_from([
        rf"\frac{{{half.numerator}}}{{{half.denominator}}} + \frac{{{half.numerator}}}{{{half.denominator}}}",
        rf"2 \cdot \frac{{{half.numerator}}}{{{half.denominator}}}",
        rf"\frac{{{f.numerator}}}{{{f.denominator}}} \cdot 1",
        rf"\left(\frac{{{f.numerator}}}{{{f.denominator}}}\right)^{{1}}",
    ]))
    return gold, expression, gold


@st.composite
def restated_tuple(draw):
    x, y = draw(st.integers(1, 999)), draw(st.integers(1, 999))
    a = draw(st.integers(0, x))
    which = draw(st.integers(0, 1))
    parts = [str(x), str(y)]
    parts[which] = f"{_bracket(draw, str(a))} + {_bracket(draw, str(x - a))}" if which == 0 else \
        f"{_bracket(draw, str(y))} \\cdot 1"
    open_, close = draw(st.sampled_from([("(", ")"), (r"\{", r"\}")]))
    return f"{open_}{x}, {y}{close}", f"{open_}{parts[0]}, {parts[1]}{close}", f"{open_}{x}, {y}{close}"


@st.composite
def restated_relation(draw):
    v = draw(st.integers(1, 10**4))
    a = draw(st.integers(0, v))
    name = draw(st.sampled_from(["x", "y", "n", "a_1"]))
    return f"{name} = {v}", f"{name} = {_bracket(draw, str(a))} + {_bracket(draw, str(v - a))}", f"{name} = {v}"


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(restated_integer(), restated_fraction(), restated_tuple(), restated_relation()),
                min_size=1, max_size=6))
def test_property_a_value_gold_as_an_operation_of_values_scores_0(reward, cases):
    golds = [g for g, _, _ in cases] * 2
    answers = [e for _, e, _ in cases] + [p for _, _, p in cases]
    out, metrics = scores(reward, answers, golds)
    n = len(cases)
    assert out[:n] == [0.0] * n, [e for (_, e, _), r in zip(cases, out) if r]
    assert out[n:] == [1.0] * n
    assert metrics["boxed_math/unevaluated"] + metrics["boxed_math/unparsed"] == n  # the parser refuses \gcd(2, {4})


def test_states_values_is_default_deny_on_what_the_grammar_does_not_read():
    from reward_plugins.boxed_math.value_form import states_values

    assert states_values("3", "integer") and states_values(r"\frac{1}{2}", "number")
    assert not states_values(r"0.\overline{3}", "number")  # not parsed: not read as a value
    assert not states_values(r"\frac{1}{2}", "integer")
    assert not states_values("", "number")
