"""A TRL ``GRPOConfig`` given to ``RLVRTrainer``: the equivalent ``RLVRConfig``, so the trainer is a drop-in.

``RLVRTrainer`` differs from ``GRPOTrainer`` by default in two computations (docs/trainer.md):

- the std that ``scale_rewards`` divides the advantages by: the population std (GRPO's definition) instead of
  TRL's sample std;
- DAPO's token-level loss (``loss_type="dapo"``, TRL's default): the exact token count of each optimizer step
  instead of TRL's estimate from the generation batch (equal unless a generation batch spans several steps).

A ``GRPOConfig`` carries no choice for either, so its user expects TRL's: the conversion keeps every field of
the given config and sets these two switches to TRL's values (:data:`GRPO_TRAINER_BEHAVIOUR`). Every other
RLVR switch stays off at its default (no dynamic sampling, no overlong penalty, the group-mean baseline, the
``loss_normalization`` that TRL's ``loss_type`` already names).
"""

from __future__ import annotations

import dataclasses

#: The RLVRConfig switches whose defaults differ from what GRPOTrainer computes, at GRPOTrainer's values.
GRPO_TRAINER_BEHAVIOUR = {"advantage_std": "sample", "token_count_scope": "generation_batch"}


def rlvr_config_from_grpo(config):
    """``config`` (a ``trl.GRPOConfig``) as an ``RLVRConfig`` with :data:`GRPO_TRAINER_BEHAVIOUR`.

    The values are read from the built config's attributes (not ``to_dict()``, which hides tokens), so what
    GRPOConfig derived in its ``__post_init__`` (``steps_per_generation``, ``scale_rewards`` as a string, ...)
    is carried over and checked again by RLVRConfig.
    """
    from trl import GRPOConfig

    from .checks import option_acts
    from .config import RLVRConfig

    if not isinstance(config, GRPOConfig):
        raise TypeError(f"RLVRTrainer needs args of type RLVRConfig or trl.GRPOConfig, got {type(config).__name__}")
    if isinstance(config, RLVRConfig):
        return config
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(GRPOConfig) if f.init}
    # only the switches that act under this config (the others would warn that they have no effect)
    acting = {k: v for k, v in GRPO_TRAINER_BEHAVIOUR.items() if option_acts(config, k)}
    return RLVRConfig(**values, **acting)
