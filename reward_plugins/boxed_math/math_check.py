"""The math-verify side of ``boxed_math``: runs inside the worker processes of :mod:`reward_plugins.boxed_math.pool`.

Importing this module is cheap; math-verify (and sympy) are imported on first use, which in the workers
happens once, in the fork server (see ``boxed_math``), before the workers are forked.

Timeouts are not math-verify's job here (its SIGALRM timeouts are disabled): the pool kills a worker that
overruns its deadline, which works whatever thread the reward function is called from.

The gold is parsed by math-verify as it is (a trusted text: a bare answer or a reference solution). An answer
is read strictly: the rules of :mod:`reward_plugins.boxed_math.answer_form` first, then its whole content parsed as one
expression by math-verify's own normalization and LaTeX parser, without math-verify's fallbacks (which answer
from a fragment when the whole does not parse); then every equation in it is checked to assert one value
(:func:`_asserts_one_value`) and every approximation to approximate it (:func:`_approximates`); where the gold
is a value, each component of the answer must be written as a value in final form, not as an operation or
function of values (:mod:`reward_plugins.boxed_math.value_form`, on the parser's syntax tree: ``unevaluated``
otherwise). Only then does
math-verify's ``verify`` compare it with the gold.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections import OrderedDict

from reward_plugins.boxed_math.answer_form import Form, answer_key, gold_text, read_form
from reward_plugins.boxed_math.boxes import find_boxes
from reward_plugins.boxed_math.question import Question
from reward_plugins.boxed_math.value_form import (
    MAX_VALUE_DIGITS,
    forms_of,
    gold_forms,
    gold_values,
    is_name,
    states_values,
)

_SEPARATOR_RE = re.compile(r"(?:\s|\$|,|;|\\[,;!]|\\q?quad|\\text\{\s*(?:and|,)?\s*\}|\\[()\[\]]|and|&|\\\\)*")
_GOLD_CACHE: OrderedDict[str, list] = OrderedDict()
_GOLD_CACHE_SIZE = 4096
_mv = None


def _math_verify():
    global _mv
    if _mv is None:
        import math_verify
        from latex2sympy2_extended import latex2sympy
        from latex2sympy2_extended.math_normalization import normalize_latex
        from math_verify import LatexExtractionConfig
        from math_verify.grader import should_treat_as_complex

        for name in ("math_verify", "math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).setLevel(logging.CRITICAL)  # "timeout disabled" warnings: intended
        # the gold's config: math-verify's own for LaTeX (a bare NormalizationConfig(units=True), as TRL uses,
        # breaks "\\frac12")
        config = [LatexExtractionConfig(boxed_match_priority=0)]
        # an answer's: the same normalization, except that units are not dropped (answer_form has done it, by
        # rule; math-verify's rule drops all from the first \\text{ on) and nested boxes are not looked for
        answer = dataclasses.replace(config[0].normalization_config, units=False, boxed="none")

        def parse_whole(latex: str):
            normalized = normalize_latex(latex, answer)
            expr = latex2sympy(normalized, is_real=not should_treat_as_complex(normalized), convert_degrees=False,
                               normalization_config=None)
            return [expr, normalized]

        _mv = (math_verify, config, parse_whole)
    return _mv


def gold_answer(gold: str) -> str:
    """A gold may be a bare answer or a whole reference solution: in that case, its last box."""
    gold = str(gold).strip()
    boxes = [b for b in find_boxes(gold, max_chars=100_000) if b.content and b.content.strip()]
    if boxes:
        # boxes separated only by commas / "and" / spacing form one multi-part answer (a set or tuple);
        # otherwise the last box is the answer (a reference solution may box intermediate results)
        run = [boxes[-1]]
        for prev in reversed(boxes[:-1]):
            if not _SEPARATOR_RE.fullmatch(gold[prev.end : run[0].start]):
                break
            run.insert(0, prev)
        return ", ".join(dict.fromkeys(b.content.strip() for b in run))
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if gold.startswith(left) and gold.endswith(right) and len(gold) > len(left) + len(right):
            return gold[len(left) : -len(right)].strip()
    return gold


def parse_gold(gold: str) -> list:
    """math-verify's parse of a gold (cached per worker: a group's answers share it)."""
    hit = _GOLD_CACHE.get(gold)
    if hit is not None:
        _GOLD_CACHE.move_to_end(gold)
        return hit
    mv, gold_config, _ = _math_verify()
    answer = gold_answer(gold)
    parsed = mv.parse("\\boxed{" + answer + "}", extraction_config=gold_config, parsing_timeout=None)
    if not parsed:  # e.g. plain text or an expression LaTeX extraction does not take: math-verify's defaults
        parsed = mv.parse(answer, parsing_timeout=None)
    _GOLD_CACHE[gold] = parsed
    if len(_GOLD_CACHE) > _GOLD_CACHE_SIZE:
        _GOLD_CACHE.popitem(last=False)
    return parsed


@functools.lru_cache(maxsize=4096)
def _states_values_cached(normalized: str, gold_kind: str, gold_written: frozenset, question_forms: frozenset) -> bool:
    return states_values(normalized, gold_kind, gold_written, question_forms)


_HALF_RE = re.compile(r"\s*0?\.50*\s*")


def _as_written(latex: str, normalized: str) -> str:
    """The normalized text whose tree is read for its value forms: math-verify's normalization turns the whole
    text ``0.5`` into ``\\frac{1}{2}`` (its only rewrite of one notation into another), which would make a
    decimal read as a fraction."""
    return "0.5" if normalized == "\\frac{1}{2}" and _HALF_RE.fullmatch(latex) else normalized


@functools.lru_cache(maxsize=4096)
def _gold_forms(gold_latex: str) -> frozenset:
    parsed = _parse_whole(gold_latex)
    return gold_forms(_as_written(gold_latex, str(parsed[1]))) if parsed else frozenset()


@functools.lru_cache(maxsize=4096)
def _parse_whole_cached(latex: str) -> tuple:
    try:
        return tuple(_math_verify()[2](latex))
    except MemoryError:  # out of the worker's memory bound: the pool reports it, never "unparsed"
        raise
    except Exception:  # noqa: BLE001 - the parser's errors are many and untyped
        return ()


#: math-verify's ``numeric_precision`` (digits of ``(a - b).evalf(chop=True)``): with its default, 15, the
#: difference of ``\\frac{\\pi}{2^{98}}`` and ``\\frac{\\pi}{2^{99}}`` is chopped to 0.
NUMERIC_PRECISION = 60


def _exact(parsed: list) -> list:
    """A parse with every decimal read as the rational it writes (``0.375`` is 3/8 exactly): math-verify then
    compares numbers exactly, never by its ``float_rounding`` (``\\pi`` would equal 3.14159265)."""
    import sympy

    out = []
    for e in parsed:
        if isinstance(e, (sympy.Basic, sympy.MatrixBase)):
            floats = e.atoms(sympy.Float)
            if floats:
                e = e.xreplace({f: sympy.Rational(str(f)) for f in floats})
        out.append(e)
    return out


def _verify(gold: list, target: list) -> bool:
    """math-verify's ``verify`` (any gold parse equals any target parse), on exact numbers (:func:`_exact`), pair
    by pair, except that a ``MemoryError`` propagates (``verify`` turns every exception into False): the
    worker's memory bound is then reported as such. Any other error makes that pair unequal, as in ``verify``."""
    mv = _math_verify()[0]
    for g in _exact(gold):
        for t in _exact(target):
            try:
                if mv.verify([g], [t], timeout_seconds=None, raise_on_error=True,
                             numeric_precision=NUMERIC_PRECISION):
                    return True
            except MemoryError:
                raise
            except Exception:  # noqa: BLE001, S112 - what verify itself does with a pair that raises
                continue
    return False


