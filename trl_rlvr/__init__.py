"""trl-rlvr: reinforcement learning from verifiable rewards on Hugging Face TRL.

The public face. The package, by folder:

- ``config`` / ``presets`` / ``trainer``: :class:`RLVRConfig` (TRL's ``GRPOConfig`` plus the RLVR switches), the
  papers' presets, and :class:`RLVRTrainer` (``GRPOTrainer`` with thin glue);
- ``algorithms/``: the pure maths (advantages, token counts, shaping, rollout metrics);
- ``sampling/``: which rows reach the loss (dynamic and selective sampling, the prompt stream);
- ``rewards/``: the plugin registry and contract (the plugins themselves are the ``reward_plugins`` package);
- ``checks/``: what tells the user something is wrong: before a model loads (settings, this machine), during a
  run (alarms), on one measured batch (the doctor's verdicts); ``audit/``: a reward against hostile corpora;
- ``evaluation/``: greedy and sampled held-out evaluation, pass@k / maj@k, the report, the training callback;
- ``scripts/``: the ``trl-rlvr`` commands (train, doctor, eval, rewards audit), data and model loading;
- ``testing/``: tiny models and tokenizers for tests and plugin authors; ``_compat/``: private shims.

``RLVRConfig``, ``RLVRTrainer`` and the evaluation import TRL or transformers (slow): they are loaded on first
access, so that the reward registry and the CLI stay light.
"""

from trl_rlvr._compat.quantized import silence_cpu_kernel_notice
from trl_rlvr.rewards import (
    REWARD_KINDS,
    RewardFunction,
    RewardPluginError,
    available_rewards,
    load_reward,
    resolve_reward_funcs,
)

__version__ = "0.3.0"

#: public name -> the module that defines it, imported on first access
_LAZY = {
    "RLVRConfig": "trl_rlvr.config",
    "RLVRTrainer": "trl_rlvr.trainer",
    "PRESETS": "trl_rlvr.presets",
    "evaluate": "trl_rlvr.evaluation.evaluate",
    "evaluate_sampled": "trl_rlvr.evaluation.evaluate",
    "SampledEvalCallback": "trl_rlvr.evaluation.callback",
    "pass_at_k": "trl_rlvr.evaluation.passk",
    "maj_at_k": "trl_rlvr.evaluation.passk",
}

__all__ = [
    "PRESETS",
    "REWARD_KINDS",
    "RLVRConfig",
    "RLVRTrainer",
    "RewardFunction",
    "RewardPluginError",
    "SampledEvalCallback",
    "available_rewards",
    "evaluate",
    "evaluate_sampled",
    "load_reward",
    "maj_at_k",
    "pass_at_k",
    "resolve_reward_funcs",
]

silence_cpu_kernel_notice()  # before anything imports transformers (-> peft -> bitsandbytes)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trl_rlvr' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
