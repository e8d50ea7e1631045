"""The RLVR switches on TRL's asynchronous GRPO trainer (``trl.experimental.async_grpo``; docs/async.md).

``from trl_rlvr.async_grpo import RLVRAsyncConfig, RLVRAsyncTrainer``. Imported on first use only: TRL's
experimental package announces itself (``TRLExperimentalWarning``) when imported, and ``import trl_rlvr`` should not.
"""

from __future__ import annotations

__all__ = ["RLVRAsyncConfig", "RLVRAsyncTrainer"]


def __getattr__(name: str):
    if name == "RLVRAsyncConfig":
        from trl_rlvr.async_grpo.async_config import RLVRAsyncConfig

        return RLVRAsyncConfig
    if name == "RLVRAsyncTrainer":
        from trl_rlvr.async_grpo.async_trainer import RLVRAsyncTrainer

        return RLVRAsyncTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
