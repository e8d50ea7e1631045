"""boxed_math: an answer is a value in **final form**, decided on the answer, not on how the question is spelled.

Where the gold is a value, a fraction must be in lowest terms, a mixed number proper and reduced, scientific
notation kept for magnitudes below 10^-2 or of at least 10^3, and no component may be an operation on numbers
(``\\frac{168}{288}``, ``\\frac{250}{40}``, ``3.75 \\times 10^{-1}``, ``1.234567 \\times 2``), unless the gold itself
is written that way; a final form that re-spells a value the question writes (``37.5\\%`` or ``0.375`` for "Write
0.375 as a common fraction") restates it. Every forged answer has its honest counterpart beside it, scoring 1.0."""

import time
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_plugins.boxed_math import boxed_math
from reward_plugins.boxed_math.value_form import MIN_SCIENTIFIC_EXPONENT, forms_of, is_final, states_values


@pytest.fixture(scope="module")
def reward():
    return boxed_math(timeout=5.0)


def scores(reward, prompts, answers, golds):
    metrics = {}
    out = reward(prompts, [rf"\boxed{{{a}}}" for a in answers], answer=golds,
                 log_metric=lambda k, v: metrics.__setitem__(k, v))
    return out, metrics


#: The attacks of the report that scored 1.0 (question, gold, forged answer, honest answer).
ATTACKS = [
    (r"Simplify $\frac{84}{144}$.", r"\frac{7}{12}", r"\frac{168}{288}", r"\frac{7}{12}"),
    ("Simplify 84/144.", r"\frac{7}{12}", "168/288", "7/12"),
    ("Simplify the ratio 84:144.", r"\frac{7}{12}", r"\dfrac{168}{288}", r"\dfrac{7}{12}"),  # not read as a form
    ("Express 0.375 as a common fraction.", r"\frac{3}{8}", r"\frac{375}{1000}", r"\frac{3}{8}"),
    ("Express 0.375 as a common fraction.", r"\frac{3}{8}", r"3.75 \times 10^{-1}", "3/8"),
    ("Express 0.375 as a common fraction.", r"\frac{3}{8}", r"37.5\%", r"\frac38"),
    (r"Express $37.5\%$ as a common fraction.", r"\frac{3}{8}", "0.375", r"\frac{3}{8}"),
    ("What is 2.5 / 0.4?", "6.25", r"\frac{250}{40}", "6.25"),
    ("What is 2.5 / 0.4?", r"\frac{25}{4}", r"\frac{250}{40}", r"6\frac{1}{4}"),
    ("What is 1.234567 times 2?", "2.469134", r"1.234567 \times 2", "2.469134"),
    ("What is 1.234567 times 2?", "2.469134", r"1.234567 \cdot \sqrt{4}", "2.469134"),
    ("What is 1.234567 times 2?", "2.469134", r"\frac{2469134}{1000000}", r"\frac{1234567}{500000}"),
    ("What is 1.234567 times 2?", "2.469134", r"\frac{1234567}{1000000} \cdot \sqrt{4}", "2.469134"),
    ("What is 1.234567 times 2?", "2.469134", r"1.234567 \times 2 + 10^{-8}\pi", "2.469134"),  # rounds to it
    ("What is 1.234567 times 2?", "2.469134", r"2.469134 \cos(10^{-9})", "2.469134"),
    ("What is ln(1.5)?", "0.4054651", r"\ln 1.5", r"\ln\frac{3}{2}"),
    ("What is 1 divided by 3, to 7 digits?", "0.3333333", r"1 \div 3", "0.3333333"),
    ("What is 1/4 + 1/4?", r"\frac{1}{2}", r"\frac{2}{4}", r"\frac{1}{2}"),
    (None, r"\frac{1}{2}", r"-\frac{-1}{2}", r"\frac{1}{2}"),  # two signs: an operation on -1/2
    (None, r"\frac{3}{8}", r"0\frac{3}{8}", r"\frac{3}{8}"),
    (None, r"(\frac{1}{2}, 3)", r"(\frac{3}{6}, 3)", r"(\frac{1}{2}, 3)"),
    (None, r"x = \frac{3}{4}", r"x = \frac{6}{8}", r"x = \frac{3}{4}"),
    (None, "7.5", r"\frac{15}{2} \cdot 1", r"7\frac{1}{2}"),
]


