"""Rewards: the plugin registry (entry points in the group ``trl_rlvr.rewards``), the plugin contract, and answer
classes for majority voting.

- :mod:`.registry`: :func:`load_reward`, :func:`available_rewards`, :func:`resolve_reward_funcs`, ...;
- :mod:`.contract`: :class:`RewardFunction` and the optional attributes a plugin may declare;
- :mod:`.voting`: maj@k answer classes decided by the plugin's own verifier;
- :mod:`.controls`: the random-reward control (each batch's rewards shuffled between its answers).

Light on purpose (standard library only): plugins are imported when first used.
"""

from trl_rlvr.rewards.contract import REWARD_KINDS, RewardContractError, RewardFunction, check_reward_function
from trl_rlvr.rewards.registry import (
    BUILTIN_REWARDS,
    GROUP,
    RewardPluginError,
    RewardSpec,
    available_rewards,
    describe_reward,
    import_reward_function,
    load_reward,
    resolve_reward_funcs,
    resolve_reward_spec,
    reward_specs,
)
from trl_rlvr.rewards.voting import answer_classes, supports_voting

__all__ = [
    "BUILTIN_REWARDS",
    "GROUP",
    "REWARD_KINDS",
    "RewardContractError",
    "RewardFunction",
    "RewardPluginError",
    "RewardSpec",
    "answer_classes",
    "available_rewards",
    "check_reward_function",
    "describe_reward",
    "import_reward_function",
    "load_reward",
    "resolve_reward_funcs",
    "resolve_reward_spec",
    "reward_specs",
    "supports_voting",
]
