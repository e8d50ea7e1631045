"""FSDP2 for real on 2 CPU processes: examples/accelerate/fsdp.yaml through accelerate's own FSDP2 path (gloo).

See tests/engine_launch.py for why a plain CPU launch of an FSDP config does not shard (and what the one patch does).
The run must show sharding (every parameter a DTensor, half of it on each rank), the exact `per_batch_token`
gradient of the reference with gradient accumulation 2, and dynamic sampling training 2 steps.
"""

from pathlib import Path

import pytest
import torch

from engine_harness import plain_name
from engine_launch import launch_on_cpu_with
from loss_harness import fixed_batch, reference_grads, select_rows
from tiny import load_tokenizer

HARNESS = Path(__file__).parent / "engine_harness.py"


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
    assert rows.shape[0] == 8
    batch = fixed_batch(len(load_tokenizer(tiny_model_dir)))
    want = reference_grads(tiny_model_dir, select_rows(batch, rows), "per_batch_token")
    got = {plain_name(n): g for n, g in grads.items()}
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-5, msg=f"gradient of {name}")
    assert max(g.abs().max().item() for g in want.values()) > 1e-3  # the check is not vacuous
    other = fsdp_ranks[1]["loss"]["grads"][0]
    assert all(torch.equal(other[n], grads[n]) for n in grads)  # gathered from the shards: one gradient


@pytest.mark.slow
def test_dynamic_sampling_trains_two_steps_under_fsdp2(fsdp_ranks):
    sizes = [[a.numel() for a in rank["dynamic"]["advantages"]] for rank in fsdp_ranks]
    assert sizes[0] == sizes[1] and len(sizes[0]) == 4  # 2 optimizer steps x 2 accumulation steps, same on both
    for rank in fsdp_ranks:
        assert all(a.numel() > 0 and (a != 0).all() for a in rank["dynamic"]["advantages"])
    rounds = [[h["rlvr/sampling_rounds"] for h in r["dynamic"]["log_history"] if "rlvr/sampling_rounds" in h]
              for r in fsdp_ranks]
    assert rounds[0] == rounds[1] and len(rounds[0]) == 2
