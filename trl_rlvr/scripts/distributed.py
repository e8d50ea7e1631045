"""The one rule for the process state a script builds before the trainer's ``Accelerator`` exists."""

from __future__ import annotations

from trl_rlvr._compat.gloo_exit import destroy_gloo_process_group_at_exit


def distributed_state(use_cpu: bool = False):
    """accelerate's ``PartialState`` for this process, right on a CPU launch too.

    Built with ``cpu=True`` when ``use_cpu`` (``--use_cpu``), ``ACCELERATE_USE_CPU`` or the machine has no
    accelerator: a bare ``PartialState()`` built before the trainer's ``Accelerator`` on a CPU says "1 process,
    rank 0" on every rank of a gloo launch (every rank would then convert the model, print as the main process and
    work on the whole data).

    On a gloo launch the process group is destroyed when the script exits
    (:mod:`trl_rlvr._compat.gloo_exit`): left to the interpreter's finalization, gloo's worker threads can abort a
    rank that has finished its work, failing the launch."""
    import torch
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    cpu = bool(use_cpu) or parse_flag_from_env("ACCELERATE_USE_CPU") or not torch.accelerator.is_available()
    state = PartialState(cpu=cpu)
    if state.num_processes > 1:
        destroy_gloo_process_group_at_exit()
    return state

