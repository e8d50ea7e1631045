"""``think_format``: the DeepSeek-R1-Zero output format, 1.0 or 0.0.

The completion must start (after leading whitespace) with exactly one ``<think>...</think>`` block holding
visible reasoning, followed by a visible answer. "Visible" is an allowlist
(:func:`reward_plugins._text.has_visible`): at least one letter or digit (Unicode general category L* or N*,
the default-ignorable Hangul fillers excepted). Spaces, zero-width and other format characters, combining
marks, private-use and unassigned code points, and punctuation or symbols alone do not count: some symbols
render blank (U+2800 BRAILLE PATTERN BLANK, category So), a list of the blank ones cannot be complete, and a
reasoning or an answer with no letter and no digit says nothing. Any other think tag, whole or
dangling (``<think>``, ``</think>``, ``<think``, ``</think``, ``< think >``, in any letter case), anywhere in the reasoning or the answer, an unclosed block,
empty or invisible reasoning, or an empty or invisible answer scores 0. With ``answer_tag`` (e.g.
``"answer"``, as in open-r1), the answer must be exactly one ``<answer>...</answer>`` block with visible
content, no other answer tag (whole or dangling) in it, and nothing but whitespace around it. When the assistant
turn is pre-filled with ``<think>`` (as DeepSeek-R1 does), set ``prefilled=True``: the completion then
starts inside the reasoning and must not open it again.

Combining with ``boxed_math``: use both, ``reward_funcs=["think_format", "boxed_math"]`` (TRL sums them,
weighted by ``reward_weights``). ``think_format`` rewards only the shape; ``boxed_math`` reads only the answer
part after ``</think>``, so the box written while thinking never counts, and a well-formed answer without
the right box scores 1 + 0. Keep the same tag name in both (``think_tag``).
"""

from __future__ import annotations

import re

from reward_plugins._text import check_tag_name, completion_text, has_visible


def _tag_pattern(tag: str) -> re.Pattern:
    """Any opening or closing ``tag``, also dangling or spaced: ``<tag>``, ``</tag>``, ``<tag``, ``< / TAG``
    (not a longer tag name such as ``<thinking>``)."""
    return re.compile(r"<\s*/?\s*" + re.escape(tag) + r"(?![\w-])", re.IGNORECASE)


class ThinkFormatReward:
    """The reward function built by :func:`think_format`.

    A callable class rather than a closure, as TRL's ``get_soft_overlong_punishment``: it must pickle (TRL's async
    rollout worker and ``datasets.map`` ship reward functions to other processes), and its options stay readable
    (``think_tag``, ``prefilled``). The options and their defaults are the factory's.
    """

    reward_kind = "format"  # the corpus `trl-rlvr rewards audit` runs (docs/auditing_rewards.md)
    __name__ = "think_format"  # TRL logs rewards/think_format/mean

    def __init__(self, *, think_tag: str, answer_tag: str | None, prefilled: bool):
        check_tag_name("think_format", "think_tag", think_tag)
        if answer_tag is not None:
            check_tag_name("think_format", "answer_tag", answer_tag)
        self.think_tag = think_tag
        self.answer_tag = answer_tag
        self.prefilled = bool(prefilled)
        self._think_re = _tag_pattern(think_tag)
        self._answer_re = _tag_pattern(answer_tag) if answer_tag else None

    def __repr__(self) -> str:
        return f"think_format(think_tag={self.think_tag!r}, answer_tag={self.answer_tag!r}, prefilled={self.prefilled})"

    def score(self, text: str) -> float:
        open_t, close_t = f"<{self.think_tag}>", f"</{self.think_tag}>"
        body = text if self.prefilled else text.lstrip()
        if not self.prefilled:
            if not body.startswith(open_t):
                return 0.0
            body = body[len(open_t) :]
        reasoning, closed, answer = body.partition(close_t)
        if not closed or self._think_re.search(reasoning) or self._think_re.search(answer):
            return 0.0  # unclosed, or a second think tag (whole or dangling) somewhere
        if not has_visible(reasoning):
            return 0.0
        if not self.answer_tag:
            return 1.0 if has_visible(answer) else 0.0
        a_open, a_close = f"<{self.answer_tag}>", f"</{self.answer_tag}>"
        answer = answer.strip()
        if not answer.startswith(a_open) or not answer.endswith(a_close):
            return 0.0
        inner = answer[len(a_open) : -len(a_close)]
        if self._answer_re.search(inner) or not has_visible(inner):
            return 0.0
        return 1.0

    def __call__(self, prompts=None, completions=None, **kwargs) -> list[float]:
        if completions is None:
            raise TypeError("think_format: called without completions")
        out = []
        for c in completions:
            try:
                out.append(self.score(completion_text(c)))
            except Exception:  # noqa: BLE001 - odd input scores 0
                out.append(0.0)
        return out


def think_format(*, think_tag: str = "think", answer_tag: str | None = None, prefilled: bool = False) -> ThinkFormatReward:
    """R1-Zero format: exactly one <think>...</think> block of visible reasoning first, then a visible answer (1.0 or 0.0).

    Args:
        think_tag: name of the reasoning tag (``<think>``); the answer is what follows ``</think_tag>``.
        answer_tag: if set (e.g. ``"answer"``), the answer must be one ``<answer>...</answer>`` block.
        prefilled: the prompt already ends with ``<think>``, so the completion starts inside the reasoning.
    """
    return ThinkFormatReward(think_tag=think_tag, answer_tag=answer_tag, prefilled=prefilled)


#: Ready-made, with the default options, for TRL's own CLI: ``trl grpo --reward_funcs reward_plugins.think_format.reward``.
reward = think_format()
