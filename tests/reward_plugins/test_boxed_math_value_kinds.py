"""boxed_math, where the gold is a number that is not an integer: a value form is judged against the gold's own
notation and the question's own value forms (a fraction's terms are integers, a mixed number is proper, an answer
written as the question's operands in another notation than the gold's restates the question), and numbers are
compared exactly (an exact gold takes no approximation unless the problem states a precision, or the option
``relative_tolerance`` is set). Every forged answer has its honest counterpart beside it, which scores 1.0."""

from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal
from fractions import Fraction
from math import gcd

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_plugins.boxed_math import boxed_math
from reward_plugins.boxed_math.question import Question, prompt_text, read_question, stated_precision, value_forms


@pytest.fixture(scope="module")
def reward():
    return boxed_math(timeout=5.0)


def scores(reward, prompts, answers, golds, **kw):
    metrics = {}
    out = reward(prompts, [rf"\boxed{{{a}}}" for a in answers], answer=golds,
                 log_metric=lambda k, v: metrics.__setitem__(k, v), **kw)
    return out, metrics


#: (question, gold, forged answer that math-verify finds equal, the honest answer)
FORGED = [
    ("What is 2.5 / 0.4?", "6.25", r"\frac{2.5}{0.4}", "6.25"),
    ("What is 2.5 / 0.4?", r"\frac{25}{4}", r"\frac{2.5}{0.4}", r"\frac{25}{4}"),
    (r"Compute $3 + \frac{7}{4}$.", r"\frac{19}{4}", r"3\frac{7}{4}", r"4\frac{3}{4}"),
    ("Simplify 84/144.", r"\frac{7}{12}", r"\frac{84}{144}", r"\frac{7}{12}"),
    (r"Simplify $\frac{84}{144}$.", r"\frac{7}{12}", "84/144", "7/12"),
    (r"Convert $\frac{3}{8}$ to a decimal.", "0.375", r"\frac{3}{8}", "0.375"),
    ("Express 0.375 as a common fraction.", r"\frac{3}{8}", "0.375", r"\frac38"),
    ("Express 0.375 as a percent.", r"37.5\%", "0.375", r"37.5\%"),
    (r"Express $37.5\%$ as a common fraction.", r"\frac{3}{8}", r"37.5\%", r"\frac{3}{8}"),
    (r"Write $3.2 \times 10^{-4}$ as a decimal.", "0.00032", r"3.2 \times 10^{-4}", "0.00032"),
    ("Write 0.00032 in scientific notation.", r"3.2 \times 10^{-4}", "0.00032", r"3.2 \times 10^{-4}"),
    ("Write 7/2 as a mixed number.", r"3\frac{1}{2}", r"\frac{7}{2}", r"3\frac{1}{2}"),
    (r"Write $7 \div 2$ as a decimal.", "3.5", r"\frac{7}{2}", "3.5"),
    ("Let x = 3/8. Write x as a decimal.", "x = 0.375", r"x = \frac{3}{8}", "x = 0.375"),
    ("What is 2 + 1/2?", r"\frac{5}{2}", r"2\frac{1}{2}", r"\frac{5}{2}"),
    (r"Express $\frac{1}{2}$ as a decimal.", "0.5", r"\frac{1}{2}", "0.5"),
    ("Express 0.5 as a common fraction.", r"\frac{1}{2}", "0.5", r"\frac{1}{2}"),
]


@pytest.mark.parametrize("question, gold, forged, honest", FORGED, ids=[f"{q} {f}" for q, _, f, _ in FORGED])
def test_a_value_form_that_restates_the_question_scores_0_and_the_answer_1(reward, question, gold, forged, honest):
    out, metrics = scores(reward, [question, question], [forged, honest], [gold, gold])
    assert out == [0.0, 1.0]
    assert metrics["boxed_math/unevaluated"] == 1.0


@pytest.mark.parametrize("question, gold, answer", [
    ("Which is larger, 0.3 or 1/3?", r"\frac{1}{3}", "1/3"),  # the gold's own notation, in lowest terms
    ("What is 1/4 + 1/4?", r"\frac{1}{2}", "0.5"),  # another notation, not the question's operands
    ("What is 0.5 + 0?", "0.5", "0.50"),
    ("What is half of 75%?", r"37.5\%", r"\frac{3}{8}"),
    ("Solve 2x = 1.", r"\frac{1}{2}", r"50\%"),
    (None, r"\frac{1}{2}", r"\dfrac{1}{2}"),  # no question given: only the form rules apply
    ("What is 5/4 + 5/4?", r"\frac{5}{2}", r"2\frac{1}{2}"),
])
def test_equivalent_values_not_written_as_the_questions_operands_still_score_1(reward, question, gold, answer):
    assert scores(reward, [question], [answer], [gold])[0] == [1.0]


