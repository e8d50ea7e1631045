"""How far each optimizer step moved the policy on the rollouts it trained on, logged every step, with an alarm.

``RLVRConfig.policy_shift_metrics`` turns it on. Per optimizer step:

- *old*: the log-probabilities the loss computed for each of the step's micro-batches (the policy before the step,
  the one whose ratio the PPO clip bounds), recorded as TRL computes them (:meth:`PolicyShiftCallback.recording`,
  around ``compute_loss``: the one call of TRL's ``_get_per_token_logps_and_entropies`` that runs with gradients);
- *new*: after the optimizer step (``on_step_end``), the same micro-batches scored again under the updated policy
  with the same TRL function (its temperature, its chunking), without gradients: one forward pass over the step's
  rollouts, the metrics' whole cost, logged as ``rlvr/shift_seconds``;
- the metrics of :mod:`trl_rlvr.algorithms.policy_shift` over the step's global batch (sums reduced over processes):
  ``rlvr/shift_pos_logp``, ``rlvr/shift_neg_logp`` (mean change of a rollout's summed log-probability, positive and
  negative advantage, in nats), ``rlvr/shift_kl`` (KL(old||new) per token, k3), ``rlvr/shift_token_max_abs``;
- the alarm: when one step moves a trained token's log-probability by more than ``policy_shift_alarm_token_nats``
  (or, when set, either sign's rollouts by more than ``policy_shift_alarm_nats``, the KL above
  ``policy_shift_alarm_kl``; the bound argued in docs/tool_rl.md), a warning (the first time, with the numbers; later
  steps are counted, not repeated) and ``rlvr/alarm/policy_shift`` = 1 for that step (0 otherwise: its mean over a
  logging window is the fraction of steps that fired).

The tokens are the loss's: ``completion_mask`` times ``tool_mask`` (a tool's reply is not the policy's). The
metrics need the loss's forward pass: with ``use_liger_kernel`` (which computes the loss without it) nothing is
recorded and nothing logged.
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch
from transformers import TrainerCallback

from trl_rlvr.algorithms.losses import loss_mask
from trl_rlvr.algorithms.policy_shift import shift_alarm, shift_metrics, shift_sums

logger = logging.getLogger(__name__)

#: ``shift/`` metric of :mod:`trl_rlvr.algorithms.policy_shift` -> the name it is logged under.
LOGGED_AS = {"shift/logp_pos": "rlvr/shift_pos_logp", "shift/logp_neg": "rlvr/shift_neg_logp",
             "shift/kl_old_new": "rlvr/shift_kl", "shift/token_logp_max_abs": "rlvr/shift_token_max_abs"}


class PolicyShiftCallback(TrainerCallback):
    """The metrics of the module docstring for ``trainer`` (an RLVRTrainer); ``enabled`` False: records nothing."""

    def __init__(self, trainer, enabled: bool):
        self.trainer, self.enabled = trainer, enabled
        self.recorded: list[tuple[dict, torch.Tensor]] = []  # (micro-batch, old log-probs) of the step in progress
        self.fired = 0

    @contextlib.contextmanager
    def recording(self, inputs: dict):
        """Around ``compute_loss``: note the micro-batch and the log-probabilities its loss computes."""
        trainer = self.trainer
        if not (self.enabled and trainer.model.training and torch.is_grad_enabled()):
            yield
            return
        with trainer.observing_loss_logprobs(lambda logps: self.recorded.append((inputs, logps))):
            yield

    def on_train_begin(self, args, state, control, **kwargs):
        self.recorded, self.fired = [], 0

    def on_step_end(self, args, state, control, **kwargs):
        recorded, self.recorded = self.recorded, []
        if not self.enabled:
            return
        trainer = self.trainer
        start = time.perf_counter()
        sums = torch.zeros(7, dtype=torch.float64, device=trainer.accelerator.device)
        for batch, old in recorded:
            new = self.score(batch)
            mask = loss_mask(batch)
            advantages = batch["advantages"] if batch["advantages"].dim() == 1 else batch["advantages"][:, 0]
            part = shift_sums(old, new, mask, advantages).to(sums.device)
            sums = torch.cat([sums[:6] + part[:6], torch.maximum(sums[6:], part[6:])])
        elapsed = time.perf_counter() - start
        total = trainer.accelerator.reduce(sums[:6].clone(), reduction="sum")
        biggest = trainer.accelerator.gather(sums[6:].clone()).max().reshape(1)
        shift = shift_metrics(torch.cat([total, biggest]).cpu())
        if not total[5] > 0:  # no trained token in the step (skipped or empty): nothing to say
            return
        metrics = trainer.metrics_to_log("train")
        for name, value in shift.items():
            metrics[LOGGED_AS[name]].append(value)
        metrics["rlvr/shift_seconds"].append(elapsed)
        message = shift_alarm(shift, trainer.args.policy_shift_alarm_token_nats, trainer.args.policy_shift_alarm_nats,
                              trainer.args.policy_shift_alarm_kl)
        metrics["rlvr/alarm/policy_shift"].append(float(message is not None))
        if message is not None:
            self.fired += 1
            if self.fired == 1:
                logger.warning("trl-rlvr alarm policy_shift at step %d: %s (later steps that fire are counted in "
                               "rlvr/alarm/policy_shift, not repeated here)", state.global_step, message)

    def score(self, batch: dict) -> torch.Tensor:
        """(B, T) log-probabilities of the micro-batch's completion tokens under the trainer's current policy."""
        return self.trainer.completion_logps(batch, self.trainer.model)
