"""Whether an answer states values in final form or restates the question, decided on parse trees (runs in the
workers).

Where the gold is a **value** (:func:`gold_values`: every component of math-verify's parse of the gold is a
number: an integer, a fraction, a decimal, a percentage, an infinity; the components of a tuple, a set, an
interval or a matrix, or the sides of a relation that are not a name, as in ``x = 3`` or ``y < 2``), an answer
scores only if each of its components is written as a value in **final form** too (:func:`states_values`), read
on the LaTeX parser's own syntax tree (latex2sympy's ANTLR grammar, the parse math-verify uses), before any
evaluation. The rule is about the answer, not about how the question is spelled:

* a **value** is a numeral (``3``, ``3.5``, ``1,000``, ``101_2``), optionally signed (``-3``), in redundant
  brackets (``(3)``, ``{3}``), as a percentage (``10\\%``) or in degrees (``30^\\circ``), or ``\\infty``;
  unless every component of the gold is an integer, also a fraction of two integer numerals (``\\frac{1}{2}``,
  ``1/2``, ``\\frac{-1}{2}``), a mixed number (``2\\frac{1}{2}``) or scientific notation with a mantissa in
  [1, 10) (``3.2 \\times 10^{-4}``);
* a value is in **final form** (:func:`is_final`) unless it is a fraction not in lowest terms or over 1
  (``\\frac{168}{288}``, ``\\frac{250}{40}``, ``\\frac{7}{1}``), a mixed number whose fraction is not,
  or scientific notation for a magnitude in [10^-2, 10^3) (``3.75 \\times 10^{-1}``: the decimal is the value),
  except where the gold itself is written that way (:func:`gold_forms`);
* anything else is an **operation or function of values** and restates the question rather than answering
  it: ``60494 \\times (63)``, ``(2)^{10}``, ``{60494}\\cdot{63}``, ``\\gcd(84,126)``, ``\\sum_{i=1}^{100} i``,
  ``\\log_2(1024)``, ``\\sqrt{4}``, ``4!``, ``\\frac{2.5}{0.4}``, ``-\\frac{-1}{2}``, ``(1+2, 2+2)`` for the
  gold ``(3, 4)``, ``x = 1+2`` for ``x = 3``;
* the components of a relation are its last side and every side before a relation other than ``=``
  (``2 < x < 5``), except a **name** (``x``, ``a_1``, ``f(x)``: no numeral outside a subscript or an argument):
  ``x = 3`` states the value 3, and so does ``x = 2 + 1 = 3`` (the steps before ``=`` are working, which
  ``math_check`` checks to equal the last side), while ``x = 1 + 2`` states none;
* a final form in another notation than the gold's that writes a value the question writes, in the same family
  of notations (a fraction or mixed number; a decimal, percentage or scientific notation), re-spells the
  question (:func:`_restates`): ``0.375`` or ``37.5\\%`` for "Write 0.375 as a common fraction".

The rule is an allowlist over node types: a tree it does not know is not a value (default-deny). A decimal gold
of more than :data:`MAX_VALUE_DIGITS` significant digits (``"rounded"``) may be the rounding of a number with no
short form (4.1231056 for ``\\sqrt{17}``): ``math_check`` then also takes one expression that may be irrational
and is not the gold's decimal itself. Where the gold is not a value (``\\sqrt{2}``, ``2\\pi``, ``x^2+1``,
``\\text{(B)}``), the rule does not apply: an expression is then what is asked for, and math-verify's equivalence
decides.
"""

from __future__ import annotations

import re
from fractions import Fraction
from math import gcd

