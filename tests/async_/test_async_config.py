"""RLVRAsyncConfig checks its switches (in a file of its own: building a TrainingArguments resets accelerate's state,
which a trainer built earlier in the same module would then lose)."""

import pytest

pytest.importorskip("trl.experimental.async_grpo")

from trl_rlvr.async_grpo import RLVRAsyncConfig  # noqa: E402
from trl_rlvr.async_grpo import async_trainer as trainer_module  # noqa: E402


def test_a_plain_async_config_is_refused_by_name():
    from trl.experimental.async_grpo import AsyncGRPOConfig

    with pytest.raises(TypeError, match="RLVRAsyncConfig"):
        trainer_module._rlvr_async_config("m", AsyncGRPOConfig("/tmp/x", bf16=False, use_cpu=True))


def test_config_checks_its_switches():
    base = {"output_dir": "/tmp/x", "bf16": False, "use_cpu": True}
    for bad, field in (({"scale_rewards": "batch"}, "scale_rewards"), ({"loss_normalization": "x"}, "loss_norm"),
                       ({"stale_is_clip_max": 0.5}, "stale_is_clip_max"), ({"advantage_std": "x"}, "advantage_std"),
                       ({"overlong_buffer_length": 4096, "max_completion_length": 16}, "overlong_buffer_length")):
        with pytest.raises(ValueError, match=field):
            RLVRAsyncConfig(**base, **bad)
    assert RLVRAsyncConfig(**base, loss_normalization="constant").loss_constant == 2048  # max_completion_length
