"""What the question writes, read on its text (standard library only; runs in the reward's own process).

Two facts about a problem decide how its answer is judged (:mod:`reward_plugins.boxed_math.value_form`,
:mod:`reward_plugins.boxed_math.math_check`):

* the **value forms it writes** (:func:`value_forms`): its fractions (``\\frac{3}{8}``, ``3/8``, ``7 \\div 2``),
  mixed numbers (``3\\frac{1}{2}``, ``3 + \\frac{1}{2}``), decimals, percentages and numbers in scientific
  notation, each as ``(kind, terms)`` with exact :class:`~fractions.Fraction` terms. An answer that writes the
  value of one of them in the same family of notations (fraction and mixed number; decimal, percentage and
  scientific notation), in another notation than the gold's, restates the question ("Convert 3/8 to a decimal":
  ``\\frac{3}{8}``; "Write 0.375 as a fraction": ``37.5\\%``) rather than answering it
  (:func:`reward_plugins.boxed_math.value_form.question_values`);
* the **precision it asks for** (:func:`stated_precision`): "to the nearest tenth", "to 2 decimal places",
  "to 3 significant figures", "nearest cent", ... Only then does an exact gold take a rounded decimal: the gold
  rounded to that precision.

The prompt is the dataset's, not the policy's, but it is still read with bounded cost: at most
:data:`MAX_QUESTION_CHARS` characters and :data:`MAX_FORMS` forms, by regular expressions without nested
repetition (linear time).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction

#: Characters of a prompt read (from its end: the question closes a few-shot prompt).
MAX_QUESTION_CHARS = 20_000
#: Value forms kept per question.
MAX_FORMS = 512

_NUM = r"(\d+(?:\.\d+)?|\.\d+)"
_BRACED_OR_DIGIT = r"(?:\{\s*" + _NUM + r"\s*\}|(\d))"
_FRAC_RE = re.compile(r"\\[dtc]?frac\s*" + _BRACED_OR_DIGIT + r"\s*" + _BRACED_OR_DIGIT)
_SLASH_RE = re.compile(r"(?<!\d)(?<!\d\.)" + _NUM + r"\s*(?:/|\\div(?![A-Za-z])|÷)\s*" + _NUM + r"(?!\.?\d)")
_MIXED_RE = re.compile(r"(?<!\d)(?<!\d\.)(\d+)(?:\s*(?:\+\s*)?\\[dtc]?frac\s*" + _BRACED_OR_DIGIT + r"\s*" + _BRACED_OR_DIGIT
                       + r"|(?:\s+|\s*\+\s*)(\d+)\s*/\s*(\d+)(?!\.?\d))")
_SCIENTIFIC_RE = re.compile(_NUM + r"\s*(?:\\times|\\cdot|×|x|\*)\s*10\s*\^\s*\{?\s*([-−]?\s*\d+)\s*\}?")
_PERCENT_RE = re.compile(_NUM + r"\s*(?:\\%|%|\s*percent\b)")
_DECIMAL_RE = re.compile(r"(?<!\d)(?<!\d\.)(\d*\.\d+)(?!\.?\d)")
_SPACE_RE = re.compile(r"\s+")

_PLACES = {"whole number": 0, "integer": 0, "one": 0, "unit": 0, "dollar": 0, "ten": -1, "hundred": -2, "thousand": -3,
           "tenth": 1, "hundredth": 2, "cent": 2, "penny": 2, "thousandth": 3, "ten-thousandth": 4,
           "ten thousandth": 4, "hundred-thousandth": 5, "hundred thousandth": 5, "millionth": 6}
_WORD_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
                 "ten": 10}
_NEAREST_RE = re.compile(r"\bnearest\s+(" + "|".join(sorted(map(re.escape, _PLACES), key=len, reverse=True))
                         + r")s?\b")
_COUNT = r"(\d+|" + "|".join(_WORD_NUMBERS) + r")"
_DECIMAL_PLACES_RE = re.compile(r"\b" + _COUNT + r"\s+(?:decimal\s+(?:places?|digits?)|places?\s+after\s+the\s+"
                                r"decimal(?:\s+point)?|d\.\s?p\.)")
_SIGNIFICANT_RE = re.compile(r"\b" + _COUNT + r"\s+significant\s+(?:figures?|digits?)|\b" + _COUNT + r"\s+sig\.?\s+figs?")


@dataclass(frozen=True)
class Question:
    """What the judging needs to know about the problem: the value forms it writes and the precision it asks
    for (``("decimals", n)`` or ``("significant", n)``, else ``None``). ``Question()`` is a problem not given."""

    forms: frozenset = field(default_factory=frozenset)
    precision: tuple | None = None


def _number(text: str) -> Fraction:
    return Fraction(text)


def _term(braced: str | None, digit: str | None) -> Fraction:
    return _number(braced if braced is not None else digit)


def value_forms(text: str) -> frozenset:
    """The value forms ``text`` writes: ``("fraction", n, d)``, ``("mixed", w, n, d)``, ``("decimal", v)``,
    ``("percent", v)``, ``("scientific", m, k)``, terms as exact fractions (``0.375`` and ``.375`` are one)."""
    text = text[-MAX_QUESTION_CHARS:].replace("−", "-")
    forms: set[tuple] = set()
    for m in _FRAC_RE.finditer(text):
        forms.add(("fraction", _term(m.group(1), m.group(2)), _term(m.group(3), m.group(4))))
    for m in _SLASH_RE.finditer(text):
        forms.add(("fraction", _number(m.group(1)), _number(m.group(2))))
    for m in _MIXED_RE.finditer(text):
        if m.group(2) is not None or m.group(3) is not None:
            n, d = _term(m.group(2), m.group(3)), _term(m.group(4), m.group(5))
        else:
            n, d = _number(m.group(6)), _number(m.group(7))
        forms.add(("mixed", _number(m.group(1)), n, d))
    for m in _SCIENTIFIC_RE.finditer(text):
        forms.add(("scientific", _number(m.group(1)), Fraction(int(_SPACE_RE.sub("", m.group(2))))))
    for m in _PERCENT_RE.finditer(text):
        forms.add(("percent", _number(m.group(1))))
    for m in _DECIMAL_RE.finditer(text):
        forms.add(("decimal", _number(m.group(1))))
    return frozenset(sorted(forms, key=repr)[:MAX_FORMS])


def _count(word: str) -> int:
    return int(word) if word.isdigit() else _WORD_NUMBERS[word]


def stated_precision(text: str) -> tuple | None:
    """The rounding the problem asks for: ``("decimals", n)`` (n may be negative: to the nearest hundred) or
    ``("significant", n)``; ``None`` when it asks for none (or for two different ones: then none is taken)."""
    text = _SPACE_RE.sub(" ", text[-MAX_QUESTION_CHARS:].lower())
    found = set()
    for m in _NEAREST_RE.finditer(text):
        found.add(("decimals", _PLACES[m.group(1)]))
    for m in _DECIMAL_PLACES_RE.finditer(text):
        found.add(("decimals", _count(m.group(1))))
    for m in _SIGNIFICANT_RE.finditer(text):
        found.add(("significant", _count(m.group(1) or m.group(2))))
    return found.pop() if len(found) == 1 else None


def prompt_text(prompt) -> str:
    """The question of a TRL prompt: a string, or the user turns of a conversation (a list of messages)."""
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict):
        prompt = [prompt]
    parts = []
    for message in prompt if isinstance(prompt, (list, tuple)) else ():
        if isinstance(message, dict) and message.get("role", "user") == "user":
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):  # multimodal content blocks: their text
                parts += [b.get("text", "") for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return "\n".join(parts)


def read_question(prompt) -> Question:
    """:class:`Question` of a TRL prompt (``None``: no question, ``Question()``)."""
    text = prompt_text(prompt)
    if not text:
        return Question()
    return Question(value_forms(text), stated_precision(text))