#: A numeral with thousands separators: latex2sympy reads it as one number before its grammar does (which
#: would see a list).
_COMMA_NUMERAL_RE = re.compile(r"\s*[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?\s*\Z")
_DIGITS_RE = re.compile(r"\d+\Z")
_DECIMAL_RE = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)\Z")
_PERCENT_ATOM_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*\\%\Z")
#: Rules of the grammar that only pass their one child on (no meaning of their own in this reading).
_PASS_THROUGH = frozenset(
    "math set_elements semicolon_elements comma_elements element relation expr additive mp unary postfix "
    "exp comp atom element_no_relation semicolon_elements_no_relation comma_elements_no_relation set_atom "
    "set_relation minus_expr union_expr intersection_expr set_group".split()
)
#: Container rules: each child that is a tree of its own is a component (the tokens between are punctuation).
_CONTAINERS = frozenset(
    "math set_elements semicolon_elements comma_elements element_no_relation semicolon_elements_no_relation "
    "comma_elements_no_relation set_atom interval ordered_tuple finite_set matrix matrix_row minus_expr union_expr "
    "intersection_expr set_group".split()
)
_RELATION_TOKENS = frozenset(
    "= < > \\le \\leq \\ge \\geq \\lt \\gt \\ne \\neq \\leqslant \\geqslant \\approx \\equiv \\in \\notin "
    "\\subset \\subseteq \\supset \\supseteq".split()
    + ["≤", "≥", "≠", "<=", ">=", "!=", "=="]
)


def gold_values(gold_expr) -> str | None:
    """``"integer"`` when every component of the gold (a sympy expression, math-verify's parse) is an integer,
    ``"number"`` when every one is a number (rational, decimal of at most :data:`MAX_VALUE_DIGITS` significant
    digits, percentage, infinity), ``"rounded"`` when one is a longer decimal, else ``None``: the gold is not a
    value, and :func:`states_values` is not asked."""
    import sympy

    def components(e):
        if isinstance(e, (sympy.Tuple, sympy.FiniteSet, list, tuple)):
            for a in e:
                yield from components(a)
        elif isinstance(e, sympy.Interval):
            yield from components(e.start)
            yield from components(e.end)
        elif isinstance(e, sympy.MatrixBase):
            for a in e:
                yield from components(a)
        elif isinstance(e, (sympy.And, sympy.Or)):
            for a in e._unsorted_args if hasattr(e, "_unsorted_args") else e.args:
                yield from components(a)
        elif isinstance(e, sympy.core.relational.Relational) or isinstance(e, sympy.Contains):
            for side in e.args:
                if not (isinstance(side, sympy.Symbol) or isinstance(side, sympy.Function)
                        or isinstance(side, sympy.Indexed)):
                    yield from components(side)
        else:
            yield e

    kinds = set()
    try:
        for c in components(gold_expr):
            value = c.doit() if isinstance(c, sympy.Basic) else c
            if value in (sympy.oo, -sympy.oo):
                kinds.add("number")
            elif isinstance(value, sympy.Integer):
                kinds.add("integer")
            elif isinstance(value, sympy.Rational) or isinstance(value, sympy.Float) and _short_decimal(value):
                kinds.add("number")
            elif isinstance(value, sympy.Float):
                kinds.add("rounded")
            else:
                return None
    except Exception:  # noqa: BLE001 - a gold sympy cannot take apart is not read as a value
        return None
    if not kinds:
        return None
    if "rounded" in kinds:
        return "rounded"
    return "integer" if kinds == {"integer"} else "number"


#: A decimal gold with more significant digits than this reads as a rounding of a number that may have no short
#: form (4.123105625617661 for sqrt(17)): an exact expression that may be irrational is then an answer too.
MAX_VALUE_DIGITS = 6


def _short_decimal(value) -> bool:
    digits = str(value).lstrip("-").replace(".", "").strip("0")
    return len(digits) <= MAX_VALUE_DIGITS


def _rule(node) -> str | None:
    """The grammar rule of a parse-tree node (``None`` for a token)."""
    name = type(node).__name__
    return name[: -len("Context")].lower() if name.endswith("Context") else None


def _children(node) -> list:
    return list(getattr(node, "children", None) or [])


def _subtrees(node) -> list:
    return [c for c in _children(node) if _rule(c) is not None]


def _tokens(node) -> list[str]:
    return [c.getText() for c in _children(node) if _rule(c) is None]


