"""Plain-text helpers shared by the reward plugins (no heavy imports: standard library only).

* :func:`completion_text`: the text of a TRL completion, plain (``str``) or conversational (a list of
  ``{"role", "content"}`` messages, ``content`` a string or a list of ``{"type": "text", "text"}`` parts).
* :func:`find_boxes`: every ``\\boxed{...}`` / ``\\fbox{...}`` of a text, found by brace matching (linear time,
  bounded length). This only *locates* answers; the mathematics is left to math-verify.
* :func:`answer_part`: what comes after the reasoning (after the last ``</think>``).
"""

from __future__ import annotations

import re
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


_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


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


def find_boxes(text: str, max_chars: int = 2000) -> list[Box]:
    """Every top-level ``\\boxed{..}`` / ``\\fbox{..}`` (also ``\\boxed 5``) in order, by brace matching.

    Boxes nested in a box are part of the outer box's content. A box longer than ``max_chars`` or unbalanced
    is returned with ``content=None`` and ends the search (at most ``max_chars`` characters are scanned past
    a box's opening brace).
    """
    boxes: list[Box] = []
    pos = 0
    while True:
        m = _BOX_RE.search(text, pos)
        if m is None:
            return boxes
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            content, pos, reason = _scan_group(text, i, max_chars)
            boxes.append(Box(content, reason, m.start(), pos))
            if content is None:
                return boxes
        else:  # \boxed 5: one token
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in "$\\":
                j += 1
            if j > i:
                token = text[i:j].rstrip(".,;")
                boxes.append(Box(token, "", m.start(), j) if len(token) <= max_chars else Box(None, "too_long"))
            pos = max(j, m.end())


_LAYOUT_RE = re.compile(
    r"\\[hv]?phantom\s*\{[^{}]*\}|\\(?:quad|qquad|,|;|:|!| |enspace|thinspace|medspace|thickspace|hfill|displaystyle|textstyle)"
    r"|\\(?:left|right)\.|\$|~|\s"
)


def is_layout(content: str) -> bool:
    """A box that holds no answer: empty, or only spacing / ``\\phantom{...}``."""
    return _LAYOUT_RE.sub("", content).strip("{}") == ""


def normalize_candidate(content: str) -> str:
    """A cheap normal form used only to de-duplicate boxes (equivalence is math-verify's job)."""
    s = re.sub(r"\s+", "", content)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\left", "").replace("\\right", "")
    return s.rstrip(".,;")


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
