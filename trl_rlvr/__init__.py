"""trl-rlvr: reinforcement learning from verifiable rewards on Hugging Face TRL.

``RLVRConfig`` / ``RLVRTrainer`` import TRL (slow); they are loaded on first access so that the reward
registry (``trl_rlvr.rewards``) and the CLI stay light.
"""

from .quantized import silence_cpu_kernel_notice

__version__ = "0.1.0"
__all__ = ["RLVRConfig", "RLVRTrainer"]

silence_cpu_kernel_notice()  # before anything imports transformers (-> peft -> bitsandbytes)


def __getattr__(name):
    if name == "RLVRConfig":
        from .config import RLVRConfig

        return RLVRConfig
    if name == "RLVRTrainer":
        from .trainer import RLVRTrainer

        return RLVRTrainer
    raise AttributeError(f"module 'trl_rlvr' has no attribute {name!r}")
