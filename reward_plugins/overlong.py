"""``overlong``: DAPO's soft overlong punishment as a reward function, in [-1, 0].

TRL's ``trl.rewards.get_soft_overlong_punishment`` computes it (Yu et al., 2025, "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale", eq. 13; ``trl_rlvr.algorithms.shaping`` states the formula). This plugin
adds only what TRL's leaves out: parameters checked with errors that name them (``trl_rlvr.algorithms.shaping``), and
the name ``overlong`` (TRL logs ``rewards/overlong/mean``). The penalty's size is the reward's weight:
DAPO's factor 1.0 is weight 1 (``GRPOConfig.reward_weights``; the trainer switch
``RLVRConfig.overlong_penalty_factor`` sets it so).

The penalty itself is the core's (:func:`trl_rlvr.algorithms.shaping.overlong_penalty`, which the registry name
``overlong`` and the trainer switch load directly); this module is its face for TRL's CLI
(``--reward_funcs reward_plugins.overlong...``), depending on the core and never the other way round.

A vanilla ``GRPOTrainer`` user adds it to ``reward_funcs`` next to the task reward (TRL sums the weighted
reward functions). Don't use both the plugin and the trainer switch, or the penalty counts twice. Lengths
are in tokens: TRL passes ``completion_ids`` to reward functions, and the function needs them.

With tools, a completion holds the tools' results too (TRL's ``tool_mask`` marks them 0). The penalty is on
what the MODEL wrote: given a ``tool_mask`` keyword argument (``RLVRTrainer`` passes TRL's), only the tokens
where it is 1 count, so a group with equal task rewards gets no advantage from how long the tool's replies were.
(TRL's budget, ``max_completion_length``, counts both; a plain ``GRPOTrainer`` passes no mask, and then every
token counts, as in TRL's own function.)
"""

from __future__ import annotations

from trl_rlvr.algorithms.shaping import overlong_penalty


def overlong(max_completion_length: int, buffer_length: int):
    """DAPO soft overlong penalty: 0 up to max-buffer tokens, then linearly down to -1 at max tokens.

    Args:
        max_completion_length: the generation budget L_max in tokens (required: GRPOConfig's value).
        buffer_length: the soft-punishment buffer L_cache before L_max (required; DAPO: 4096 of 20480).

    Returns a reward function named ``overlong`` (TRL's, counting model-written tokens when given a
    ``tool_mask``); scale it with its reward weight.
    """
    return overlong_penalty(max_completion_length, buffer_length)
