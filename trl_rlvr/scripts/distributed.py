"""The one rule for the process state a script builds before the trainer's ``Accelerator`` exists."""

from __future__ import annotations

import atexit


def distributed_state(use_cpu: bool = False):
    """accelerate's ``PartialState`` for this process, right on a CPU launch too.

    Built with ``cpu=True`` when ``use_cpu`` (``--use_cpu``), ``ACCELERATE_USE_CPU`` or the machine has no
    accelerator: a bare ``PartialState()`` built before the trainer's ``Accelerator`` on a CPU says "1 process,
    rank 0" on every rank of a gloo launch (every rank would then convert the model, print as the main process and
    work on the whole data).

    On a gloo launch the process group is destroyed when the script exits (:func:`destroy_gloo_process_group`, an
    ``atexit`` handler): left to the interpreter's finalisation, gloo's worker threads can abort a rank that has
    finished its work ("terminate called without an active exception", SIGABRT), failing the launch."""
    import torch
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    cpu = bool(use_cpu) or parse_flag_from_env("ACCELERATE_USE_CPU") or not torch.accelerator.is_available()
    state = PartialState(cpu=cpu)
    if state.num_processes > 1:
        atexit.unregister(destroy_gloo_process_group)  # once, however many times a script builds its state
        atexit.register(destroy_gloo_process_group)
    return state


def destroy_gloo_process_group() -> None:
    """``torch.distributed.destroy_process_group()`` while the interpreter is still whole, on the gloo backend only.

    PyTorch asks every process to call it at the end of its work (torch.distributed's "Shutdown" section); it is
    local for gloo. NCCL's is left to the trainer and the launcher: after a failure on another rank it could wait
    for a peer that never comes."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()
