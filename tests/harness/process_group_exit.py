"""Launched on 2 CPU processes: build the script state (or, given a model directory, only a bare RLVRTrainer, as a
user script or a harness does), use the gloo group, then run the exit handlers as the interpreter would and report
whether the group is gone (tests/scripts/test_distributed_state.py)."""

import atexit
import sys

import torch
import torch.distributed as dist

if len(sys.argv) > 1:
    from tests.harness.loss_harness import make_trainer

    process_index = make_trainer(sys.argv[1]).accelerator.process_index
else:
    from trl_rlvr.scripts.distributed import distributed_state

    process_index = distributed_state().process_index
total = torch.tensor([float(process_index + 1)])
dist.all_reduce(total)
before = dist.is_initialized() and dist.get_backend()
atexit._run_exitfuncs()
print(f"rank {process_index}: sum {total.item():g}, before exit {before}, "
      f"after exit {dist.is_initialized()}", flush=True)