def _unwrap(node):
    """Down the chain of single-child pass-through rules (``expr -> additive -> mp -> ...``)."""
    while _rule(node) in _PASS_THROUGH:
        kids = _children(node)
        if len(kids) != 1 or _rule(kids[0]) is None:
            break
        node = kids[0]
    return node


def _numeral(node, integer: bool = False) -> bool:
    """A bare numeral: ``number_subexpr`` (a subscript, as in ``101_2``, is a base: the form rules check it);
    ``integer``: digits only."""
    node = _unwrap(node)
    if _rule(node) != "number_subexpr":
        return False
    text = _children(node)[0].getText()
    return bool((_DIGITS_RE if integer else _DECIMAL_RE).match(text))


def _signed(node):
    """``(sign, inner)`` of a unary minus or plus, else ``("", node)``."""
    node = _unwrap(node)
    kids = _children(node)
    if _rule(node) == "unary" and len(kids) == 2 and _rule(kids[0]) is None and kids[0].getText() in "+-":
        return kids[0].getText(), kids[1]
    return "", node


def _group_inner(node):
    """The content of a redundant bracket, ``(3)`` or ``{3}``, else ``None``."""
    node = _unwrap(node)
    if _rule(node) == "group":
        subs = _subtrees(node)
        if len(subs) == 1 and "".join(_tokens(node)) in ("()", "{}", "[]"):
            return subs[0]
    return None


def _numeral_value(node) -> Fraction:
    return Fraction(_children(_unwrap(node))[0].getText())


def _fraction(node, *, signed_numerator: bool = True) -> tuple | None:
    """``("fraction", n, d)`` of ``\\frac{n}{d}``: two integer numerals (the numerator may carry a sign), ``d > 0``.
    A fraction of decimals (``\\frac{2.5}{0.4}``) is a division still to be done, not a value."""
    node = _unwrap(node)
    if _rule(node) != "frac":
        return None
    subs = _subtrees(node)
    if len(subs) != 2:
        return None
    sign, numerator = _signed(subs[0])
    if sign and not signed_numerator:
        return None
    if not (_numeral(numerator, True) and _numeral(subs[1], True)):
        return None
    n, d = _numeral_value(numerator), _numeral_value(subs[1])
    if d == 0:
        return None
    return ("fraction", -n if sign == "-" else n, d)


def _power_of_ten(node) -> Fraction | None:
    """``k`` of ``10^{k}``, ``k`` a signed integer numeral."""
    node = _unwrap(node)
    subs = _subtrees(node)
    if _rule(node) != "exp" or len(subs) != 2 or "^" not in _tokens(node):
        return None
    base = _unwrap(subs[0])
    if _rule(base) != "number_subexpr" or _children(base)[0].getText() != "10":
        return None
    sign, exponent = _signed(subs[1])
    if not _numeral(exponent, True):
        return None
    k = _numeral_value(exponent)
    return -k if sign == "-" else k


def _scientific(node) -> tuple | None:
    """``("scientific", m, k)`` of ``m \\times 10^{k}`` (or ``\\cdot``), ``1 <= m < 10`` a decimal numeral."""
    node = _unwrap(node)
    subs = _subtrees(node)
    if _rule(node) != "mp" or len(subs) != 2 or _tokens(node) not in (["\\times"], ["\\cdot"]):
        return None
    mantissa = _unwrap(subs[0])
    if not _numeral(mantissa, False):
        return None
    m = _numeral_value(mantissa)
    k = _power_of_ten(subs[1])
    return ("scientific", m, k) if 1 <= m < 10 and k is not None else None


def _mixed_number(node) -> tuple | None:
    """``("mixed", w, n, d)`` of ``w\\frac{n}{d}``: an integer numeral ``w >= 1`` beside a **proper** fraction of
    integer numerals, ``0 < n < d`` (latex2sympy reads w + n/d; ``3\\frac{7}{4}`` is the sum 3 + 7/4, not a mixed number)."""
    node = _unwrap(node)
    subs = _subtrees(node)
    if _rule(node) not in ("unary", "mp") or len(subs) != 2 or _tokens(node):
        return None
    if not _numeral(subs[0], True) or _numeral_value(subs[0]) == 0:  # 0\\frac{3}{8} is a sum, not a mixed number
        return None
    fraction = _fraction(subs[1], signed_numerator=False)
    if fraction is None or not 0 < fraction[1] < fraction[2]:
        return None
    return ("mixed", _numeral_value(subs[0]), fraction[1], fraction[2])


