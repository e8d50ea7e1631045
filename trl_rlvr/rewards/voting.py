"""Answer classes for majority voting (maj@k), decided by the reward plugin's own verifier.

**The interface for plugin authors.** A reward function (what a plugin's factory returns) supports maj@k when it
has the attribute

* ``extract_answer(completion) -> str | None``: the completion's final answer as text (the completion as the
  reward receives it: a string, or a list of messages), ``None`` when it states none. It must never raise on
  untrusted text (if it does, the sample counts as having no answer).

and may have

* ``same_answers(pairs: list[tuple[str, str]]) -> list[bool]``: whether each pair of extracted answers is the
  same answer by the verifier's equivalence (``\\frac{1}{2}`` and ``0.5``: yes), batched; or
* ``same_answer(a, b) -> bool``: the same for one pair.

Without either, two answers are the same when their texts are equal. ``boxed_math`` implements all three with
its checker (math-verify in its deadline-bounded workers). A reward without ``extract_answer`` (``code_sandbox``:
a program has no "final answer" to vote on) has no maj@k, and the evaluation reports it as not defined.

Grouping (:func:`answer_classes`): within one question, the distinct answer texts in order of first appearance;
each joins the class of the first earlier class representative it is the same answer as, or starts a new class.
(An equivalence that is not transitive cannot then chain two different answers together through a third.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def supports_voting(reward_fn: Any) -> bool:
    """Whether ``reward_fn`` can extract answers (so maj@k is defined for it)."""
    return callable(getattr(reward_fn, "extract_answer", None))


def _name(reward_fn: Any) -> str:
    return getattr(reward_fn, "__name__", None) or type(reward_fn).__name__


def _extract(reward_fn: Any, completion: Any) -> str | None:
    try:
        answer = reward_fn.extract_answer(completion)
    except Exception:  # noqa: BLE001 - a plugin's extraction must not end the evaluation
        return None
    return answer if isinstance(answer, str) and answer.strip() else None


def _comparer(reward_fn: Any) -> Callable[[list[tuple[str, str]]], list[bool]]:
    batched = getattr(reward_fn, "same_answers", None)
    single = getattr(reward_fn, "same_answer", None)

    def compare(pairs: list[tuple[str, str]]) -> list[bool]:
        if not pairs:
            return []
        if callable(batched):
            try:
                out = list(batched(pairs))
                if len(out) == len(pairs):
                    return [bool(x) for x in out]
            except Exception:  # noqa: BLE001
                pass
            return [False] * len(pairs)
        if callable(single):
            res = []
            for a, b in pairs:
                try:
                    res.append(bool(single(a, b)))
                except Exception:  # noqa: BLE001
                    res.append(False)
            return res
        return [a == b for a, b in pairs]

    return compare


def answer_classes(reward_fn: Any, completions: Sequence[Sequence[Any]]) -> tuple[list[list[str | None]], list[list[int | None]]]:
    """For each question's completions: the extracted answers and their class ids (``None``: no answer).

    Class ids are 0, 1, ... per question, in order of first appearance. All comparisons of all questions go to
    the plugin in one batch (``same_answers``), at most ``m (m - 1) / 2`` pairs for ``m`` distinct answer texts
    of a question.
    """
    if not supports_voting(reward_fn):
        raise TypeError(f"reward {_name(reward_fn)!r} has no extract_answer: maj@k is not defined for it")
    answers = [[_extract(reward_fn, c) for c in group] for group in completions]
    distinct = [list(dict.fromkeys(a for a in group if a is not None)) for group in answers]
    pairs, index = [], {}
    for q, texts in enumerate(distinct):
        for j in range(1, len(texts)):
            for i in range(j):
                index[(q, i, j)] = len(pairs)
                pairs.append((texts[i], texts[j]))
    same = _comparer(reward_fn)(pairs)
    classes = []
    for q, texts in enumerate(distinct):
        reps: list[int] = []  # positions in texts of the class representatives
        cls_of: dict[str, int] = {}
        for j, text in enumerate(texts):
            for c, i in enumerate(reps):
                if same[index[(q, i, j)]]:
                    cls_of[text] = c
                    break
            else:
                cls_of[text] = len(reps)
                reps.append(j)
        classes.append([None if a is None else cls_of[a] for a in answers[q]])
    return answers, classes