@pytest.mark.parametrize("form, gold", [(r"\frac{2.5}{0.4}", "6.25"), (r"\frac{1.5}{3}", "0.5"),
                                        (r"3\frac{7}{4}", "4.75"), (r"1\frac{2}{2}", "2.5"), (r"1\frac{0}{3}", "1.5"),
                                        (r"\frac{2}{4}", r"\frac{1}{2}"), (r"1\frac{2}{4}", "1.5")])
def test_form_rules_hold_without_a_question(reward, form, gold):
    """A fraction's terms are integers in lowest terms and a mixed number is proper, whatever the question."""
    out, metrics = scores(reward, None, [form], [gold])
    assert out == [0.0] and metrics["boxed_math/unevaluated"] == 1.0


# -- exact golds need exact answers --------------------------------------------------------------------------------

#: (gold, an approximation math-verify 0.9.0 accepts with its defaults, the exact answer)
APPROXIMATIONS = [
    (r"\pi", "3.14159265", r"\pi"),
    (r"\sqrt{2}", "1.41421356", r"\sqrt{2}"),
    (r"\frac{1}{3}", "0.3333333", r"\frac{1}{3}"),
    (r"\frac{1}{12}", "0.0833333333333333", r"\frac{1}{12}"),
    ("1.0000001", "1.0000002", "1.0000001"),
    ("0.5", "0.5000001", "0.5"),
    (r"2\pi", "6.283185", r"2\pi"),
    (r"x = \frac{1}{3}", "x = 0.333333", r"x = \frac13"),
    (r"(1, \frac{1}{3})", "(1, 0.3333333)", r"(1, \frac13)"),
]


@pytest.mark.parametrize("gold, approximation, exact", APPROXIMATIONS, ids=[a for _, a, _ in APPROXIMATIONS])
def test_an_exact_gold_takes_no_approximation(reward, gold, approximation, exact):
    assert scores(reward, None, [approximation, exact], [gold, gold])[0] == [0.0, 1.0]


#: math-verify 0.9.0's own false positives (its numeric comparison chops small differences).
MATH_VERIFY_FALSE_POSITIVES = [
    (r"\frac{1}{2^{98}}", r"\frac{1}{2^{99}}"),
    (r"\frac{\pi}{2^{98}}", r"\frac{\pi}{2^{99}}"),
    (r"\frac{1}{2006!}", r"\frac{1}{2004!}"),
    (r"1 - \frac{1}{\mathrm{e}}", r"1 + \frac{1}{\mathrm{e}}"),
    ("1:2:4", "2:4:8"),  # a ratio sequence
    ("x + y = 2", "2x + 2y = 0"),  # two equations that parse to 0
    ("x - y = 0", "2x - 2y = 1"),
]


@pytest.mark.parametrize("gold, wrong", MATH_VERIFY_FALSE_POSITIVES, ids=[w for _, w in MATH_VERIFY_FALSE_POSITIVES])
def test_math_verify_false_positives_score_0(reward, gold, wrong):
    assert scores(reward, None, [wrong, gold], [gold, gold])[0] == [0.0, 1.0]


@pytest.mark.parametrize("question, gold, rounded, wrong", [
    ("Round pi to the nearest hundredth.", r"\pi", "3.14", "3.1416"),
    ("Find 70/9 to the nearest hundredth.", r"\frac{70}{9}", "7.78", "7.77"),
    ("Find 70/9 to the nearest hundredth.", "7.78", "7.78", "7.7778"),
    ("Give sqrt(2) to 3 decimal places.", r"\sqrt{2}", "1.414", "1.4142"),
    ("Give sqrt(2) to three significant figures.", r"\sqrt{2}", "1.41", "1.414"),
    ("Anna pays 70/9 dollars. To the nearest cent, how much is that?", r"\frac{70}{9}", "7.78", "7.8"),
    ("What is 1234 rounded to the nearest hundred?", "1234", "1200", "1230"),
    ("What percent is 1/3? Give it to the nearest tenth of a percent.", r"\frac{1}{3}", r"33.3\%", r"33.33\%"),
])
def test_a_stated_precision_takes_the_gold_rounded_to_it(reward, question, gold, rounded, wrong):
    assert scores(reward, [question] * 2, [rounded, wrong], [gold, gold])[0] == [1.0, 0.0]