def _number(expr):
    """The real number an expression (or the last side of an equation) is, as a ``Decimal`` of 50 digits;
    ``None`` if it is not one."""
    from decimal import Decimal

    value = _value(expr)
    if getattr(value, "free_symbols", True) or not hasattr(value, "evalf"):
        return None
    try:
        value = value.doit()  # a percentage: X * UnevaluatedExpr(1/100)
        number = complex(value.evalf(50))
        if number.imag != 0 or not abs(number.real) < 1e300:
            return None
        return Decimal(str(value.evalf(50)))
    except (TypeError, ValueError, AttributeError, OverflowError, ArithmeticError):
        return None


def _rounded(gold, precision: tuple):
    """The gold rounded to the stated precision (``("decimals", n)`` or ``("significant", n)``), both ways a tie
    may go."""
    from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal

    places = precision[1]
    if precision[0] == "significant":
        if gold == 0:
            return {gold}
        places = precision[1] - 1 - gold.adjusted()
    step = Decimal(1).scaleb(-places)
    return {gold.quantize(step, rounding=r) for r in (ROUND_HALF_UP, ROUND_HALF_EVEN)}


def _close_enough(gold_parsed: list, gold_latex: str, parsed: list, normalized: str, question: Question,
                  relative_tolerance: float | None) -> bool:
    """Where an inexact number is an answer (docs/rewards.md, "Exact answers"): a decimal answer for a problem
    that states a precision (the gold rounded to it), any answer that rounds or truncates to a gold written as
    a decimal of more than ``MAX_VALUE_DIGITS`` significant digits (the gold is itself a rounding), and a number
    within ``relative_tolerance`` of a numeric gold when that option is set."""
    import sympy

    gold_expr = _exact(gold_parsed)[0]
    answer = _exact(parsed)[0]
    if isinstance(gold_parsed[0], sympy.Float) and len(_significant(gold_parsed[0])) > MAX_VALUE_DIGITS:
        text = gold_latex.strip()
        if _DECIMAL_TEXT_RE.fullmatch(text) and _approximates(_value(answer), text):
            return True
    g, a = _number(gold_expr), _number(answer)
    if g is None or a is None:
        return False
    if question.precision is not None:
        forms = forms_of(normalized) or []
        if len(forms) == 1 and forms[0] is not None and forms[0][0] in ("decimal", "integer", "percent"):
            scale = 100 if forms[0][0] == "percent" else 1
            if a * scale in _rounded(g * scale, question.precision):
                return True
    if relative_tolerance is not None:
        return abs(a - g) <= abs(g) * type(g)(repr(relative_tolerance))
    return False


