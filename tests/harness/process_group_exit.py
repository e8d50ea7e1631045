"""Launched on 2 CPU processes: build the script state, use the gloo group, then run the exit handlers as the
interpreter would and report whether the group is gone (tests/scripts/test_distributed_state.py)."""

import atexit

import torch
import torch.distributed as dist

from trl_rlvr.scripts.distributed import distributed_state

state = distributed_state()
total = torch.tensor([float(state.process_index + 1)])
dist.all_reduce(total)
before = dist.is_initialized() and dist.get_backend()
atexit._run_exitfuncs()
print(f"rank {state.process_index}: sum {total.item():g}, before exit {before}, "
      f"after exit {dist.is_initialized()}", flush=True)
