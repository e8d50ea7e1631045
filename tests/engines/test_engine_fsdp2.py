"""FSDP2 for real on 2 CPU processes: examples/accelerate/fsdp.yaml through accelerate's own FSDP2 path (gloo).

See tests/harness/engine_launch.py for why a plain CPU launch of an FSDP config does not shard (and what the one patch does).
The run must show sharding (every parameter a DTensor, half of it on each rank), the exact `per_batch_token`
gradient of the reference with gradient accumulation 2, and dynamic sampling training 2 steps.
"""


import pytest
import torch

from tests.harness.engine_harness import assert_dynamic_sampling_in_lockstep, assert_gradient_is_the_reference
from tests.harness.engine_launch import launch_on_cpu_with

HARNESS = "tests.harness.engine_harness"


@pytest.fixture(scope="module")
def fsdp_ranks(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp") / "run"
    launch_on_cpu_with("fsdp.yaml", HARNESS, tiny_model_dir, out)
    return [torch.load(f"{out}.rank{r}.pt") for r in range(2)]


def assert_sharded_by_fsdp2(report, num_layers=2):
    assert report["distributed_type"] == "DistributedType.FSDP", report  # not MULTI_CPU (DDP), not NO
    assert report["num_processes"] == 2 and report["mesh_size"] == 2
    assert report["dtensor_params"] == report["params"] > 0  # every parameter is a DTensor...
    assert report["placements"] == ["(Shard(dim=0),)"]  # ...sharded over the 2 ranks
    assert report["fsdp_modules"] >= num_layers + 1  # each decoder layer (TRANSFORMER_BASED_WRAP) and the root


@pytest.mark.slow
@pytest.mark.parametrize("run", ["loss", "dynamic"])
def test_parameters_are_sharded_across_the_two_ranks(fsdp_ranks, run):
    reports = [rank["engine"][run] for rank in fsdp_ranks]
    for report in reports:
        assert_sharded_by_fsdp2(report)
    # Each rank holds about half of the parameters; together exactly all of them.
    assert sum(r["local_numel"] for r in reports) == reports[0]["global_numel"]
    assert all(r["local_numel"] < 0.6 * r["global_numel"] for r in reports)


@pytest.mark.slow
def test_gradient_equals_the_reference_under_fsdp2(fsdp_ranks, tiny_model_dir):
    """per_batch_token, steps_per_generation 2, gradient accumulation 2: one optimizer step over the 8 rows."""
    (grads,), (rows,) = fsdp_ranks[0]["loss"]["grads"], fsdp_ranks[0]["loss"]["rows"]
    assert_gradient_is_the_reference(grads, rows, tiny_model_dir)
    other = fsdp_ranks[1]["loss"]["grads"][0]
    assert all(torch.equal(other[n], grads[n]) for n in grads)  # gathered from the shards: one gradient


@pytest.mark.slow
def test_dynamic_sampling_trains_two_steps_under_fsdp2(fsdp_ranks):
    assert_dynamic_sampling_in_lockstep(fsdp_ranks)