@pytest.mark.parametrize("question, gold, forged, honest", ATTACKS, ids=[f"{g} {f}" for _, g, f, _ in ATTACKS])
def test_the_reported_attacks_score_0_and_the_answer_1(reward, question, gold, forged, honest):
    out, metrics = scores(reward, [question, question], [forged, honest], [gold, gold])
    assert out == [0.0, 1.0]
    assert metrics["boxed_math/unevaluated"] == 1.0


#: Right answers in a normal final form (question, gold, answer).
FINAL_FORMS = [
    (r"Simplify $\frac{84}{144}$.", r"\frac{7}{12}", r"\dfrac{7}{12}"),
    (None, r"\frac{3}{8}", "0.375"),  # no common fraction asked for: the decimal is a value
    ("What is 3/4 of 1/2?", r"\frac{3}{8}", "0.375"),
    ("What is 2.5/4?", "0.625", r"\frac{5}{8}"),  # the question's 2.5/4 is an operation, not a value it states
    ("Compute $3 + \\frac{7}{4}$.", r"\frac{19}{4}", r"4\frac{3}{4}"),
    (None, r"\frac{6}{8}", "6/8"),  # the gold's own (unreduced) spelling
    (None, r"\frac{6}{8}", r"\frac{3}{4}"),
    (None, r"3.75 \times 10^{-1}", r"3.75 \times 10^{-1}"),  # the gold is in scientific notation
    (None, r"3.75 \times 10^{-1}", r"3.75 \cdot 10^{-1}"),
    (None, "0.00032", r"3.2 \times 10^{-4}"),
    (None, "1234.5", r"1.2345 \times 10^{3}"),
    (None, r"-\frac{7}{12}", r"\frac{-7}{12}"),
    (None, r"\frac{19}{4}", r"4\frac{3}{4}"),
    (None, r"37.5\%", r"\frac{3}{8}"),
    ("Find sqrt(17) to 15 digits.", "4.123105625617661", r"\sqrt{17}"),  # a closed form of a rounded gold
    (None, "3.141593", r"\pi"),
    (None, "0.7071068", r"\frac{\sqrt{2}}{2}"),
    (None, "2.469134", "2.4691340"),
    (None, r"\sqrt{2}", r"\frac{2}{\sqrt{2}}"),  # not a value: any equal expression
]


@pytest.mark.parametrize("question, gold, answer", FINAL_FORMS, ids=[f"{g} {a}" for _, g, a in FINAL_FORMS])
def test_right_answers_in_final_form_score_1(reward, question, gold, answer):
    assert scores(reward, [question], [answer], [gold])[0] == [1.0]


def test_is_final_on_forms():
    F = Fraction
    assert is_final(("fraction", F(7), F(12))) and is_final(("fraction", F(-7), F(12)))
    assert not is_final(("fraction", F(14), F(24))) and not is_final(("fraction", F(7), F(1)))
    assert not is_final(("fraction", F(0), F(5)))
    assert is_final(("fraction", F(6), F(8)), frozenset({("fraction", F(6), F(8))}))
    assert is_final(("mixed", F(2), F(1), F(2))) and not is_final(("mixed", F(2), F(2), F(4)))
    assert not is_final(("mixed", F(2), F(5), F(4)))
    assert is_final(("scientific", F(16, 5), F(-4))) and is_final(("scientific", F(12345, 10000), F(3)))
    assert not is_final(("scientific", F(15, 4), F(-1)))
    assert is_final(("scientific", F(15, 4), F(-1)), frozenset({("scientific", F(2), F(5))}))
    assert MIN_SCIENTIFIC_EXPONENT == 3


F3, F8 = Fraction(3), Fraction(8)


