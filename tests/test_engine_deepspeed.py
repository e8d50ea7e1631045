"""DeepSpeed ZeRO-2 and ZeRO-3 for real on 2 CPU processes: examples/accelerate/deepspeed_zero{2,3}.yaml.

DeepSpeed runs on a CPU with its own CPU accelerator and gloo; accelerate's DeepSpeed path needs the same one
patch as FSDP (tests/engine_launch.py). Each run must show the ZeRO stage at work (the engine's stage, the
optimizer partitioned over 2 ranks, for ZeRO-3 every parameter partitioned), the exact `per_batch_token` gradient
of the reference with gradient accumulation 2, and dynamic sampling training 2 steps.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from engine_launch import launch_on_cpu_with
from loss_harness import fixed_batch, reference_grads, select_rows
from tiny import load_tokenizer

HARNESS = Path(__file__).parent / "engine_harness.py"

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
    assert rows.shape[0] == 8
    batch = fixed_batch(len(load_tokenizer(tiny_model_dir)))
    want = reference_grads(tiny_model_dir, select_rows(batch, rows), "per_batch_token")
    assert set(grads) == set(want)
    for name in want:
        torch.testing.assert_close(grads[name], want[name], atol=1e-6, rtol=1e-5, msg=f"gradient of {name}")
    assert max(g.abs().max().item() for g in want.values()) > 1e-3  # the check is not vacuous


def test_dynamic_sampling_trains_two_steps_under_zero(zero_ranks):
    _, ranks = zero_ranks
    sizes = [[a.numel() for a in rank["dynamic"]["advantages"]] for rank in ranks]
    assert sizes[0] == sizes[1] and len(sizes[0]) == 4  # 2 optimizer steps x 2 accumulation steps, same on both
    for rank in ranks:
        assert all(a.numel() > 0 and (a != 0).all() for a in rank["dynamic"]["advantages"])
    rounds = [[h["rlvr/sampling_rounds"] for h in r["dynamic"]["log_history"] if "rlvr/sampling_rounds" in h]
              for r in ranks]
    assert rounds[0] == rounds[1] and len(rounds[0]) == 2
