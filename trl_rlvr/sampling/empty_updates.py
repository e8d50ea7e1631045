"""An optimizer step whose micro-batches all came from empty dynamic-sampling batches is skipped.

Running it at learning rate 0 would not leave the optimizer alone: AdamW still decays its moments (``exp_avg``,
``exp_avg_sq``), applies its weight decay and counts the step. So that step updates nothing and does not advance the
learning-rate schedule, the way transformers' ``Trainer`` treats a step that mixed precision skipped; ``global_step``
still counts it. Two transformers callback events do it, with public torch calls only:

- ``on_pre_optimizer_step`` (after the gradients are clipped and their norm logged): the step's gradients are
  dropped (``optimizer.zero_grad(set_to_none=True)``). A torch optimizer skips a parameter whose gradient is None
  altogether: no moment, no weight decay, no step count (``torch.optim.Optimizer.zero_grad``'s documented
  behavior; torch's, bitsandbytes' and transformers' optimizers all do). The scheduler's state and the learning
  rates are noted, and with fp16's gradient scaler (``accelerator.scaler``) its state.
- ``on_step_end`` (after ``Trainer`` stepped the scheduler): the scheduler's state and each parameter group's
  learning rate are put back (``load_state_dict``), as if it had not stepped; so is the gradient scaler's (its
  ``update`` after the empty step would count the step towards growing the scale). The gradients were unscaled
  before the event (transformers computes their norm through ``accelerator.clip_grad_norm_`` at every optimizer
  step), so the scaler's ``step`` finds its inf check and runs the optimizer's no-op step.

The decision comes from the gathered rewards, so every process skips the same steps. Under DeepSpeed the engine
steps its optimizer inside ``backward``, which this does not reach (its zero gradient then moves the moments as
before).
"""

from __future__ import annotations

import copy

from transformers import TrainerCallback


class SkipEmptyUpdatesCallback(TrainerCallback):
    """Between ``on_pre_optimizer_step`` and ``on_step_end``, a step no micro-batch with signal fed updates nothing
    and leaves the learning-rate schedule where it was; the trainer sets :attr:`step_has_signal` for each
    micro-batch that can carry a gradient."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.step_has_signal = False
        self.saved: tuple[dict, list[float], dict | None] | None = None  # of a skipped step: scheduler, lrs, scaler

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        has_signal, self.step_has_signal = self.step_has_signal, False
        if has_signal:
            return
        trainer = self.trainer
        optimizer, scaler = trainer.optimizer, getattr(trainer.accelerator, "scaler", None)
        optimizer.zero_grad(set_to_none=True)  # every parameter skipped by the step that follows
        self.saved = (copy.deepcopy(trainer.lr_scheduler.state_dict()), [group["lr"] for group in optimizer.param_groups],
                      None if scaler is None else scaler.state_dict())

    def on_step_end(self, args, state, control, **kwargs):  # after Trainer's scheduler step
        if self.saved is None:
            return
        (scheduler_state, learning_rates, scaler_state), self.saved = self.saved, None
        self.trainer.lr_scheduler.load_state_dict(scheduler_state)
        for group, lr in zip(self.trainer.optimizer.param_groups, learning_rates, strict=True):
            group["lr"] = lr
        if scaler_state is not None:
            self.trainer.accelerator.scaler.load_state_dict(scaler_state)