_DECIMAL_TEXT_RE = re.compile(r"-?\d+\.\d+")


def _significant(value) -> str:
    return str(value).lstrip("-").split("e")[0].replace(".", "").strip("0")


def _parse_whole(latex: str) -> list:
    """An answer's LaTeX parsed as ONE expression (``[expr, normalized text]``); ``[]`` when it does not parse.
    Unlike ``math_verify.parse``, nothing is extracted from it: no fragment can stand for the whole. Cached per
    worker: a group's answers often repeat (as math-verify caches its own parses)."""
    return list(_parse_whole_cached(latex))


_PROBES = (0.6180339887, 1.4142135623, -0.7071067811, 2.7182818284)


def _surely_different(gold_parsed: list, parsed: list) -> bool:
    """A cheap proof that two parsed answers differ, to skip sympy's ``simplify`` (the slow part of verify)
    on wrong answers: both are plain expressions (no relation, set, tuple, matrix or function), at least one
    has a free symbol, and they take different values at two probe points, so ``simplify(a - b)`` cannot be
    0. Returns False whenever unsure (then math-verify decides)."""
    import sympy

    a, b = gold_parsed[0], parsed[0]
    if not all(isinstance(x, sympy.Expr) and not isinstance(x, (sympy.Tuple, sympy.MatrixBase)) for x in (a, b)):
        return False
    if len(gold_parsed) > 1 and len(parsed) > 1 and str(gold_parsed[1]) == str(parsed[1]):
        return False

    def symbol_like(x) -> bool:  # math-verify compares these by name (\text{odd} == o*d*d, \text{e} == E)
        return isinstance(x, sympy.Symbol) or (
            isinstance(x, sympy.Mul) and all(arg == sympy.E or isinstance(arg, sympy.Symbol) for arg in x.args)
        )

    if symbol_like(a) or symbol_like(b):
        return False
    free = a.free_symbols | b.free_symbols
    if not free or len(free) > 4 or a.has(sympy.Function) or b.has(sympy.Function):
        return False  # numbers are compared fast by math-verify; functions (f(x)) may be compared by name
    symbols = sorted(free, key=str)
    for shift in range(2):
        point = {s: _PROBES[(i + shift) % len(_PROBES)] for i, s in enumerate(symbols)}
        try:
            va, vb = complex(a.evalf(15, subs=point)), complex(b.evalf(15, subs=point))
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            return False
        if not all(map(lambda z: abs(z) < 1e12, (va, vb))):
            return False
        if abs(va - vb) <= 1e-6 * max(1.0, abs(va), abs(vb)):
            return False  # equal here: let math-verify decide
    return True


