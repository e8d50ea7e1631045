"""SIGTERM -> a checkpoint at the end of the optimizer step in progress, then a clean exit (status 143).

Clusters preempt a job with SIGTERM and kill it (SIGKILL) a grace period later (SLURM's ``KillWait``, Kubernetes'
``terminationGracePeriodSeconds``); ``torchrun``/``accelerate launch`` pass the SIGTERM they get on to every
process, and a scheduler may also signal every process itself. While :func:`sigterm_saves` is active:

- SIGTERM only sets a flag (in the main thread: Python runs handlers between bytecodes, so a step's collective or
  forward pass finishes first); further SIGTERMs change nothing;
- at the end of every optimizer step the flag is summed over the processes (one all-reduce of one number per step,
  multi-process only), so every process agrees to stop at the same step even when the signal reached them at
  different moments;
- that step is then checkpointed by the Trainer's own path (``control.should_save``: the same files, rotation and
  completeness as a scheduled save) and training stops; ``RLVRTrainer.train`` raises :class:`TrainingPreempted`
  (a ``SystemExit`` with status 143 = 128 + SIGTERM, as a process killed by the signal reports) so that code after
  ``train()`` (saving a "final" model, evaluating) does not run on a job being taken away.
- a SIGTERM that arrives after the last step's end (nothing left to checkpoint for it) is raised again when
  ``train()`` ends, for the handler that was there before (by default: the process ends, as it would have).

Resume with ``resume_from_checkpoint=True``. It is on by default (``RLVRConfig.save_on_sigterm``) where it is safe:
only in the main thread, and only when no other SIGTERM handler than the default (or transformers'
``enable_jit_checkpoint`` one, which this replaces: it checkpoints in the middle of a step and each process on its
own) is installed; the previous handler is put back when ``train()`` returns or raises.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

import torch
from transformers import TrainerCallback

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_STATUS = 128 + signal.SIGTERM  # 143


class TrainingPreempted(SystemExit):
    """Training stopped on SIGTERM after writing ``checkpoint``; a ``SystemExit`` (status 143), so an uncaught one
    ends the process without a traceback."""

    def __init__(self, checkpoint: str, step: int):
        super().__init__(PREEMPTED_EXIT_STATUS)
        self.checkpoint, self.step = checkpoint, step

    def __str__(self) -> str:
        return f"SIGTERM: training stopped after step {self.step}, saved in {self.checkpoint}"


class SaveOnSigterm(TrainerCallback):
    """Checkpoint and stop at the end of the step in which any process received SIGTERM (see the module)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.requested = False  # this process received SIGTERM
        self.stopped_at: int | None = None  # the step checkpointed on SIGTERM
        self._previous = None  # the handler in place before install()
        self._installed = False

    # -- the signal -------------------------------------------------------------------------------------------
    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.info("save_on_sigterm: train() runs outside the main thread, where no signal handler can be set")
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous not in (signal.SIG_DFL, None) and not _is_transformers_jit_handler(previous):
            logger.info("save_on_sigterm: a SIGTERM handler is already installed (%r); it is left in place", previous)
            return
        self._previous, self._installed = previous, True
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False

    def _on_sigterm(self, signum, frame) -> None:
        self.requested = True  # only a flag: the step in progress finishes, then on_step_end decides

    # -- the step ---------------------------------------------------------------------------------------------
    def on_step_end(self, args, state, control, **kwargs):
        if self._any_process_requested():
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
            logger.warning("SIGTERM received: saving checkpoint-%d, then stopping (resume with "
                           "resume_from_checkpoint=True)", state.global_step)
        return control

    def _any_process_requested(self) -> bool:
        accelerator = self.trainer.accelerator
        if accelerator.num_processes == 1:
            return self.requested
        flag = torch.tensor([1.0 if self.requested else 0.0], device=accelerator.device)
        return bool(accelerator.reduce(flag, reduction="sum").item() > 0)


def _is_transformers_jit_handler(handler) -> bool:
    owner = getattr(handler, "__self__", None)
    return type(owner).__module__ == "transformers.trainer_jit_checkpoint"


@contextlib.contextmanager
def sigterm_saves(trainer, enabled: bool = True):
    """While training: a :class:`SaveOnSigterm` callback on ``trainer`` and its SIGTERM handler (both removed on the
    way out). Yields the callback (or None when ``enabled`` is false); after the block, if it stopped training,
    raises :class:`TrainingPreempted` (unless the block raised)."""
    if not enabled:
        yield None
        return
    callback = SaveOnSigterm(trainer)
    trainer.add_callback(callback)
    callback.install()
    try:
        yield callback
    finally:
        callback.uninstall()
        trainer.remove_callback(callback)
        if callback.requested and callback.stopped_at is None:
            # the signal came after the last step's end (or training raised first): nothing was saved for it, so
            # it goes to the handler that was there before, as if this one had never been installed
            logger.warning("SIGTERM received after the last optimizer step: no checkpoint was written for it")
            signal.raise_signal(signal.SIGTERM)
    if callback.stopped_at is not None:
        import os

        folder = os.path.join(trainer.args.output_dir, f"checkpoint-{callback.stopped_at}")
        trainer.accelerator.wait_for_everyone()  # every process has written its part of the checkpoint
        raise TrainingPreempted(folder, callback.stopped_at)
