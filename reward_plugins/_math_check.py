"""The math-verify side of ``boxed_math``: runs inside the worker processes of :mod:`reward_plugins._pool`.

Importing this module is cheap; math-verify (and sympy) are imported on first use, which in the workers
happens once, in the fork server (see ``boxed_math``), before the workers are forked.

Timeouts are not math-verify's job here (its SIGALRM timeouts are disabled): the pool kills a worker that
overruns its deadline, which works whatever thread the reward function is called from.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict

from reward_plugins._text import find_boxes, normalize_candidate

_SEPARATOR_RE = re.compile(r"(?:\s|\$|,|;|\\[,;!]|\\q?quad|\\text\{\s*(?:and|,)?\s*\}|\\[()\[\]]|and|&|\\\\)*")
_GOLD_CACHE: OrderedDict[str, list] = OrderedDict()
_GOLD_CACHE_SIZE = 4096
_mv = None


def _math_verify():
    global _mv
    if _mv is None:
        import math_verify
        from math_verify import LatexExtractionConfig

        for name in ("math_verify", "math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).setLevel(logging.CRITICAL)  # "timeout disabled" warnings: intended
        # one config for gold and answer (NormalizationConfig(units=True), as TRL uses, breaks "\\frac12")
        config = [LatexExtractionConfig(boxed_match_priority=0)]
        _mv = (math_verify, config, config)
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


def _parse_pred(candidate: str) -> list:
    mv, _, pred_config = _math_verify()
    return mv.parse("\\boxed{" + candidate + "}", extraction_config=pred_config, parsing_timeout=None)


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


def check(task: tuple[str, tuple[str, ...]]) -> str:
    """Grade one answer. ``task = (gold, candidates)``: ``candidates[-1]`` is the final answer, the others are
    the answer's other distinct boxes. Returns ``"correct"``, ``"wrong"``, ``"hedged"`` (the final answer is
    right but another box holds a different answer), ``"unparsed"`` or ``"bad_gold"``."""
    gold, candidates = task
    mv = _math_verify()[0]
    gold_parsed = parse_gold(gold)
    if not gold_parsed:
        return "bad_gold"
    gold_key = normalize_candidate(gold_answer(gold))

    def same(candidate: str, parsed) -> bool:  # identical text is equal: no sympy needed (fast path)
        if normalize_candidate(candidate) == gold_key:
            return True
        if not parsed or _surely_different(gold_parsed, parsed):
            return False
        return bool(mv.verify(gold_parsed, parsed, timeout_seconds=None))

    final_text = candidates[-1]
    final = None if normalize_candidate(final_text) == gold_key else _parse_pred(final_text)
    status = "unparsed" if final is not None and not final else "wrong"
    if same(final_text, final):
        status = "correct"
        for other in candidates[:-1]:
            if normalize_candidate(other) == gold_key:
                continue
            parsed = _parse_pred(other)
            if not same(other, parsed):
                status = "hedged"
                break
    if status != "correct" and len(candidates) > 1:
        # A multi-part answer boxed part by part (\boxed{1} and \boxed{2} for the gold {1, 2}): the boxes
        # together must equal the gold exactly, so this never rewards a list that merely contains it.
        joint = _parse_pred(", ".join(candidates))
        if joint and mv.verify(gold_parsed, joint, timeout_seconds=None):
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
