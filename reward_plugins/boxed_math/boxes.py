"""Where a completion's answers are: boxes found by brace matching, the answer line (standard library only).

* :func:`find_boxes`: every box (``\\boxed{...}``, ``\\fbox{...}``, ...) of a text, found by brace matching (linear
  time, bounded length); :func:`unwrap_boxes`: the boxes inside a box. This only *locates* answers.
* :func:`is_layout`, :func:`answer_line`: layout-only boxes, and a plain "Answer: ..." line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Commands that draw a box around their last argument. Every one of them is an answer box: a box hidden in
#: another box, or drawn with a command other than ``\boxed``, is still a box the hedging rule reads.
_BOX_RE = re.compile(r"\\(boxed|fbox|framebox|fcolorbox|colorbox)(?![A-Za-z])")
#: Brace groups before the boxed content: the colors of ``\colorbox{c}{..}`` and ``\fcolorbox{f}{c}{..}``.
_BOX_LEADING_GROUPS = {"colorbox": 1, "fcolorbox": 2}


@dataclass(frozen=True)
class Box:
    content: str | None  # None: malformed (unbalanced braces) or longer than the limit
    reason: str = ""  # why content is None: "unbalanced" | "too_long"
    start: int = 0  # span of the whole box command in the text
    end: int = 0


def scan_group(text: str, start: int, max_chars: int) -> tuple[str | None, int, str]:
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
    ``[..]`` arguments and the color groups of ``\\colorbox``/``\\fcolorbox``; ``None`` when malformed."""
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
        _, i, reason = scan_group(text, i, max_chars)
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
            content, pos, reason = scan_group(text, i, max_chars)
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
