"""A toy verifiable reward for the sampled-evaluation tests: gives a random tiny model a non-trivial score.

The "answer" of a completion is its first non-space character; it is right when it is a vowel or a digit, and
answers equal up to case are one answer (so majority voting groups ``A`` with ``a``).
"""

from __future__ import annotations

RIGHT = set("aeiou0123456789")


def _text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


class FirstCharReward:
    __name__ = "first_char"

    def __call__(self, prompts=None, completions=None, **kwargs):
        return [1.0 if (a := self.extract_answer(c)) is not None and a.lower() in RIGHT else 0.0 for c in completions]

    def extract_answer(self, completion):
        text = _text(completion).strip()
        return text[0] if text else None

    def same_answers(self, pairs):
        return [a.lower() == b.lower() for a, b in pairs]


first_char = FirstCharReward()


def first_char_no_vote(prompts=None, completions=None, **kwargs):
    """The same scores without the voting interface (like code_sandbox: maj@k not defined)."""
    return first_char(prompts, completions, **kwargs)
