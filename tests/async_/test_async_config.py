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


def test_a_max_staleness_that_can_never_train_is_refused():
    """A row read from the queue waits one weight sync (fixed-count batching) or two (token-budget batching) before
    its loss; a row over max_staleness at its loss is never trained, so a smaller max_staleness trains nothing."""
    base = {"output_dir": "/tmp/x", "bf16": False, "use_cpu": True}
    for max_staleness, token_budget in ((0, 0), (0, None), (1, None), (1, 256)):
        with pytest.raises(ValueError, match=f"max_staleness={max_staleness} can never train"):
            RLVRAsyncConfig(**base, max_staleness=max_staleness, token_budget=token_budget)
    assert RLVRAsyncConfig(**base, max_staleness=1, token_budget=0).max_staleness == 1
    assert RLVRAsyncConfig(**base, max_staleness=2, token_budget=None).max_staleness == 2
