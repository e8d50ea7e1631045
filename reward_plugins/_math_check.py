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
        return normalize_candidate(candidate) == gold_key or bool(
            parsed and mv.verify(gold_parsed, parsed, timeout_seconds=None)
        )

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


def warm() -> None:
    """Import math-verify and sympy and run one check, so that forked workers start hot."""
    check(("\\frac{1}{2}", ("0.5",)))
    _GOLD_CACHE.clear()
