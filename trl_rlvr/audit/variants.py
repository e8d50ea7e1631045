"""Metamorphic variants of a corpus case, drawn per run from a seed: the same case written another way.

A reward that memorised the shipped corpus (or keys on its exact texts) meets, in every run, texts it has not
seen: each case is also sent as a few variants, drawn with the run's seed, and each variant keeps the case's
label by construction (a transform changes how something is written, never what it says):

* ``math_answer`` (inside the boxes): an operand in parentheses or braces (``72468 * (55)``, ``{2}^{10}``),
  spacing around operators and inside the box, LaTeX spellings (``\\frac``/``\\dfrac``/``\\tfrac``,
  ``\\cdot``/``\\times``, ``\\le``/``\\leq``, ``\\boxed {``), the operands of a sum or product of two numerals
  swapped where nothing binds tighter around them (``12 + 7`` as ``7 + 12``); outside them, prose with
  confusable letters (Cyrillic ``а``, ``е``, ``о`` for Latin ones) and a sentence put before the completion;
* ``format``: trailing whitespace, letters outside the tags replaced by confusable letters of
  another script and digits by digits of another script (still letters and digits);
* ``code``: a sentence before the code block, blank lines after it.

A completion longer than :data:`MAX_REWRITTEN_CHARS` is only changed at its edges.

A variant that would be the same text as the case (no transform applies) is not sent.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import replace

from trl_rlvr.audit.cases import Case

#: Latin letters and Cyrillic (or Greek) letters drawn alike; digits and Arabic-Indic digits.
CONFUSABLE_LETTERS = dict(zip("aceopxyiABCEHKMOPTX", "асеорхуіАВСЕНКМОРТХ"))
OTHER_DIGITS = {str(d): chr(0x0660 + d) for d in range(10)}
_PROSE = ("Let me write the answer.", "Here is my answer.", "I will check it once more.", "So, to sum up:")
_CODE_PROSE = ("Here is the solution.", "The function below solves it.", "Solution:")
_BOX_RE = re.compile(r"\\boxed(?![A-Za-z])\s*\{")
_NUMERAL_OPERAND_RE = re.compile(r"(?<![\w.\\^_{])(\d++)(?![\w.!])")  # possessive: linear on long numerals
#: Binary operations whose operands may be bracketed. Not ``=`` nor another relation: a side that is a bare ``{3}`` reads
#: as a set to the parser, so bracketing it changes the answer rather than spelling it otherwise.
_OPERATORS = ("+", "*", "\\times", "\\cdot", "^", "-")


def _boxes(text: str) -> list[tuple[int, int]]:
    """(start, end) of each top-level ``\\boxed{..}``'s content, by brace matching."""
    spans, pos = [], 0
    while True:
        m = _BOX_RE.search(text, pos)
        if m is None:
            return spans
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "\\":
                i += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:
            return spans
        spans.append((m.end(), i - 1))
        pos = i


def _in_boxes(text: str, rng: random.Random, change: Callable[[str, random.Random], str | None]) -> str | None:
    """``text`` with ``change`` applied to the content of one box drawn at random (``None``: it changes none)."""
    spans = _boxes(text)
    rng.shuffle(spans)
    for start, end in spans:
        new = change(text[start:end], rng)
        if new is not None and new != text[start:end]:
            return text[:start] + new + text[end:]
    return None


def _neighbour(s: str, i: int, step: int) -> str:
    """The first non-space character from ``i`` in direction ``step`` ("" at either end)."""
    while 0 <= i < len(s) and s[i].isspace():
        i += step
    return s[i] if 0 <= i < len(s) else ""


def _operator_at(s: str, i: int) -> bool:
    return any(s.startswith(op, i) for op in _OPERATORS)


def _operator_before(s: str, i: int) -> bool:
    j = i - 1
    while j >= 0 and s[j].isspace():
        j -= 1
    window = s[max(0, j - 7): j + 1]  # the longest operator is 6 characters: linear in the text
    return j >= 0 and any(window.endswith(op) for op in _OPERATORS)


