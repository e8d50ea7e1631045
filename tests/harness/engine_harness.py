"""The loss-exactness run and a dynamic-sampling run of the tiny model under a sharding engine (FSDP2, DeepSpeed).

Run under `accelerate launch` with the patch of tests/harness/engine_launch.py:
    python -m tests.harness.engine_harness MODEL_DIR OUT
Every rank writes OUT.rank{r}.pt with
- "engine": what the engine did to the model, read from the prepared model itself (`engine_report`),
- "loss": the full gradient of one optimizer step (`per_batch_token`, steps_per_generation 2, gradient
  accumulation 2, the fixed batch of tests/harness/loss_harness.py) and the rows of that step,
- "dynamic": the advantages that reached the loss and the log history of a 2-step dynamic-sampling run
  (tests/harness/dynamic_sampling_harness.py, real generation).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

import torch

WRAPPER_SEGMENTS = {"module", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"}


def plain_name(name: str) -> str:
    """A parameter name without the wrappers' segments (DDP, activation checkpointing, FSDP1)."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


def engine_report(trainer) -> dict:
    """What the engine did to the trained model: distributed type, FSDP2 shards, DeepSpeed ZeRO stage."""
    model = trainer.model_wrapped
    report = {"distributed_type": str(trainer.accelerator.distributed_type), "model_class": type(model).__name__,
              "num_processes": trainer.accelerator.num_processes}
    from torch.distributed.tensor import DTensor

    params = list(trainer.model.parameters())
    dtensors = [p for p in params if isinstance(p, DTensor)]
    report["params"] = len(params)
    report["dtensor_params"] = len(dtensors)
    if dtensors:
        from torch.distributed.fsdp import FSDPModule

        report["fsdp_modules"] = sum(isinstance(m, FSDPModule) for m in trainer.model.modules())
        report["local_numel"] = sum(p.to_local().numel() for p in dtensors)
        report["global_numel"] = sum(p.numel() for p in dtensors)
        report["placements"] = sorted({str(p.placements) for p in dtensors})
        report["mesh_size"] = dtensors[0].device_mesh.size()
    if hasattr(model, "zero_optimization_stage"):
        report["zero_stage"] = model.zero_optimization_stage()
        report["optimizer_class"] = type(model.optimizer).__name__
        partitions = getattr(model.optimizer, "partition_count", None)  # ZeRO-1/2: one per parameter group
        report["optimizer_partitions"] = sorted(set(partitions if isinstance(partitions, list) else [partitions]))
        fp32_partitions = getattr(model.optimizer, "single_partition_of_fp32_groups", None)  # ZeRO-1/2
        if fp32_partitions is not None:
            report["optimizer_local_numel"] = sum(t.numel() for t in fp32_partitions)
        report["model_numel"] = sum(getattr(p, "ds_numel", p.numel()) for p in model.module.parameters())
        partitioned = [p for p in model.module.parameters() if hasattr(p, "ds_numel")]
        report["ds_params"] = len(partitioned)
        report["ds_local_numel"] = sum(p.ds_tensor.numel() for p in partitioned)
        report["ds_global_numel"] = sum(p.ds_numel for p in partitioned)
        report["ds_resident_numel"] = sum(p.data.numel() for p in partitioned)  # 0 per param while partitioned
        report["ds_status"] = sorted({str(p.ds_status) for p in partitioned})
        report["ds_threshold"] = model.zero_param_persistence_threshold()
    return report