def _equation_chains(expr):
    """The sides of every equation in ``expr``, in order: ``a = b = c`` gives ``[a, b, c]``."""
    import sympy

    if isinstance(expr, sympy.And) and all(isinstance(a, sympy.Eq) for a in expr._unsorted_args):
        args = expr._unsorted_args  # latex2sympy builds a = b = c as And(Eq(a, b), Eq(b, c)), in this order
        yield [args[0].lhs, *(a.rhs for a in args)]
        return
    if isinstance(expr, sympy.Eq):
        yield [expr.lhs, expr.rhs]
        return
    for arg in getattr(expr, "args", ()):
        yield from _equation_chains(arg)


def _asserts_one_value(expr, gold_is_relation: bool) -> bool:
    """An equation states one value: every side after the first equals the last (``x = 2+1 = 3``), and so does
    the first unless it has a free symbol (``x = 3``; ``3 = 4`` and ``x = 4 = 3`` assert two numbers). math-verify
    compares only the last side with a gold that is not an equation, so the others must not differ from it.
    A two-sided equation is compared whole against a gold that is itself a relation."""
    for sides in _equation_chains(expr):
        if len(sides) == 2 and gold_is_relation:
            continue
        last, rest = sides[-1], sides[:-1]
        if getattr(rest[0], "free_symbols", None):
            rest = rest[1:]
        for side in rest:
            if not _verify([last], [side]):
                return False
    return True


def _value(expr):
    """The value an answer states: the last side of its (last) equation, else the expression itself."""
    chains = list(_equation_chains(expr))
    return chains[-1][-1] if chains else expr


def _approximates(value, decimal: str) -> bool:
    """``value`` rounded or truncated to the decimals written in ``decimal`` gives ``decimal``."""
    from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal

    try:
        number = complex(value.evalf(30))
    except (TypeError, ValueError, AttributeError, OverflowError):
        return False
    if number.imag != 0 or not abs(number.real) < 1e300:
        return False
    written = Decimal(decimal)
    step = Decimal(1).scaleb(written.as_tuple().exponent)
    exact = Decimal(repr(number.real))
    return any(exact.quantize(step, rounding=r) == written for r in (ROUND_HALF_UP, ROUND_DOWN))


