"""Plain-text helpers shared by the reward plugins (no heavy imports: standard library only).

* :func:`completion_text`: the text of a TRL completion, plain (``str``) or conversational (a list of
  ``{"role", "content"}`` messages, ``content`` a string or a list of ``{"type": "text", "text"}`` parts).
* :func:`find_boxes`: every box (``\\boxed{...}``, ``\\fbox{...}``, ...) of a text, found by brace matching (linear
  time, bounded length); :func:`unwrap_boxes`: the boxes inside a box. This only *locates* answers.
* :func:`answer_part`: what comes after the reasoning (after the last ``</think>``).
* :func:`has_visible`: whether a text holds a letter or a digit (by Unicode general category, an allowlist).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):  # a single content part
        return str(content.get("text") or "") if content.get("type", "text") == "text" else ""
    if isinstance(content, (list, tuple)):
        return "".join(_content_text(part) for part in content)
    return str(content)


def completion_text(completion: Any) -> str:
    """The text of one completion: a string as is; for a conversation, the content of its last assistant
    message (the last message when no role is ``assistant``); never raises on odd input."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        messages = [m for m in completion if isinstance(m, dict) and "role" in m]
        if not messages:  # not a conversation: a list of content parts (or strings)
            return _content_text(list(completion))
        assistant = [m for m in messages if m.get("role") == "assistant"]
        return _content_text((assistant or messages)[-1].get("content"))
    return "" if completion is None else str(completion)


#: What counts as visible is an allowlist: a letter (general category L*) or a number (N*). Punctuation and
#: symbols are left out on purpose: some render blank (U+2800 BRAILLE PATTERN BLANK, So; the musical null
#: notehead U+1D159, So; fonts without the glyph), and no list of the blank ones can be complete, while a
#: reasoning or an answer without a single letter or digit is neither (a lone ``?`` or ``∑`` says nothing).
_VISIBLE_CATEGORIES = frozenset(("L", "N"))
#: The letters that render as nothing: the Default_Ignorable_Code_Point characters of categories L*/N* (the
#: Hangul fillers, all of category Lo; Unicode's DerivedCoreProperties.txt, checked against ``regex``'s
#: ``\p{Default_Ignorable_Code_Point}`` over every code point by tests/reward_plugins/test_think_format_visible.py).
_IGNORABLE_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")


def is_letter_or_digit(c: str) -> bool:
    """``c`` is a letter or a number that is drawn: Unicode general category L* or N*
    (``unicodedata.category``), and not default-ignorable (the Hangul fillers)."""
    return unicodedata.category(c)[0] in _VISIBLE_CATEGORIES and c not in _IGNORABLE_LETTERS


def has_visible(text: str) -> bool:
    """``text`` holds at least one letter or digit (:func:`is_letter_or_digit`): an allowlist, so that
    whitespace, zero-width, format, private-use characters and symbols or punctuation alone (some of which
    render blank) never count."""
    return any(is_letter_or_digit(c) for c in text)


def column(kwargs: dict, names: Sequence[str], n: int) -> list | None:
    """The first dataset column of ``names`` present in the reward-function kwargs (one value per completion)."""
    for name in names:
        values = kwargs.get(name)
        if values is not None:
            values = list(values)
            if len(values) != n:
                raise ValueError(f"column {name!r} has {len(values)} values for {n} completions")
            return values
    return None


def log_counts(kwargs: dict, prefix: str, counts: dict[str, float]) -> None:
    """Report counters through TRL's ``log_metric(name, value)`` kwarg when the trainer provides it."""
    log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
    if not callable(log_metric):
        return
    for key, value in counts.items():
        try:
            log_metric(f"{prefix}/{key}", float(value))
        except Exception:  # metrics must never break a reward
            pass


def answer_part(text: str, close_tag: str = "</think>", open_tag: str = "<think>") -> str | None:
    """The text after the reasoning: after the last ``close_tag`` when present; the whole text when there are
    no think tags at all; ``None`` when reasoning was opened but never closed (no answer was given)."""
    i = text.rfind(close_tag)
    if i >= 0:
        return text[i + len(close_tag) :]
    if open_tag in text:
        return None
    return text


#: Commands that draw a box around their last argument. Every one of them is an answer box: a box hidden in
#: another box, or drawn with a command other than ``\boxed``, is still a box the hedging rule reads.
_BOX_RE = re.compile(r"\\(boxed|fbox|framebox|fcolorbox|colorbox)(?![A-Za-z])")
#: Brace groups before the boxed content: the colours of ``\colorbox{c}{..}`` and ``\fcolorbox{f}{c}{..}``.
_BOX_LEADING_GROUPS = {"colorbox": 1, "fcolorbox": 2}


@dataclass(frozen=True)
class Box:
    content: str | None  # None: malformed (unbalanced braces) or longer than the limit
    reason: str = ""  # why content is None: "unbalanced" | "too_long"
    start: int = 0  # span of the whole box command in the text
    end: int = 0


def _scan_group(text: str, start: int, max_chars: int) -> tuple[str | None, int, str]:
    """``text[start] == "{"``: the group's content and the index after its closing brace."""
    depth = 0
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # an escaped character (\{, \}, \\) never opens or closes a group
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                if i - start - 1 > max_chars:
                    return None, i + 1, "too_long"
                return text[start + 1 : i], i + 1, ""
        i += 1
        if i - start > max_chars + 1:
            return None, n, "too_long"  # stop here: the answer is rejected anyway (linear, bounded work)
    return None, n, "unbalanced"


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\n":
        i += 1
    return i


