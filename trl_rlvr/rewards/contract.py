"""The reward plugin contract, declared once: what a reward function is, and what it may declare about itself.

A reward function is TRL's: ``f(prompts, completions, **columns) -> list[float | None]``, one score per completion
(``None``: not applicable to this row), with a ``__name__`` (TRL logs ``rewards/<__name__>/mean``). TRL passes
every dataset column but ``prompt`` as a keyword argument, plus ``completion_ids``, ``trainer_state`` and
``log_metric(name, value)``, through which a plugin reports its counters (``boxed_math/timeouts``, ...).

Optional attributes, each read by one part of this project and checked when a plugin is loaded
(:func:`check_reward_function`, called by :func:`trl_rlvr.rewards.load_reward`):

==========================  =========================================  ===========================================
attribute                   type                                       read by
==========================  =========================================  ===========================================
``required_columns``        sequence of column names, or of tuples of  the column check before the model loads
                            names any one of which will do             (:mod:`trl_rlvr.checks.columns`)
``verifies_correctness``    ``bool``                                   the trainer's default ``success_reward``
``reward_kind``             one of :data:`REWARD_KINDS`                ``trl-rlvr rewards audit`` (its corpus)
``check_rows``              ``(dataset) -> None``, raises ``ValueError``  the check before the model loads: rows the
                            naming the row                             reward cannot score (``code_sandbox``)
``extract_answer``          ``(completion) -> str | None``             maj@k voting (:mod:`trl_rlvr.rewards.voting`)
``same_answers``            ``(pairs) -> list[bool]``                  maj@k voting (batched equivalence)
``same_answer``             ``(a, b) -> bool``                         maj@k voting (one pair)
==========================  =========================================  ===========================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

#: What ``reward_kind`` may say: which audit corpus fits the reward.
REWARD_KINDS = ("math_answer", "code", "format")

#: The optional callables of the contract.
OPTIONAL_METHODS = ("check_rows", "extract_answer", "same_answers", "same_answer")


@runtime_checkable
class RewardFunction(Protocol):
    """TRL's reward-function signature; the optional attributes of the module docstring come on top."""

    __name__: str

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]: ...


class RewardContractError(TypeError):
    """A reward plugin returned something that breaks the contract (the message names the plugin)."""


def _columns_ok(value: Any) -> bool:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return False
    for need in value:
        options = (need,) if isinstance(need, str) else need
        if isinstance(options, (str, bytes)) or not isinstance(options, Sequence) or not options:
            return False
        if not all(isinstance(o, str) and o for o in options):
            return False
    return True


def check_reward_function(reward: Any, plugin: str) -> None:
    """Raise :class:`RewardContractError` naming ``plugin`` and the attribute when ``reward`` breaks the contract."""

    def fail(what: str) -> RewardContractError:
        return RewardContractError(f"Reward plugin {plugin!r}: {what}")

    if not callable(reward):
        raise fail(f"returned a {type(reward).__name__}, not a callable reward function")
    name = getattr(reward, "__name__", None)
    if not isinstance(name, str) or not name:
        raise fail("the reward function has no __name__ (TRL logs rewards/<__name__>/mean)")
    if hasattr(reward, "required_columns") and not _columns_ok(reward.required_columns):
        raise fail(
            f"required_columns must be a sequence of column names or tuples of names, got {reward.required_columns!r}"
        )
    if hasattr(reward, "verifies_correctness") and not isinstance(reward.verifies_correctness, bool):
        raise fail(f"verifies_correctness must be a bool, got {reward.verifies_correctness!r}")
    kind = getattr(reward, "reward_kind", None)
    if kind is not None and kind not in REWARD_KINDS:
        raise fail(f"reward_kind must be one of {', '.join(map(repr, REWARD_KINDS))}, got {kind!r}")
    for method in OPTIONAL_METHODS:
        if hasattr(reward, method) and not callable(getattr(reward, method)):
            raise fail(f"{method} must be callable, got {type(getattr(reward, method)).__name__}")
