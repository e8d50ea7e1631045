"""Destroy a gloo process group before the interpreter finalises: torch's gloo threads otherwise abort a finished rank.

Left to the interpreter's finalization, a gloo process group's worker threads can abort a rank that has finished its
work ("terminate called without an active exception", SIGABRT), and the launcher then reports the whole launch as
failed. PyTorch asks every process to call ``destroy_process_group()`` at the end of its work (torch.distributed's
"Shutdown" section). Every multi-process run passes through one of the two callers: the scripts' process state
(:func:`trl_rlvr.scripts.distributed.distributed_state`) and :class:`trl_rlvr.RLVRTrainer`'s construction (a user
script or a harness that builds the trainer directly).

What it cannot do: ``destroy_process_group()`` ends the group only when nothing else holds it, and a transformers
``Trainer`` keeps it (measured on torch 2.13: the group's threads, ``pt_gloo_runloop`` and ``gloo_tcp_loop``, still
run after this handler, and after the trainer is deleted; a script that builds only the process state ends them).
The abort stays rare (none in 57 launches of a two-process training run in a row), not ruled out; the test
suite's launch helper (``tests/harness/launch.py``) runs a launch once more when a rank aborts this way.
"""

from __future__ import annotations

import atexit


def destroy_gloo_process_group_at_exit() -> None:
    """Register :func:`destroy_gloo_process_group` as an ``atexit`` handler, once however often it is called."""
    atexit.unregister(destroy_gloo_process_group)
    atexit.register(destroy_gloo_process_group)


def destroy_gloo_process_group() -> None:
    """``torch.distributed.destroy_process_group()`` while the interpreter is still whole, on the gloo backend only.

    It is local for gloo. NCCL's is left to the trainer and the launcher: after a failure on another rank it could
    wait for a peer that never comes (accelerate's ``PartialState.destroy_process_group`` would destroy either)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()