def _bracket_operand(content: str, rng: random.Random) -> str | None:
    """A numeral beside a binary operator put in ``(..)`` or ``{..}`` (the same value, the same operation)."""
    found = []
    for m in _NUMERAL_OPERAND_RE.finditer(content):
        j = m.end()
        while j < len(content) and content[j].isspace():
            j += 1
        if _operator_before(content, m.start()) or _operator_at(content, j):
            found.append(m)
    if not found:
        return None
    m = rng.choice(found)
    left, right = rng.choice([("(", ")"), ("{", "}")])
    return content[: m.start()] + left + m.group(1) + right + content[m.end():]


def _spacing(content: str, rng: random.Random) -> str | None:
    spaced = re.sub(r"\s*(\+|=|\\times(?![A-Za-z])|\\cdot(?![A-Za-z]))\s*",
                    lambda m: rng.choice(["", " ", "  "]) + m.group(1) + rng.choice([" ", "  "]), content)
    return rng.choice(["", " "]) + spaced + rng.choice(["", " "])


_SPELLINGS = [
    (r"\\frac(?![A-Za-z])", ["\\dfrac", "\\tfrac"]), (r"\\dfrac(?![A-Za-z])", ["\\frac"]),
    (r"\\tfrac(?![A-Za-z])", ["\\frac", "\\dfrac"]), (r"\\cdot(?![A-Za-z])", ["\\times"]),
    (r"\\times(?![A-Za-z])", ["\\cdot"]), (r"\\le(?![A-Za-z])", ["\\leq"]), (r"\\ge(?![A-Za-z])", ["\\geq"]),
    (r"\\leq(?![A-Za-z])", ["\\le"]), (r"\\geq(?![A-Za-z])", ["\\ge"]),
]


def _latex_spelling(content: str, rng: random.Random) -> str | None:
    options = [(p, alts) for p, alts in _SPELLINGS if re.search(p, content)]
    if not options:
        return None
    pattern, alternatives = rng.choice(options)
    return re.sub(pattern, lambda m: rng.choice(alternatives), content)


def _commute(content: str, rng: random.Random) -> str | None:
    """``a + b`` or ``a \\times b`` of two numerals as ``b + a``, where nothing binds tighter around them."""
    pattern = re.compile(r"(?<!\d)(\d++)(\s*+)(\+|\*|\\times(?![A-Za-z])|\\cdot(?![A-Za-z]))(\s*+)(\d++)")
    spots = []
    for m in pattern.finditer(content):
        before = _neighbour(content, m.start() - 1, -1)
        after = _neighbour(content, m.end(), 1)
        if before in ("", "(", "{", "=", ",") and after in ("", ")", "}", "=", ",") \
                and (m.start() == 0 or not (content[m.start() - 1].isdigit() or content[m.start() - 1] == ".")) \
                and (m.end() == len(content) or not (content[m.end()].isdigit() or content[m.end()] == ".")):
            spots.append(m)
    if not spots:
        return None
    m = rng.choice(spots)
    swapped = m.group(5) + m.group(2) + m.group(3) + m.group(4) + m.group(1)
    return content[: m.start()] + swapped + content[m.end():]


def _mask(text: str, spans) -> bytearray:
    """1 at every position inside one of ``spans`` (linear in the text and the spans' lengths)."""
    mask = bytearray(len(text) + 1)
    for start, end in spans:
        mask[max(0, start):max(0, end)] = b"\x01" * (max(0, end) - max(0, start))
    return mask


def _confusable_prose(text: str, rng: random.Random) -> str | None:
    """Latin letters of the prose (outside boxes, ``$..$``, commands and ``<..>`` tags) as confusable ones."""
    spans = [(s - 8, e + 1) for s, e in _boxes(text)]
    spans += [m.span() for m in re.finditer(r"\$[^$]*\$|\\[A-Za-z]+|<[^<>]*>|\\\(.*?\\\)", text, re.DOTALL)]
    protected = _mask(text, spans)
    chars = list(text)
    changed = False
    for i, c in enumerate(chars):
        if c in CONFUSABLE_LETTERS and not protected[i] and rng.random() < 0.5:
            chars[i] = CONFUSABLE_LETTERS[c]
            changed = True
    return "".join(chars) if changed else None