def _content_start(text: str, i: int, command: str, max_chars: int) -> int | None:
    """Index of the boxed argument of ``command`` (whose name ends at ``i``): past ``\\framebox``'s optional
    ``[..]`` arguments and the colour groups of ``\\colorbox``/``\\fcolorbox``; ``None`` when malformed."""
    i = _skip_spaces(text, i)
    if command == "framebox":
        while i < len(text) and text[i] == "[":
            j = text.find("]", i, i + max_chars)
            if j < 0:
                return None
            i = _skip_spaces(text, j + 1)
    for _ in range(_BOX_LEADING_GROUPS.get(command, 0)):
        if i >= len(text) or text[i] != "{":
            return None
        _, i, reason = _scan_group(text, i, max_chars)
        if reason:
            return None
        i = _skip_spaces(text, i)
    return i


def find_boxes(text: str, max_chars: int = 2000) -> list[Box]:
    """Every top-level box (``\\boxed{..}``, ``\\fbox``, ``\\framebox``, ``\\colorbox``, ``\\fcolorbox``; also
    ``\\boxed 5``) in order, by brace matching.

    Boxes nested in a box are part of the outer box's content (see :func:`unwrap_boxes`). A box longer than
    ``max_chars`` or unbalanced is returned with ``content=None`` and ends the search (at most ``max_chars``
    characters are scanned past a box's opening brace).
    """
    boxes: list[Box] = []
    pos = 0
    while True:
        m = _BOX_RE.search(text, pos)
        if m is None:
            return boxes
        i = _content_start(text, m.end(), m.group(1), max_chars)
        if i is None:
            boxes.append(Box(None, "unbalanced", m.start(), len(text)))
            return boxes
        if i < len(text) and text[i] == "{":
            content, pos, reason = _scan_group(text, i, max_chars)
            boxes.append(Box(content, reason, m.start(), pos))
            if content is None:
                return boxes
        else:  # \boxed 5: one token
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in "$\\":
                j += 1
            token = text[i:j].rstrip(".,;")
            if not token:  # \boxed \frac12, \boxed at the end: a box whose content cannot be told
                boxes.append(Box(None, "unbalanced", m.start(), len(text)))
                return boxes
            boxes.append(Box(token, "", m.start(), j) if len(token) <= max_chars else Box(None, "too_long"))
            pos = max(j, m.end())


def unwrap_boxes(content: str, max_chars: int = 2000) -> tuple[str, list[str]] | None:
    """A box's content with every box inside it (at any depth) replaced by that box's content in braces, and
    the contents of those inner boxes (each unwrapped likewise), outer before inner; ``None`` when a box
    inside is malformed.

    ``\\boxed{\\boxed{3} 4}`` holds two boxes, ``{3} 4`` and ``3``: the hedging rule reads both.
    """
    inner = find_boxes(content, max_chars)
    if any(b.content is None for b in inner):
        return None
    pieces, nested, pos = [], [], 0
    for box in inner:
        unwrapped = unwrap_boxes(box.content, max_chars)
        if unwrapped is None:
            return None
        text, deeper = unwrapped
        pieces += [content[pos : box.start], "{", text, "}"]
        nested += [text, *deeper]
        pos = box.end
    pieces.append(content[pos:])
    return "".join(pieces), nested


_LAYOUT_RE = re.compile(
    r"\\[hv]?phantom\s*\{[^{}]*\}|\\(?:quad|qquad|,|;|:|!| |enspace|thinspace|medspace|thickspace|hfill|displaystyle|textstyle)"
    r"|\\(?:left|right)\.|\$|~|\s"
)


def is_layout(content: str) -> bool:
    """A box that holds no answer: empty, or only spacing / ``\\phantom{...}``."""
    return _LAYOUT_RE.sub("", content).strip("{}") == ""


_ANSWER_LINE_RE = re.compile(
    r"^\W*(?:so\s+|thus\s+|therefore\s*,?\s+|hence\s+)?(?:the\s+)?(?:final\s+)?answer\s*(?:is)?\s*[:：]?\s*(.+?)\s*$",
    re.IGNORECASE,
)


# the same as the last sentence of a line whose newlines were lost ("... milk.The answer is: 1250"); colon required
_ANSWER_SENTENCE_RE = re.compile(r"[.!?]\s*(?:the\s+)?(?:final\s+)?answer\s+is\s*:\s*([^:]+?)\s*$", re.IGNORECASE)


def answer_line(text: str, max_chars: int = 2000) -> str | None:
    """The answer of a final ``The answer is: X`` / ``Final answer: X`` line (the last non-empty line), or of
    a last sentence ``. The answer is: X`` ending that line."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    m = _ANSWER_LINE_RE.match(lines[-1].strip()) or _ANSWER_SENTENCE_RE.search(lines[-1])
    if m is None:
        return None
    answer = m.group(1).strip()
    answer = re.sub(r"^\*+|\*+$", "", answer).strip()
    answer = answer.rstrip(".").strip().strip("$").strip().rstrip(".").strip()
    if answer.startswith("\\(") and answer.endswith("\\)") or answer.startswith("\\[") and answer.endswith("\\]"):
        answer = answer[2:-2].strip()
    if not answer or len(answer) > max_chars:
        return None
    return answer