def full_gradients(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sharded (DTensor) gradients gathered to full tensors; every rank must call this in the same order."""
    from torch.distributed.tensor import DTensor

    return {plain_name(n): (g.full_tensor() if isinstance(g, DTensor) else g) for n, g in sorted(grads.items())}


@contextmanager
def deepspeed_gradients():
    """Yield a list that receives the full gradient at every optimizer step of a DeepSpeed engine.

    ZeRO keeps no gradient in `p.grad`, and accelerate calls `DeepSpeedEngine.step` from `backward`, before any
    callback: the gradient is read inside `step`, at the accumulation boundary, before the optimizer runs.
    """
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.utils import safe_get_full_grad

    captured, step = [], DeepSpeedEngine.step

    def recording_step(self, *args, **kwargs):
        if self.is_gradient_accumulation_boundary():
            # safe_get_full_grad gathers a ZeRO-3 shard: every rank calls it, in the same order.
            captured.append({plain_name(n): safe_get_full_grad(p).detach().clone()
                             for n, p in sorted(self.module.named_parameters())})
        return step(self, *args, **kwargs)

    DeepSpeedEngine.step = recording_step
    try:
        yield captured
    finally:
        DeepSpeedEngine.step = step


def shard_every_zero3_parameter() -> None:
    """ZeRO-3 with `stage3_param_persistence_threshold` 0 (for the tiny model only).

    DeepSpeed keeps a parameter under the threshold (1e5 elements by default; accelerate's config does not set it)
    whole on every rank. Every parameter of the tiny model is under it, so ZeRO-3 would partition none of them;
    with 0 every parameter is partitioned, as a real model's weight matrices are.
    """
    from accelerate.utils import DeepSpeedPlugin

    post_init = DeepSpeedPlugin.__post_init__

    def __post_init__(self):
        post_init(self)
        zero = self.deepspeed_config["zero_optimization"]
        if zero.get("stage") == 3:
            zero["stage3_param_persistence_threshold"] = 0

    DeepSpeedPlugin.__post_init__ = __post_init__


def run_loss(model_dir):
    from tests.harness.loss_harness import run_trainer

    def run():
        return run_trainer(model_dir, "per_batch_token", steps_per_generation=2, grad_accum=2)

    if os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
        with deepspeed_gradients() as grads:
            _, rows, trainer = run()
    else:
        grads, rows, trainer = run()
        grads = [full_gradients(g) for g in grads]
    return {"grads": grads, "rows": rows}, engine_report(trainer)


def run_dynamic(model_dir):
    from tests.harness.dynamic_sampling_harness import run

    trainer, seen = run(model_dir, max_steps=2, per_device_train_batch_size=4)
    return {"advantages": seen, "log_history": trainer.state.log_history}, engine_report(trainer)


if __name__ == "__main__":
    model_dir, out = sys.argv[1], sys.argv[2]
    if os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
        shard_every_zero3_parameter()
    loss, loss_engine = run_loss(model_dir)
    dynamic, dynamic_engine = run_dynamic(model_dir)
    rank = int(torch.distributed.get_rank()) if torch.distributed.is_initialized() else 0
    torch.save({"loss": loss, "dynamic": dynamic, "engine": {"loss": loss_engine, "dynamic": dynamic_engine}},
               f"{out}.rank{rank}.pt")


# -- checks the engine tests share (run in the test process on what the ranks wrote) ---------------------------------
def assert_gradient_is_the_reference(grads: dict, rows, model_dir) -> None:
    """The rank's gradient of the fixed batch's optimizer step equals the formula's (per_batch_token)."""
    from tests.harness.loss_harness import fixed_batch, reference_grads, select_rows
    from trl_rlvr.testing import load_tokenizer

    assert rows.shape[0] == 8
    want = reference_grads(model_dir, select_rows(fixed_batch(len(load_tokenizer(model_dir))), rows), "per_batch_token")
    got = {plain_name(n): g for n, g in grads.items()}
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-5, msg=f"gradient of {name}")
    assert max(g.abs().max().item() for g in want.values()) > 1e-3  # the check is not vacuous


def assert_dynamic_sampling_in_lockstep(ranks: list[dict]) -> None:
    """2 optimizer steps x 2 accumulation steps of informative rows, the same sampling rounds on both ranks."""
    sizes = [[a.numel() for a in rank["dynamic"]["advantages"]] for rank in ranks]
    assert sizes[0] == sizes[1] and len(sizes[0]) == 4
    for rank in ranks:
        assert all(a.numel() > 0 and (a != 0).all() for a in rank["dynamic"]["advantages"])
    rounds = [[h["rlvr/sampling_rounds"] for h in r["dynamic"]["log_history"] if "rlvr/sampling_rounds" in h]
              for r in ranks]
    assert rounds[0] == rounds[1] and len(rounds[0]) == 2

