"""Plain-text helpers shared by the reward plugins (no heavy imports: standard library only).

* :func:`completion_text`: the text of a TRL completion, plain (``str``) or conversational (a list of
  ``{"role", "content"}`` messages, ``content`` a string or a list of ``{"type": "text", "text"}`` parts).
* :func:`answer_part`: what comes after the reasoning (after the last ``</think>``).
* :func:`has_visible`: whether a text holds a letter or a digit (by Unicode general category, an allowlist).
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


def check_tag_name(plugin: str, option: str, tag) -> None:
    """Raise ValueError naming ``plugin`` and ``option`` unless ``tag`` is a bare tag name (``"think"``, not
    ``"<think>"``): what every plugin's ``think_tag`` (and ``answer_tag``) means."""
    if not isinstance(tag, str) or not tag or any(c in tag for c in "<>/ "):
        raise ValueError(f"{plugin}: {option} must be a bare tag name like 'think', got {tag!r}")