def _form(node, integer: bool, signed_ok: bool = True) -> tuple | None:
    """The value form of one component (see the module docstring): ``(kind, *terms)`` with kind ``integer``,
    ``decimal``, ``percent``, ``degree``, ``infinity`` and, unless ``integer``, ``fraction``, ``mixed``,
    ``scientific``; ``None``: not a value (an operation or function of values, or a tree not known)."""
    sign, inner = _signed(node)
    if sign:
        return _form(inner, integer, signed_ok=False) if signed_ok else None
    node = _unwrap(inner)
    group = _group_inner(node)
    if group is not None:
        return _form(group, integer, signed_ok)
    rule = _rule(node)
    if rule == "number_subexpr":  # a decimal numeral is a value for an integer gold too (42.0)
        if not _numeral(node):
            return None
        return ("integer" if _numeral(node, True) else "decimal", _numeral_value(node))
    if rule == "atom":  # an atom that is one token: 10\%, \infty
        text = node.getText()
        if text == "\\infty":
            return ("infinity",)
        m = _PERCENT_ATOM_RE.match(text)
        return ("percent", Fraction(m.group(1))) if m else None
    if rule == "postfix":  # 30^\circ: a numeral and the degree sign
        subs = _subtrees(node)
        if (len(subs) == 2 and _rule(subs[1]) == "postfix_op"
                and [_rule(s) for s in _subtrees(subs[1])] == ["degree"] and _numeral(subs[0])):
            return ("degree", _numeral_value(subs[0]))
        return None
    if integer:
        return None
    # a sign outside a fraction takes the numerator's sign away: -\\frac{-1}{2} is an operation on -1/2
    return _fraction(node, signed_numerator=signed_ok) or _mixed_number(node) or _scientific(node)


#: Scientific notation is a final form for a number of magnitude below 10^-2 or of at least 10^3 (an exponent
#: of at least this size); nearer 1, the decimal is the value and ``3.75 \\times 10^{-1}`` a product still to do.
MIN_SCIENTIFIC_EXPONENT = 3
#: Exponents beyond this are not turned into values (a hostile ``10^{999999999}``): such a form equals no
#: value a question of :data:`~reward_plugins.boxed_math.question.MAX_QUESTION_CHARS` characters writes.
_MAX_VALUE_EXPONENT = 25_000
#: Notations of one value written in the same digits: a fraction and a mixed number, or a decimal, a percentage
#: (the point moved two places) and scientific notation (the point moved k places).
_FAMILY = {"fraction": "fraction", "mixed": "fraction", "decimal": "decimal", "percent": "decimal",
           "scientific": "decimal"}


def _key(form: tuple) -> tuple:
    """A form with the sign of its number aside (``-\\frac{6}{8}`` and ``\\frac{-6}{8}`` are one spelling)."""
    return (form[0], abs(form[1]), *form[2:]) if len(form) > 1 else form


