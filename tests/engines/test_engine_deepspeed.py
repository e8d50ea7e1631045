"""DeepSpeed ZeRO-2 and ZeRO-3 for real on 2 CPU processes: examples/accelerate/deepspeed_zero{2,3}.yaml.

DeepSpeed runs on a CPU with its own CPU accelerator and gloo; accelerate's DeepSpeed path needs the same one
patch as FSDP (tests/harness/engine_launch.py). Each run must show the ZeRO stage at work (the engine's stage, the
optimizer partitioned over 2 ranks, for ZeRO-3 every parameter partitioned), the exact `per_batch_token` gradient
of the reference with gradient accumulation 2, and dynamic sampling training 2 steps.
"""

import importlib.util

import pytest
import torch

from tests.harness.engine_harness import assert_dynamic_sampling_in_lockstep, assert_gradient_is_the_reference
from tests.harness.engine_launch import launch_on_cpu_with

HARNESS = "tests.harness.engine_harness"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed not installed (.[deepspeed])"),
]


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def zero_ranks(request, tiny_model_dir, tmp_path_factory):
    stage = request.param
    out = tmp_path_factory.mktemp(f"zero{stage}") / "run"
    launch_on_cpu_with(f"deepspeed_zero{stage}.yaml", HARNESS, tiny_model_dir, out)
    return stage, [torch.load(f"{out}.rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("run", ["loss", "dynamic"])
def test_zero_stage_is_active(zero_ranks, run):
    stage, ranks = zero_ranks
    for rank in ranks:
        report = rank["engine"][run]
        assert report["distributed_type"] == "DistributedType.DEEPSPEED", report  # not DDP, not one process
        assert report["model_class"] == "DeepSpeedEngine" and report["num_processes"] == 2
        assert report["zero_stage"] == stage
        assert report["optimizer_partitions"] == [2]
        if stage == 2:
            assert report["optimizer_class"] == "DeepSpeedZeroOptimizer"
            # Each rank's fp32 master weights (and so its Adam states) are half of the model.
            assert report["optimizer_local_numel"] <= report["model_numel"] // 2 + 64
        else:
            assert report["optimizer_class"] == "DeepSpeedZeroOptimizer_Stage3"
            assert report["ds_params"] == report["params"] > 0  # every parameter is ZeRO-3 managed...
            assert report["ds_status"] == ["ZeroParamStatus.NOT_AVAILABLE"] and report["ds_resident_numel"] == 0
            assert report["ds_local_numel"] <= report["ds_global_numel"] // 2 + 64  # ...and partitioned


def test_gradient_equals_the_reference_under_zero(zero_ranks, tiny_model_dir):
    """per_batch_token, steps_per_generation 2, gradient accumulation 2: one optimizer step over the 8 rows."""
    _, ranks = zero_ranks
    (grads,), (rows,) = ranks[0]["loss"]["grads"], ranks[0]["loss"]["rows"]
    assert_gradient_is_the_reference(grads, rows, tiny_model_dir)


def test_dynamic_sampling_trains_two_steps_under_zero(zero_ranks):
    _, ranks = zero_ranks
    assert_dynamic_sampling_in_lockstep(ranks)
