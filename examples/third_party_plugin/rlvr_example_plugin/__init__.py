"""Example reward plugin: 1.0 when the completion contains a word, else 0.0."""

from __future__ import annotations


def _text(completion) -> str:
    if isinstance(completion, str):
        return completion
    # conversational: a list of {"role", "content"} messages; read the last one
    if completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content") or "")
    return ""


class KeywordReward:
    def __init__(self, word: str, case_sensitive: bool = False):
        self.word = word if case_sensitive else word.lower()
        self.case_sensitive = case_sensitive
        self.__name__ = "keyword"  # TRL logs rewards/keyword/mean (the registry sets its own name anyway)

    def __call__(self, prompts=None, completions=None, **kwargs) -> list[float]:
        out = []
        for c in completions:
            text = _text(c) if self.case_sensitive else _text(c).lower()
            out.append(1.0 if self.word in text else 0.0)
        return out


def keyword(word: str = "because", case_sensitive: bool = False) -> KeywordReward:
    """1.0 when the completion contains `word` (an example third-party plugin), else 0.0.

    Args:
        word: the word to look for.
        case_sensitive: match case exactly.
    """
    return KeywordReward(word, case_sensitive)
