"""An optimizer step whose micro-batches all came from empty dynamic-sampling batches is skipped.

Running it at learning rate 0 would not leave the optimizer alone: AdamW still decays its moments (``exp_avg``,
``exp_avg_sq``) and counts the step. So for that step ``optimizer.step`` and the scheduler's ``step`` are no-ops, the
way transformers' ``Trainer`` treats a step that mixed precision skipped (no update, learning-rate schedule not
advanced); ``global_step`` still counts it. The decision comes from the gathered rewards, so every process skips the
same steps. Under DeepSpeed the engine steps its optimizer inside ``backward``, which this does not reach (its zero
gradient then moves the moments as before).
"""

from __future__ import annotations

from transformers import TrainerCallback


class SkipEmptyUpdatesCallback(TrainerCallback):
    """Between ``on_pre_optimizer_step`` and ``on_step_end``, a step no micro-batch with signal fed is a no-op;
    the trainer sets :attr:`step_has_signal` for each micro-batch that can carry a gradient."""

    def __init__(self, trainer):
        self.trainer, self.restore = trainer, []
        self.step_has_signal = False

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        has_signal, self.step_has_signal = self.step_has_signal, False
        if not has_signal:
            self.restore = [shadow(self.trainer.optimizer, "step"), shadow(self.trainer.lr_scheduler, "step")]

    def on_step_end(self, args, state, control, **kwargs):  # after Trainer's scheduler step
        for restore in self.restore:
            restore()
        self.restore = []


def shadow(obj, name: str):
    """Replace the method ``obj.name`` by a no-op on this instance; returns the function that undoes it (an
    instance attribute already there, such as torch's step-counting wrapper, is put back)."""
    had, old = name in vars(obj), vars(obj).get(name)
    setattr(obj, name, lambda *args, **kwargs: None)

    def restore():
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)

    return restore