def is_final(form: tuple, gold_forms: frozenset = frozenset()) -> bool:
    """A value form that states its value in **final form**, decided on the answer alone: a fraction in lowest
    terms with a denominator of at least 2 (``\\frac{7}{12}``, not ``\\frac{168}{288}``, ``\\frac{250}{40}``,
    ``\\frac{0}{5}``, ``\\frac{7}{1}``); a proper mixed number whose fraction is in lowest terms; scientific notation
    only for a magnitude below 10^-2 or of at least 10^3 (``3.2 \\times 10^{-4}``, not ``3.75 \\times 10^{-1}``)
    or where the gold is in scientific notation. A form the gold itself is written in (``gold_forms``: the
    gold's own ``\\frac{6}{8}``) is final for that gold. Numerals, percentages, degrees and infinity are final."""
    kind = form[0]
    if _key(form) in gold_forms:
        return True
    if kind in ("fraction", "mixed") and any(t.denominator != 1 for t in form[1:]):
        return False  # a question's 2.5/4 (an answer's terms are integers: _fraction)
    if kind == "fraction":
        return form[2] >= 2 and gcd(form[1].numerator, form[2].numerator) == 1
    if kind == "mixed":  # proper (an answer's always is: _mixed_number), its fraction in lowest terms
        return form[1] >= 1 and 0 < form[2] < form[3] and gcd(form[2].numerator, form[3].numerator) == 1
    if kind == "scientific":
        return abs(form[2]) >= MIN_SCIENTIFIC_EXPONENT or any(g[0] == "scientific" for g in gold_forms)
    return True


def form_value(form: tuple) -> Fraction | None:
    """The exact value a form writes, sign aside (``None``: infinity, or an exponent past the bound)."""
    kind, terms = form[0], [abs(t) for t in form[1:]]
    if kind in ("integer", "decimal", "degree"):
        return terms[0]
    if kind == "percent":
        return terms[0] / 100
    if kind == "fraction":
        return terms[0] / terms[1] if terms[1] else None
    if kind == "mixed":
        return terms[0] + terms[1] / terms[2] if terms[2] else None
    if kind == "scientific" and abs(form[2]) <= _MAX_VALUE_EXPONENT:
        return form[1] * Fraction(10) ** int(form[2])
    return None


def question_values(question_forms: frozenset) -> frozenset:
    """The question's values by family (:data:`_FAMILY`): ``{("fraction", 3/8), ("decimal", 3/8), ...}``. A
    fraction or mixed number not in final form is an operation of the question, not a value it states (the
    value of "Simplify 84/144" or "Compute 3 + 7/4" is the answer): it gives none."""
    out = set()
    for form in question_forms:
        if form[0] not in _FAMILY or form[0] in ("fraction", "mixed") and not is_final(form):
            continue
        value = form_value(form)
        if value is not None:
            out.add((_FAMILY[form[0]], value))
    return frozenset(out)


def _restates(form: tuple, gold_notations: frozenset, values: frozenset) -> bool:
    """A final value form that restates the question: not in a notation of the gold, it writes a value the
    question writes in the same family of notations (:data:`_FAMILY`): ``\\frac{3}{8}`` for "Convert 3/8 to a
    decimal", ``0.375`` or ``37.5\\%`` for "Write 0.375 as a fraction", ``\\frac{7}{2}`` for "Write 7/2 as a
    mixed number": the question's own number, re-spelled, where the gold is written in another notation."""
    kind = form[0]
    if kind not in _FAMILY or kind in gold_notations:
        return False
    return (_FAMILY[kind], form_value(form)) in values


def _is_name(node) -> bool:
    """A side of a relation that names what the value is of: no numeral outside a subscript or an argument list
    (``x``, ``-x``, ``a_1``, ``|z|``, ``f(x)``, ``\\text{e}``)."""
    return _no_numeral(_unwrap(node))


def _no_numeral(node) -> bool:
    rule = _rule(node)
    if rule == "number_subexpr":
        return False
    if rule in ("subexpr", "func_common_args", "args"):  # a_1, f(x): the index or argument names, not a value
        return True
    return all(_no_numeral(c) for c in _subtrees(node))


def _relation_sides(node) -> list | None:
    """The sides of a relation chain and the relation after each (``a = b < c``: ``[(a, "="), (b, "<"),
    (c, "")]``), or ``None`` if ``node`` is not a relation."""
    node = _unwrap(node)
    rule = _rule(node)
    subs, tokens = _subtrees(node), _tokens(node)
    if rule in ("relation", "set_relation") and len(subs) == 2 and len(tokens) == 1 and tokens[0] in _RELATION_TOKENS:
        left = _relation_sides(subs[0]) or [(subs[0], "")]
        right = _relation_sides(subs[1]) or [(subs[1], "")]
        return [*left[:-1], (left[-1][0], tokens[0]), *right]
    if rule == "set_elements_relation" and len(subs) == 2:
        return [(subs[0], tokens[0] if tokens else ""), (subs[1], "")]
    return None


