"""TRL's own reward functions (``trl.rewards``, TRL 1.16) in the registry, under the names TRL logs them by.

``reward_funcs=["accuracy_reward", "think_format_reward"]`` in ``RLVRTrainer`` or a recipe, options in
``reward_options`` (``{"soft_overlong_punishment_reward": {"max_completion_len": 1024, "soft_punish_cache": 256}}``).
Each factory returns TRL's function as it is, wrapped only to declare the dataset columns it reads
(``required_columns``, checked before the model loads). TRL's accuracy, reasoning-accuracy, format and cosine
rewards read conversational completions (a list of messages): use them with a conversational dataset.
"""

from __future__ import annotations


class TRLReward:
    """One of TRL's reward functions, called as is; ``__name__`` is TRL's, ``required_columns`` declared here."""

    def __init__(self, func, required_columns: tuple = (), reward_kind: str | None = None):
        self.func = func
        self.required_columns = required_columns
        self.reward_kind = reward_kind  # the corpus `trl-rlvr rewards audit` runs, if any
        self.__name__ = getattr(func, "__name__", type(func).__name__)

    def __repr__(self) -> str:
        return f"trl.rewards {self.__name__}"

    def __call__(self, *args, **kwargs):
        return self.func(*args, **kwargs)


def accuracy_reward() -> TRLReward:
    """TRL's accuracy_reward: 1.0 when the completion's answer equals the `solution` column (math-verify)."""
    from trl.rewards import accuracy_reward as func

    return TRLReward(func, ("solution",), "math_answer")


def reasoning_accuracy_reward(reasoning_delimiters: list[str] | None = None) -> TRLReward:
    """TRL's reasoning_accuracy_reward: accuracy_reward on the text after the reasoning (`solution` column).

    Args:
        reasoning_delimiters: strings that end the reasoning (TRL's default: ``["</think>"]``).
    """
    import functools

    from trl.rewards import reasoning_accuracy_reward as func

    if reasoning_delimiters is not None:
        reward = TRLReward(functools.partial(func, reasoning_delimiters=reasoning_delimiters), ("solution",))
        reward.__name__ = func.__name__
        return reward
    return TRLReward(func, ("solution",))


def think_format_reward() -> TRLReward:
    """TRL's think_format_reward: 1.0 when the completion is <think>...</think> followed by an answer."""
    from trl.rewards import think_format_reward as func

    return TRLReward(func, reward_kind="format")


def cosine_scaled_reward(max_len: int, min_value_wrong: float = -1.0, max_value_wrong: float = -0.5,
                         min_value_correct: float = 0.5, max_value_correct: float = 1.0) -> TRLReward:
    """TRL's cosine_scaled_reward: correctness (`solution` column) scaled by length on a cosine schedule.

    Args: those of ``trl.rewards.get_cosine_scaled_reward``.
    """
    from trl.rewards import get_cosine_scaled_reward

    return TRLReward(get_cosine_scaled_reward(max_len, min_value_wrong, max_value_wrong, min_value_correct,
                                              max_value_correct), ("solution",))


def repetition_penalty_reward(ngram_size: int = 3, max_penalty: float = -1.0) -> TRLReward:
    """TRL's repetition_penalty_reward: a penalty growing with the share of repeated n-grams.

    Args: those of ``trl.rewards.get_repetition_penalty_reward``.
    """
    from trl.rewards import get_repetition_penalty_reward

    return TRLReward(get_repetition_penalty_reward(ngram_size, max_penalty))


def soft_overlong_punishment_reward(max_completion_len: int, soft_punish_cache: int) -> TRLReward:
    """TRL's soft_overlong_punishment_reward: DAPO's soft overlong punishment (Yu et al. 2025, eq. 13).

    Args: those of ``trl.rewards.get_soft_overlong_punishment``.
    """
    from trl.rewards import get_soft_overlong_punishment

    return TRLReward(get_soft_overlong_punishment(max_completion_len, soft_punish_cache))