def _prose_before(text: str, rng: random.Random) -> str | None:
    sentence = rng.choice(_PROSE)
    return (_confusable_prose(sentence, rng) or sentence) + rng.choice([" ", "\n", "\n\n"]) + text


def _math(text: str, rng: random.Random) -> list[tuple[str, Callable[[str, random.Random], str | None]]]:
    return [
        ("bracket_operand", lambda t, r: _in_boxes(t, r, _bracket_operand)),
        ("spacing", lambda t, r: _in_boxes(t, r, _spacing)),
        ("latex_spelling", lambda t, r: _in_boxes(t, r, _latex_spelling)),
        ("commute", lambda t, r: _in_boxes(t, r, _commute)),
        ("confusable_prose", _confusable_prose),
        ("prose_before", _prose_before),
    ]


def _format_confusables(text: str, rng: random.Random) -> str | None:
    """Letters and digits outside the tags as letters and digits of other scripts (still letters, digits)."""
    tags = _mask(text, [m.span() for m in re.finditer(r"<[^<>]*>?", text)])
    chars, changed = list(text), False
    for i, c in enumerate(chars):
        table = CONFUSABLE_LETTERS if c in CONFUSABLE_LETTERS else OTHER_DIGITS if c in OTHER_DIGITS else None
        if table and not tags[i] and rng.random() < 0.5:
            chars[i], changed = table[c], True
    return "".join(chars) if changed else None


def _format(text: str, rng: random.Random):
    return [
        # after the text only: whether whitespace may come before <think> is a choice of the format (TRL's
        # think_format_reward says no), not something every format reward must accept
        ("spacing", lambda t, r: t + r.choice(["\n", " ", "\n\n", " \n"])),
        ("confusables", _format_confusables),
    ]


def _code(text: str, rng: random.Random):
    def prose(t, r):
        if not t.lstrip().startswith("```"):
            return None
        sentence = r.choice(_CODE_PROSE)
        return (_confusable_prose(sentence, r) or sentence) + "\n\n" + t

    return [("prose_before", prose), ("blank_lines_after", lambda t, r: t + r.choice(["\n", "\n\n", "\n\n\n"]))]


TRANSFORMS = {"math_answer": _math, "format": _format, "code": _code}
#: Past this length (the cost cases: megabytes of digits, thousands of boxes) only the transforms at the edges of
#: the text apply (a sentence before it, whitespace around it): the others would cost seconds per variant.
MAX_REWRITTEN_CHARS = 20_000
_EDGE_TRANSFORMS = {"prose_before", "spacing", "blank_lines_after"}


def variants(case: Case, kind: str | None, rng: random.Random, n: int) -> list[Case]:
    """Up to ``n`` distinct variants of ``case`` for a reward of ``kind`` (none for an unknown kind), each made
    by one or two transforms drawn from ``rng``; ids ``<id>~v<k>``, the transforms named in ``note``."""
    if kind not in TRANSFORMS or n <= 0:
        return []
    transforms = TRANSFORMS[kind](case.completion, rng)
    if len(case.completion) > MAX_REWRITTEN_CHARS:
        transforms = [(name, t) for name, t in transforms if name in _EDGE_TRANSFORMS and not (
            kind == "math_answer" and name == "spacing")]
    out, seen = [], {case.completion}
    for _attempt in range(4 * n):
        if len(out) == n:
            break
        chosen = rng.sample(transforms, k=min(len(transforms), rng.choice([1, 1, 2])))
        text, names = case.completion, []
        for name, transform in chosen:
            try:
                new = transform(text, rng)
            except Exception:  # noqa: BLE001 - a transform that does not apply to this text
                new = None
            if new is not None and new != text:
                text, names = new, [*names, name]
        if text in seen:
            continue
        seen.add(text)
        out.append(replace(case, id=f"{case.id}~v{len(out) + 1}", completion=text,
                           note=f"variant of {case.id} ({', '.join(names)})"))
    return out