def _components(node) -> list | None:
    """The components of an answer's tree, each to be a value; ``None``: a relation that states no value."""
    sides = _relation_sides(node)
    if sides is not None:
        # the value a chain states: its last side, and every side before a relation other than "=" (2 < x < 5);
        # a side before "=" is a name or a step of the working (x = 2 + 1 = 3 states 3: math-verify checks that
        # the steps equal it), and a name (x, a_1, f(x)) is never a value
        values = [side for i, (side, relation) in enumerate(sides)
                  if (i == len(sides) - 1 or relation != "=") and not _is_name(side)]
        if not values:
            return None
        out = []
        for side in values:
            parts = _components(side)
            if parts is None:
                return None
            out += parts
        return out
    node_u = _unwrap(node)
    rule = _rule(node_u)
    if rule in _CONTAINERS and rule not in ("math", "set_atom") or rule == "math" and len(_subtrees(node_u)) > 1:
        subs = _subtrees(node_u)
        if not subs:
            return None
        out = []
        for sub in subs:
            parts = _components(sub)
            if parts is None:
                return None
            out += parts
        return out
    return [node_u]


def forms_of(normalized: str, integer: bool = False) -> list | None:
    """The value form of each component of an answer, ``None`` in place of one that is not a value; ``None``
    when the grammar does not read the answer (default-deny)."""
    if _COMMA_NUMERAL_RE.match(normalized):
        text = normalized.strip().replace(",", "")
        return [("decimal" if "." in text else "integer", Fraction(text))]
    tree = _parse_tree(normalized)
    if tree is None:
        return None
    try:
        components = _components(tree)
        return None if components is None else [_form(c, integer) for c in components]
    except RecursionError:  # a tree deeper than the interpreter's stack: not read as a value
        return None


def _parse_tree(normalized: str):
    """The grammar's tree of the whole answer (its one top-level subtree), or ``None`` if it does not parse."""
    try:
        from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy

        tree = _Latex2Sympy().create_parser(normalized).math()
    except Exception:  # noqa: BLE001 - the parser's errors are untyped (RecursionError included): not read
        return None
    subs = _subtrees(tree)
    return subs[0] if len(subs) == 1 else None


def is_name(normalized: str) -> bool:
    """The answer is only a name (``x``, ``a_1``): with ``x \\approx 11``, the value is the decimal."""
    tree = _parse_tree(normalized)
    return tree is not None and _is_name(tree)


def gold_forms(normalized: str) -> frozenset:
    """The value forms the gold is written in (sign aside): an answer in one of them is in final form for
    this gold (:func:`is_final`) and never restates the question (its notation is the gold's)."""
    forms = forms_of(normalized, False) or []
    return frozenset(_key(f) for f in forms if f is not None)


def states_values(normalized: str, gold_kind: str, gold_written: frozenset = frozenset(),
                  question_forms: frozenset = frozenset()) -> bool:
    """Every component of the answer (its LaTeX as math-verify normalizes it) is written as a value in final
    form (:func:`is_final`), where the gold's components are all of kind ``gold_kind`` (``"integer"``, or
    ``"number"``/``"rounded"``, :func:`gold_values`), and none restates the question: is written, in another
    notation than the gold's (``gold_written``, :func:`gold_forms`), as a value of the question's own value forms
    (``question_forms``, :func:`reward_plugins.boxed_math.question.value_forms`) in the same family of
    notations. ``False`` when the grammar does not parse it (default-deny)."""
    forms = forms_of(normalized, gold_kind == "integer")
    if not forms or any(f is None or not is_final(f, gold_written) for f in forms):
        return False
    notations = frozenset(g[0] for g in gold_written)
    values = question_values(question_forms) if question_forms else frozenset()
    return not any(_restates(f, notations, values) for f in forms)