@pytest.mark.parametrize("answer", [r"10^{10^{10}}", r"1.5 \times 10^{99999999999}", r"1.5 \times 10^{-99999999999}",
                                    r"\frac{1}{10^{10^{10}}}", "9" * 1900 + "/" + "3" * 90, r"5\frac{1}{" + "7" * 1900 + "}"])
def test_hostile_sizes_are_read_in_bounded_time(answer):
    """The form rule computes no power of a hostile exponent and no gcd beyond the box's own digits."""
    t = time.perf_counter()
    for kind in ("integer", "number"):
        states_values(answer, kind, frozenset(), frozenset({("decimal", Fraction(3, 8)), ("fraction", F3, F8)}))
    assert time.perf_counter() - t < 2.0


def test_hostile_sizes_score_0(reward):
    out, _ = scores(reward, [None] * 3, [r"10^{10^{10}}", r"1.5 \times 10^{99999999999}", r"2^{2^{40}}"],
                    ["2.469134", r"\frac{3}{8}", "0.375"])
    assert out == [0.0, 0.0, 0.0]


# -- properties over random fraction / decimal / percent golds ---------------------------------------------------

def _decimal(f: Fraction) -> str:
    return format((Decimal(f.numerator) / Decimal(f.denominator)).normalize(), "f")


def _scientific(f: Fraction) -> tuple[str, int]:
    """``m \\times 10^{k}`` of a terminating ``f`` with ``1 <= m < 10``, and ``k``."""
    d = (Decimal(f.numerator) / Decimal(f.denominator)).normalize()
    k = d.adjusted()
    return rf"{format(d.scaleb(-k).normalize(), 'f')} \times 10^{{{k}}}", k


@st.composite
def reduced_fraction(draw):
    q = draw(st.integers(2, 60))
    p = draw(st.integers(1, 300).filter(lambda n: Fraction(n, q).denominator == q))
    return Fraction(p, q)


_FRACTION_SPELLINGS = [r"\frac{{{n}}}{{{d}}}", "{n}/{d}", r"\dfrac{{{n}}}{{{d}}}", r"\tfrac{{{n}}}{{{d}}}"]
_QUESTIONS = [None, "Simplify {n}/{d}.", r"Reduce $\frac{{{n}}}{{{d}}}$.", "Simplify the ratio {n}:{d}.",
              "Compute the probability.", "What is {n} over {d} in lowest terms?"]


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(reduced_fraction(), st.integers(2, 40), st.sampled_from(_FRACTION_SPELLINGS),
                          st.sampled_from(_FRACTION_SPELLINGS), st.sampled_from(_QUESTIONS), st.booleans()),
                min_size=1, max_size=5))
def test_property_a_scaled_fraction_never_scores_the_reduced_one_does(reward, cases):
    """Whatever the question writes (its fraction, another scale of it, a ratio, nothing), a fraction gold takes
    the fraction in lowest terms in any spelling, and never a multiple of its terms; a negative gold likewise."""
    prompts, answers, golds = [], [], []
    for f, k, forged, honest, question, negative in cases:
        sign = "-" if negative else ""
        n, d = f.numerator, f.denominator
        q = question.format(n=n * k, d=d * k) if question else None
        prompts += [q, q]
        answers += [sign + forged.format(n=n * k, d=d * k), sign + honest.format(n=n, d=d)]
        golds += [rf"{sign}\frac{{{n}}}{{{d}}}"] * 2
    out, _ = scores(reward, prompts, answers, golds)
    assert out == [0.0, 1.0] * len(cases), list(zip(prompts, answers, out))


@st.composite
def terminating(draw):
    """A non-integer with a terminating decimal expansion."""
    q = 2 ** draw(st.integers(0, 5)) * 5 ** draw(st.integers(0, 4))
    q = q if q > 1 else 8
    p = draw(st.integers(1, 2000).filter(lambda n: Fraction(n, q).denominator > 1))
    return Fraction(p, q)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(terminating(), min_size=1, max_size=4))
