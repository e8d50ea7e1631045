"""Plain-text helpers shared by the reward plugins (no heavy imports: standard library only).

* :func:`completion_text`: the text of a TRL completion, plain (``str``) or conversational (a list of
  ``{"role", "content"}`` messages, ``content`` a string or a list of ``{"type": "text", "text"}`` parts).
* :func:`answer_part`: what comes after the reasoning (after the last ``</think>``).
* :func:`has_visible`: whether a text holds a visible character (by Unicode general category).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from typing import Any


def content_text(content: Any) -> str:
    """The text of a message's ``content``: a string as is, a text part's text, the parts of a list joined; other
    parts (images) give ``""``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):  # a single content part
        return str(content.get("text") or "") if content.get("type", "text") == "text" else ""
    if isinstance(content, (list, tuple)):
        return "".join(content_text(part) for part in content)
    return str(content)


def completion_text(completion: Any) -> str:
    """The text of one completion: a string as is; for a conversation, the content of its last assistant
    message (the last message when no role is ``assistant``); never raises on odd input."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return content_text(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        messages = [m for m in completion if isinstance(m, dict) and "role" in m]
        if not messages:  # not a conversation: a list of content parts (or strings)
            return content_text(list(completion))
        assistant = [m for m in messages if m.get("role") == "assistant"]
        return content_text((assistant or messages)[-1].get("content"))
    return "" if completion is None else str(completion)


#: General categories whose characters are seen on their own: letters, numbers, punctuation, symbols. Marks
#: (M*) only modify a neighbour; separators (Z*), controls, format characters (Cf: zero-width space and
#: joiners, direction marks, ...), surrogates, private-use and unassigned code points (C*) show nothing.
_VISIBLE_CATEGORIES = frozenset(("L", "N", "P", "S"))
#: Characters of those categories that render as blank: the Default_Ignorable_Code_Point characters of
#: category Lo (the Hangul fillers; Unicode's DerivedCoreProperties.txt) and U+2800 BRAILLE PATTERN BLANK.
_BLANK_GRAPHICS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def is_visible_char(c: str) -> bool:
    """``c`` is drawn as something seen: its Unicode general category is a letter, number, punctuation or
    symbol (``unicodedata.category``), and it is not one of the blank-rendering exceptions above."""
    return unicodedata.category(c)[0] in _VISIBLE_CATEGORIES and c not in _BLANK_GRAPHICS


def has_visible(text: str) -> bool:
    """``text`` holds at least one visible character (:func:`is_visible_char`); whitespace, zero-width and
    other invisible characters alone do not count."""
    return any(is_visible_char(c) for c in text)


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


def check_tag_name(plugin: str, option: str, tag) -> None:
    """Raise ValueError naming ``plugin`` and ``option`` unless ``tag`` is a bare tag name (``"think"``, not
    ``"<think>"``): what every plugin's ``think_tag`` (and ``answer_tag``) means."""
    if not isinstance(tag, str) or not tag or any(c in tag for c in "<>/ "):
        raise ValueError(f"{plugin}: {option} must be a bare tag name like 'think', got {tag!r}")
