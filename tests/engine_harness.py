"""The loss-exactness run and a dynamic-sampling run of the tiny model under a sharding engine (FSDP2, DeepSpeed).

Run under `accelerate launch` (see tests/fsdp_cpu.py, tests/test_engine_deepspeed.py):
    python tests/engine_harness.py MODEL_DIR OUT
Every rank writes OUT.rank{r}.pt with
- "engine": what the engine did to the model, read from the prepared model itself (`engine_report`),
- "loss": the full gradient of one optimizer step, `per_batch_token`, steps_per_generation 2, gradient
  accumulation 2, on the fixed batch of tests/loss_harness.py, and the rows of that step,
- "dynamic": the advantages that reached the loss and the log history of a 2-step dynamic-sampling run
  (tests/dynamic_sampling_harness.py, real generation).
"""

from __future__ import annotations

import sys

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
        partitioned = [p for p in model.module.parameters() if hasattr(p, "ds_numel")]
        report["ds_params"] = len(partitioned)
        report["ds_local_numel"] = sum(p.ds_tensor.numel() for p in partitioned)
        report["ds_global_numel"] = sum(p.ds_numel for p in partitioned)
        report["ds_resident_numel"] = sum(p.numel() for p in partitioned)  # 0 per param while partitioned
    return report


def full_gradients(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sharded (DTensor) gradients gathered to full tensors; every rank must call this in the same order."""
    from torch.distributed.tensor import DTensor

    return {plain_name(n): (g.full_tensor() if isinstance(g, DTensor) else g) for n, g in sorted(grads.items())}


def run_loss(model_dir):
    from loss_harness import run_trainer

    grads, rows, trainer = run_trainer(model_dir, "per_batch_token", steps_per_generation=2, grad_accum=2)
    return {"grads": [full_gradients(g) for g in grads], "rows": rows}, engine_report(trainer)


def run_dynamic(model_dir):
    from dynamic_sampling_harness import run

    trainer, seen = run(model_dir, max_steps=2, per_device_train_batch_size=4)
    return {"advantages": seen, "log_history": trainer.state.log_history}, engine_report(trainer)


if __name__ == "__main__":
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    model_dir, out = sys.argv[1], sys.argv[2]
    loss, loss_engine = run_loss(model_dir)
    dynamic, dynamic_engine = run_dynamic(model_dir)
    rank = int(torch.distributed.get_rank()) if torch.distributed.is_initialized() else 0
    torch.save({"loss": loss, "dynamic": dynamic, "engine": {"loss": loss_engine, "dynamic": dynamic_engine}},
               f"{out}.rank{rank}.pt")
