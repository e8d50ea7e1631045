"""An optimizer step whose micro-batches all came from empty dynamic-sampling batches is skipped.

Running it at learning rate 0 would not leave the optimizer alone: AdamW still decays its moments (``exp_avg``,
``exp_avg_sq``), applies its weight decay and counts the step. So that step updates nothing and does not advance the
learning-rate schedule, the way transformers' ``Trainer`` treats a step that mixed precision skipped; ``global_step``
still counts it. Two transformers callback events do it, with public torch calls only:

- ``on_pre_optimizer_step`` (after the gradients are clipped and their norm logged): the step's gradients are
  dropped (``optimizer.zero_grad(set_to_none=True)``). A torch optimizer skips a parameter whose gradient is None
  altogether: no moment, no weight decay, no step count (``torch.optim.Optimizer.zero_grad``'s documented
  behavior; torch's, bitsandbytes' and transformers' optimizers all do). The scheduler's state and the learning
  rates are noted.
- ``on_step_end`` (after ``Trainer`` stepped the scheduler): the scheduler's state and each parameter group's
  learning rate are put back (``load_state_dict``), as if it had not stepped.

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
        self.schedule: tuple[dict, list[float]] | None = None  # of a skipped step: the scheduler's state, the lrs

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        has_signal, self.step_has_signal = self.step_has_signal, False
        if not has_signal:
            optimizer, scheduler = self.trainer.optimizer, self.trainer.lr_scheduler
            optimizer.zero_grad(set_to_none=True)  # every parameter skipped by the step that follows
            self.schedule = (copy.deepcopy(scheduler.state_dict()), [group["lr"] for group in optimizer.param_groups])

    def on_step_end(self, args, state, control, **kwargs):  # after Trainer's scheduler step
        if self.schedule is None:
            return
        (scheduler_state, learning_rates), self.schedule = self.schedule, None
        self.trainer.lr_scheduler.load_state_dict(scheduler_state)
        for group, lr in zip(self.trainer.optimizer.param_groups, learning_rates, strict=True):
            group["lr"] = lr