def read_answer(form: Form, gold_is_relation: bool) -> tuple[str, list]:
    """``("ok", parsed)`` for an answer whose form was accepted, else ``("hedged" | "unparsed", [])``."""
    parsed = _parse_whole(form.exact)
    if not parsed:
        return "unparsed", []
    if not _asserts_one_value(parsed[0], gold_is_relation):
        return "hedged", []
    if not form.approx:
        return "ok", parsed
    value = _value(parsed[0])
    if getattr(value, "free_symbols", None):  # x \approx 11: the first decimal is the answer
        parsed = _parse_whole(form.approx[0])
        value, approx = parsed[0], form.approx[1:]
    else:
        approx = form.approx
    if not all(_approximates(value, a) for a in approx):
        return "hedged", []
    return "ok", parsed


#: What makes an expression possibly irrational (a closed form a decimal gold may be the rounding of): a root,
#: pi, e, a logarithm, an exponential or trigonometric function, or an exponent that is not an integer.
_CLOSED_FORM_RE = re.compile(
    r"\\(?:sqrt|pi|ln|log|lg|exp|(?:arc)?(?:sin|cos|tan|cot|sec|csc)h?|ar(?:sin|cos|tan)h)(?![A-Za-z])"
    r"|(?<![\\A-Za-z])e(?![A-Za-z])|[π√]|\^(?!\s*(?:\{\s*-?\s*\d+\s*\}|\d))"
)

_DECIMAL_POINT_RE = re.compile(r"\d?\.\d")


def _final_answer(latex: str, parsed: list, gold_kind: str, gold_written: frozenset, gold_parsed: list,
                  question: Question) -> bool:
    """Whether an answer is a value in final form where the gold is a value (docs/rewards.md, "A value is asked
    for"): :func:`~reward_plugins.boxed_math.value_form.states_values`. Where the gold is a decimal of more than
    ``MAX_VALUE_DIGITS`` digits (``"rounded"``: it may be the rounding of ``\\sqrt{17}``), an expression is an
    answer too, if it is one expression (not a tuple) without a decimal, may be irrational
    (:data:`_CLOSED_FORM_RE`) and its value is not the gold's decimal itself (``\\frac{1234567}{1000000} \\times
    \\sqrt{4}`` for 2.469134 is the question's own operation)."""
    written = _as_written(latex, str(parsed[1]))
    if _states_values_cached(written, gold_kind, gold_written, question.forms):
        return True
    # one expression, not a value form (one that is not final, or restates the question, stays refused), exact:
    # a decimal in it is a rounding or the question's operand (1.234567 \times 2 + 10^{-8}\pi rounds to 2.469134)
    if gold_kind != "rounded" or not _CLOSED_FORM_RE.search(written) or _DECIMAL_POINT_RE.search(written) \
            or forms_of(written) != [None]:
        return False
    gold, answer = _number(_exact(gold_parsed)[0]), _number(_exact(parsed)[0])
    return gold is None or answer is None or answer != gold