def test_property_a_decimal_re_expressed_never_answers_for_its_common_fraction(reward, cases):
    """ "Express D as a common fraction": D written over a power of ten, D's percentage, D in scientific notation
    with a small exponent, D itself score 0; the fraction in lowest terms scores 1."""
    prompts, answers, golds, expected = [], [], [], []
    for f in cases:
        decimal = _decimal(f)
        places = len(decimal.split(".")[1])
        question = f"Express {decimal} as a common fraction."
        gold = rf"\frac{{{f.numerator}}}{{{f.denominator}}}"
        scaled = rf"\frac{{{int(f * 10**places)}}}{{{10**places}}}"
        scientific, _ = _scientific(f)
        forged = [decimal, rf"{_decimal(f * 100)}\%", scientific] + ([scaled] if f.denominator != 10**places else [])
        prompts += [question] * (len(forged) + 1)
        answers += forged + [gold]
        golds += [gold] * (len(forged) + 1)
        expected += [0.0] * len(forged) + [1.0]
    out, _ = scores(reward, prompts, answers, golds)
    assert out == expected, [x for x in zip(prompts, answers, out, expected) if x[2] != x[3]]


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(terminating(), st.sampled_from(["decimal", "percent"])), min_size=1, max_size=4))
def test_property_a_decimal_or_percent_gold_takes_its_value_not_an_operation_or_the_questions_fraction(reward, cases):
    """ "Convert p/q to a decimal / percent": the question's fraction, a scaled copy of it, scientific notation
    with a small exponent of the decimal score 0; the decimal (trailing zero too) or the percentage score 1."""
    prompts, answers, golds, expected = [], [], [], []
    for f, asked in cases:
        question = rf"Convert $\frac{{{f.numerator}}}{{{f.denominator}}}$ to a {asked}."
        decimal = _decimal(f)
        gold = decimal if asked == "decimal" else rf"{_decimal(f * 100)}\%"
        honest = [gold, (decimal + "0" if "." in decimal else decimal) if asked == "decimal" else gold]
        forged = [rf"\frac{{{f.numerator}}}{{{f.denominator}}}", rf"\frac{{{3 * f.numerator}}}{{{3 * f.denominator}}}"]
        scientific, k = _scientific(f)
        if asked == "decimal" and abs(k) < MIN_SCIENTIFIC_EXPONENT:
            forged.append(scientific)
        prompts += [question] * (len(forged) + len(honest))
        answers += forged + honest
        golds += [gold] * (len(forged) + len(honest))
        expected += [0.0] * len(forged) + [1.0] * len(honest)
    out, _ = scores(reward, prompts, answers, golds)
    assert out == expected, [x for x in zip(prompts, answers, out, expected) if x[2] != x[3]]


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(1_000_001, 9_999_999), st.integers(2, 9),
                          st.sampled_from([r"{a} \times {k}", r"{a} \cdot {k}", r"({a}) \times ({k})", r"{k} \cdot {a}",
                                           r"{a} \times \sqrt{{{k2}}}", r"\frac{{{a}}}{{1/{k}}}", r"{a} + {a}"])),
                min_size=1, max_size=4))
def test_property_a_long_decimal_gold_takes_the_decimal_not_the_questions_operation(reward, cases):
    """A gold of more than 6 significant digits: the question's own product (bare, bracketed, wrapped in a root
    of a square) scores 0, the product's decimal scores 1."""
    prompts, answers, golds, expected = [], [], [], []
    for digits, k, template in cases:
        a = Decimal(digits).scaleb(-6)
        if template == r"{a} + {a}":
            k = 2
        gold = format((a * k).normalize(), "f")
        question = f"What is {a} times {k}?"
        prompts += [question] * 2
        answers += [template.format(a=a, k=k, k2=k * k), gold]
        golds += [gold] * 2
        expected += [0.0, 1.0]
    out, _ = scores(reward, prompts, answers, golds)
    assert out == expected, [x for x in zip(prompts, answers, out, expected) if x[2] != x[3]]


def test_forms_of_reads_the_new_refusals():
    assert forms_of(r"-\frac{-1}{2}") == [None] and forms_of(r"0\frac{3}{8}") == [None]
    assert not states_values(r"\frac{168}{288}", "number") and states_values(r"\frac{7}{12}", "number")