def test_relative_tolerance_is_an_option_and_validated(reward):
    loose = boxed_math(timeout=5.0, relative_tolerance=1e-6, prestart=False)
    assert scores(loose, None, ["3.1415927", "3.1416", r"\sqrt{2}"], [r"\pi", r"\pi", "1.41421356"])[0] == \
        [1.0, 0.0, 1.0]
    assert scores(reward, None, ["3.1415927"], [r"\pi"])[0] == [0.0]
    for bad in (0, 1, -1e-3, True, "1e-3", float("nan")):
        with pytest.raises(ValueError, match="relative_tolerance"):
            boxed_math(relative_tolerance=bad, prestart=False)


# -- the question, read on its text --------------------------------------------------------------------------------

def test_value_forms_of_a_question():
    F = Fraction
    assert value_forms(r"Convert $\frac{3}{8}$ to a decimal.") == {("fraction", F(3), F(8))}
    assert value_forms("Simplify 84/144.") == {("fraction", F(84), F(144))}
    assert ("mixed", F(3), F(7), F(4)) in value_forms(r"Compute $3 + \frac{7}{4}$.")
    assert ("scientific", F(16, 5), F(-4)) in value_forms(r"Write $3.2 \times 10^{-4}$ as a decimal.")
    assert value_forms("Express 0.375 as a percent.") == {("decimal", F(3, 8))}
    assert ("percent", F(75, 2)) in value_forms(r"What is $37.5\%$ of 8?")
    assert value_forms("A train travels 60 miles in 2 hours.") == frozenset()
    assert ("mixed", F(1), F(3), F(2)) not in value_forms("13/2")  # a fraction, not 1 3/2


@pytest.mark.parametrize("text, precision", [
    ("to the nearest tenth", ("decimals", 1)), ("Round to the nearest whole number.", ("decimals", 0)),
    ("to 2 decimal places", ("decimals", 2)), ("correct to three decimal places", ("decimals", 3)),
    ("to 3 significant figures", ("significant", 3)), ("to the nearest cent", ("decimals", 2)),
    ("to the nearest hundred", ("decimals", -2)), ("nearest ten-thousandth", ("decimals", 4)),
    ("Express your answer as a common fraction.", None),
    ("to the nearest tenth, then to the nearest hundredth", None),  # two precisions: neither is taken
])
def test_stated_precision(text, precision):
    assert stated_precision(text) == precision


def test_the_question_is_the_user_turns_of_a_conversation():
    prompt = [{"role": "system", "content": "Write 1/2 as 0.5 in examples."},
              {"role": "user", "content": "Convert 3/8 to a decimal."}]
    assert prompt_text(prompt) == "Convert 3/8 to a decimal."
    assert read_question(prompt).forms == {("fraction", Fraction(3), Fraction(8))}
    assert read_question(None) == Question() and read_question([{"role": "user", "content": None}]) == Question()


def test_a_conversational_prompt_is_read(reward):
    prompt = [{"role": "user", "content": r"Convert $\frac{3}{8}$ to a decimal."}]
    assert scores(reward, [prompt, prompt], [r"\frac{3}{8}", "0.375"], ["0.375", "0.375"])[0] == [0.0, 1.0]


def test_prompts_and_completions_must_match_in_number(reward):
    with pytest.raises(ValueError, match="2 prompts for 1 completions"):
        reward(["a", "b"], [r"\boxed{1}"], answer=["1"])


# -- properties over random fraction / decimal / percent golds and questions ---------------------------------------

def _decimal(f: Fraction) -> str:
    """The terminating decimal of ``f`` (its denominator divides a power of 10)."""
    d = Decimal(f.numerator) / Decimal(f.denominator)
    return format(d.normalize(), "f")


@st.composite
def fraction_question(draw):
    """A question on an unreduced a/b, its reduced p/q (q > 1) and the factor k >= 2 between them."""
    q = draw(st.integers(2, 40))
    p = draw(st.integers(1, 200).filter(lambda n: Fraction(n, q).denominator == q))
    k = draw(st.integers(2, 12))
    return p * k, q * k, p, q


_SIMPLIFY = ["Simplify {a}/{b}.", r"Simplify $\frac{{{a}}}{{{b}}}$.", "What is {a} / {b} in lowest terms?",
             r"Reduce $\dfrac{{{a}}}{{{b}}}$ to lowest terms."]


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(fraction_question(), st.sampled_from(_SIMPLIFY), st.sampled_from([r"\frac{{{a}}}{{{b}}}",
                                                                                               "{a}/{b}"])),
                min_size=1, max_size=5))
