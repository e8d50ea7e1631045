"""An empty update under fp16's gradient scaler: transformers' step sequence, with torch's GradScaler on a CPU.

(The trainer-level test, test_dynamic_sampling.test_an_empty_update_leaves_the_optimizer_and_the_weights_alone, runs
without a scaler: fp16 mixed precision needs CUDA.)"""

import copy
import types

import torch

from trl_rlvr.sampling.empty_updates import SkipEmptyUpdatesCallback


class ScaledOptimizer:
    """accelerate's ``AcceleratedOptimizer`` under fp16, as far as a step goes: its ``step`` is the scaler's ``step``
    then ``update`` (skipped when the scaler found an inf)."""

    def __init__(self, optimizer, scaler):
        self.optimizer, self.scaler, self.step_was_skipped = optimizer, scaler, False

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self):
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.step_was_skipped = self.scaler.get_scale() < scale


def transformers_step(model, trainer, callback, signal: bool) -> None:
    """One optimizer step in transformers' order: backward (scaled), the gradient norm (which unscales),
    on_pre_optimizer_step, the optimizer's step, the scheduler's step, zero_grad, on_step_end."""
    scaler, optimizer = trainer.accelerator.scaler, trainer.optimizer
    loss = model(torch.ones(3, 4)).square().sum() * (1.0 if signal else 0.0)  # no signal: advantage 0, gradient 0
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer.optimizer)  # accelerator.clip_grad_norm_, called at every step
    callback.step_has_signal = signal
    callback.on_pre_optimizer_step(None, None, None)
    optimizer.step()
    if not optimizer.step_was_skipped:
        trainer.lr_scheduler.step()
    optimizer.zero_grad()
    callback.on_step_end(None, None, None)


def snapshot(model, trainer):
    return (copy.deepcopy(model.state_dict()), copy.deepcopy(trainer.optimizer.optimizer.state_dict()["state"]),
            trainer.accelerator.scaler.state_dict(), trainer.lr_scheduler.state_dict()["last_epoch"],
            [group["lr"] for group in trainer.optimizer.param_groups])


def test_an_empty_update_under_a_gradient_scaler_changes_nothing_and_the_next_step_runs():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    scaler = torch.amp.GradScaler("cpu", growth_interval=1)  # its scale would double at every counted step
    optimizer = ScaledOptimizer(torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1), scaler)
    trainer = types.SimpleNamespace(optimizer=optimizer, accelerator=types.SimpleNamespace(scaler=scaler),
                                    lr_scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer.optimizer, lambda s: 1 / (1 + s)))
    callback = SkipEmptyUpdatesCallback(trainer)
    transformers_step(model, trainer, callback, signal=True)
    params, state, scale, epoch, lrs = snapshot(model, trainer)
    transformers_step(model, trainer, callback, signal=False)
    params2, state2, scale2, epoch2, lrs2 = snapshot(model, trainer)
    assert all(torch.equal(params[k], params2[k]) for k in params)
    assert state.keys() == state2.keys() and all(torch.equal(state[i][k], state2[i][k]) for i in state for k in state[i])
    assert (scale2, epoch2, lrs2) == (scale, epoch, lrs)
    transformers_step(model, trainer, callback, signal=True)  # the scaler's per-step state was reset by its update
    assert not all(torch.equal(params[k], v) for k, v in model.state_dict().items())