def check(task: tuple[str, tuple[str, ...]]) -> str:
    """Grade one answer. ``task = (gold, candidates)``: ``candidates[-1]`` is the final answer, the others are
    the answer's other distinct boxes. Returns ``"correct"``, ``"wrong"``, ``"hedged"`` (the final answer is
    right but another box holds a different answer, or a box asserts two values), ``"unparsed"`` (a box the
    rules do not read), ``"unevaluated"`` (an operation or function of values where the gold is a value) or
    ``"bad_gold"``."""
    gold, candidates = task[0], task[1]
    question = task[2] if len(task) > 2 else Question()
    relative_tolerance = task[3] if len(task) > 3 else None
    gold_parsed = parse_gold(gold)
    if not gold_parsed:
        return "bad_gold"
    gold_latex = gold_answer(gold)
    gold_key, gold_texts = answer_key(gold_latex), gold_text(gold_latex)
    from math_verify.grader import is_relation

    gold_is_relation = is_relation(gold_parsed[0])
    gold_kind = gold_values(gold_parsed[0])  # "integer" | "number" | "rounded" | None: not a value
    gold_written = _gold_forms(gold_latex) if gold_kind in ("number", "rounded") else frozenset()

    def verdict(candidate: str) -> tuple[str, Form | None]:
        if answer_key(candidate) == gold_key:  # the gold's own text: no parsing needed (fast path)
            return "correct", None
        form = read_form(candidate, gold_texts)
        if form.refused:
            return form.refused, None
        if gold_kind is not None:  # a value is asked for: an operation or function of values restates the question
            parsed = _parse_whole(form.exact)
            named = form.approx and parsed and is_name(str(parsed[1]))  # x \approx 11: the value is the decimal
            if parsed and not named and not _final_answer(form.exact, parsed, gold_kind, gold_written, gold_parsed,
                                                          question):
                return "unevaluated", None
        status, parsed = read_answer(form, gold_is_relation)
        if status != "ok":
            return status, None
        if _surely_different(gold_parsed, parsed):
            return "wrong", form
        if _verify(gold_parsed, parsed):
            return "correct", form
        written = _as_written(form.exact, str(parsed[1])) if len(parsed) > 1 else ""
        close = _close_enough(gold_parsed, gold_latex, parsed, written, question, relative_tolerance)
        return ("correct" if close else "wrong"), form

    return _answer_verdict(candidates, verdict, gold_parsed, gold_is_relation)


def _answer_verdict(candidates: tuple[str, ...], verdict, gold_parsed, gold_is_relation: bool) -> str:
    """The whole answer's verdict from its boxes' (``verdict(box) -> (status, form)``): a right final box is
    ``"hedged"`` when another box is not right; a wrong final box among several is ``"correct"`` only when the
    boxes together, read as one list, equal the gold exactly."""
    status, final_form = verdict(candidates[-1])
    forms = [final_form]
    if status == "correct":
        for other in candidates[:-1]:
            other_status, form = verdict(other)
            if other_status != "correct":
                return "hedged"
    elif len(candidates) > 1 and status == "wrong" and not final_form.approx:
        # A multi-part answer boxed part by part (\boxed{1} and \boxed{2} for the gold {1, 2}): the boxes
        # together must equal the gold exactly, so this never rewards a list that merely contains it.
        for other in candidates[:-1]:
            other_status, form = verdict(other)
            if form is None or form.approx:
                return status
            forms.insert(-1, form)
        joint = Form(exact=", ".join(f.exact for f in forms))
        joint_status, parsed = read_answer(joint, gold_is_relation)
        if joint_status == "ok" and _verify(gold_parsed, parsed):
            return "correct"
    return status


_WARM_UP = (
    ("\\frac{1}{2}", ("0.5",)),
    ("x^2+2x+1", ("(x+1)^2",)),
    ("x^2+2x+1", ("x(x+2)",)),
    ("\\frac{\\sqrt{3}}{2}", ("\\sin(\\pi/3)",)),
    ("[0,1)", ("x \\in [0, 1)",)),
    ("\\{1,2\\}", ("2, 1",)),
    ("(1,2)", ("(1, 3)",)),
    ("\\begin{pmatrix}1 & 2\\\\ 3 & 4\\end{pmatrix}", ("\\begin{pmatrix}1 & 2\\\\ 3 & 5\\end{pmatrix}",)),
    ("x = 3", ("3",)),
    ("y < 2", ("(-\\infty, 2)",)),
    ("10\\%", ("0.1",)),
    ("\\text{(B)}", ("B",)),
)


def warm() -> None:
    """Import math-verify and sympy and run a few typical checks, so that a worker's first real checks don't
    pay sympy's first-use costs (lazy imports, caches) inside their deadline. Runs before a worker is ready."""
    for task in _WARM_UP:
        try:
            check(task)
        except Exception:  # noqa: BLE001
            pass
    _GOLD_CACHE.clear()
    _parse_whole_cached.cache_clear()
    _states_values_cached.cache_clear()
    _gold_forms.cache_clear()