def test_property_the_unreduced_operands_never_score_the_reduced_fraction_does(reward, cases):
    prompts, answers, golds = [], [], []
    for (a, b, p, q), template, form in cases:
        question, gold = template.format(a=a, b=b), rf"\frac{{{p}}}{{{q}}}"
        prompts += [question, question]
        answers += [form.format(a=a, b=b), rf"\frac{{{p}}}{{{q}}}"]
        golds += [gold, gold]
    out, _ = scores(reward, prompts, answers, golds)
    assert out == [0.0, 1.0] * len(cases), list(zip(prompts, answers, out))


@st.composite
def decimal_question(draw):
    """A fraction with a terminating decimal, and how the question writes it."""
    q = 2 ** draw(st.integers(0, 4)) * 5 ** draw(st.integers(0, 3))
    q = q if q > 1 else 4
    p = draw(st.integers(1, 500).filter(lambda n: Fraction(n, q).denominator > 1))
    f = Fraction(p, q)
    return f, draw(st.sampled_from([r"\frac{{{n}}}{{{d}}}", "{n}/{d}", r"\dfrac{{{n}}}{{{d}}}"])).format(
        n=f.numerator, d=f.denominator)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(decimal_question(), min_size=1, max_size=5))
def test_property_a_decimal_asked_for_takes_the_decimal_not_the_questions_fraction(reward, cases):
    prompts, answers, golds = [], [], []
    for f, written in cases:
        question, gold = f"Express ${written}$ as a decimal.", _decimal(f)
        prompts += [question] * 3
        answers += [rf"\frac{{{f.numerator}}}{{{f.denominator}}}", gold, gold + "0"]
        golds += [gold] * 3
    out, _ = scores(reward, prompts, answers, golds)
    assert out == [0.0, 1.0, 1.0] * len(cases), list(zip(prompts, answers, out))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(decimal_question(), min_size=1, max_size=5))
def test_property_a_percent_asked_for_takes_the_percent_not_the_questions_number(reward, cases):
    prompts, answers, golds = [], [], []
    for f, written in cases:
        decimal, percent = _decimal(f), _decimal(f * 100)
        gold = rf"{percent}\%"
        # the question's fraction, and its decimal, restate it; the percent answers it
        prompts += [f"Express ${written}$ as a percent."] * 2 + [f"Express {decimal} as a percent."] * 2
        answers += [rf"\frac{{{f.numerator}}}{{{f.denominator}}}", gold, decimal, gold]
        golds += [gold] * 4
    out, _ = scores(reward, prompts, answers, golds)
    assert out == [0.0, 1.0, 0.0, 1.0] * len(cases), list(zip(prompts, answers, out))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(1, 99), st.sampled_from([3, 7, 9, 11, 13]), st.integers(1, 9)),
                min_size=1, max_size=4))
def test_property_a_non_terminating_gold_takes_a_decimal_only_at_the_stated_precision(reward, cases):
    prompts, answers, golds, expected = [], [], [], []
    for p, q, n in cases:
        f = Fraction(p, q)
        if f.denominator == 1:
            f += Fraction(1, q)
        exact = Decimal(f.numerator) / Decimal(f.denominator)
        step = Decimal(1).scaleb(-n)
        rounded = exact.quantize(step, rounding=ROUND_HALF_UP)
        truncated = exact.quantize(step, rounding=ROUND_DOWN)
        gold = rf"\frac{{{f.numerator}}}{{{f.denominator}}}"
        asked = f"Compute {f.numerator} divided by {f.denominator}, to {n} decimal places."
        # no precision asked: neither the rounding nor the truncation; asked: the rounding, not one step off
        prompts += ["Compute the quotient.", "Compute the quotient.", asked, asked]
        answers += [str(rounded), str(truncated), str(rounded), str(rounded + step)]
        golds += [gold] * 4
        expected += [0.0, 0.0, 1.0, 0.0]
    out, _ = scores(reward, prompts, answers, golds)
    assert out == expected, list(zip(prompts, answers, out))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(1, 20), st.integers(1, 30), st.integers(2, 30)), min_size=1, max_size=5))
def test_property_a_mixed_number_must_be_proper(reward, cases):
    answers, golds, expected = [], [], []
    for w, n, d in cases:
        value = w + Fraction(n, d)
        if value.denominator == 1:
            continue
        whole, rest = divmod(value.numerator, value.denominator)
        gold = rf"\frac{{{value.numerator}}}{{{value.denominator}}}"
        answers += [rf"{w}\frac{{{n}}}{{{d}}}", rf"{whole}\frac{{{rest}}}{{{value.denominator}}}"]
        golds += [gold, gold]
        expected += [1.0 if 0 < n < d and gcd(n, d) == 1 else 0.0, 1.0]  # proper, its fraction in lowest terms
    if answers:
        assert scores(reward, None, answers, golds)[0] == expected
