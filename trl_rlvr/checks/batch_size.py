r"""Whether a recipe trains on enough rollouts per optimizer step for its learning rate (a doctor check, no model).

The gradient of a step is an average over its B rollouts; its noise falls as 1/sqrt(B), while Adam's update has
about the size of the learning rate whatever the gradient's scale. Adam's square-root scaling rule (Malladi et al.,
2022, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms") keeps training the same when lr grows as
sqrt(B), so the quantity compared here is ``lr / sqrt(B)``.

The published RLVR runs that improved their models train with full fine-tuning at lr ~1e-6 on B = 1024-8192
rollouts per step (DAPO 512 x 16; SimpleRL-Zoo on Qwen2.5-0.5B 1024 x 8; ToRL 128 x 16; DeepScaleR 128 x 8):
``lr / sqrt(B)`` of about 1.1e-8 to 3.1e-8. A 135M model trained on a CPU cannot afford such batches, and tolerates
larger steps; the bound, :data:`MAX_LR_PER_SQRT_ROLLOUT` = 1.5e-6, is drawn from the tool job's runs (SmolLM2-135M
from a supervised cold start, full fine-tuning): its RL added 10.2 points of held-out pass@1 (mean of three seeds) at 32
rollouts x lr 5e-6 (8.8e-7) and 14.0 at 32 x 8e-6 (1.4e-6), and lost 8-35 points in each of its six runs at 2.5e-6
or more (16 rollouts at 1e-5 and 2e-5, 32 and 64 at 2e-5; one update at 5e-6 moved its negative-advantage
rollouts' mean log-probability by -8.6 nats). 1.5e-6, the geometric middle of 8.8e-7 and 2.5e-6, was set before
the 1.4e-6 runs and holds them; it is 50x the published runs' largest. Those runs also differ in their task and
their cold start, so the boundary is consistent with every run measured, not pinned down by this number alone.
LoRA, whose updates are low-rank and whose published learning rates are ~10x full fine-tuning's, gets 10x
(:data:`LORA_FACTOR`). A warning, not an error: the first main job (16 rollouts at 3e-5 from a base model, 5x the
bound) learns its format with steps that move its negatives by up to -19 nats, which the policy-shift metrics
(``trl_rlvr.algorithms.policy_shift``) show.
"""

from __future__ import annotations

import math

from trl_rlvr.checks.verdicts import Check

#: Largest ``learning_rate / sqrt(rollouts per optimizer step)`` without a warning (full fine-tuning).
MAX_LR_PER_SQRT_ROLLOUT = 1.5e-6
#: How much more LoRA (``use_peft``) may take.
LORA_FACTOR = 10.0


def rollouts_per_step(config, num_processes: int = 1) -> int:
    """Rollouts one optimizer step trains on: ``per_device_train_batch_size * gradient_accumulation_steps *
    num_processes`` (TRL's unit of a micro-batch is a rollout)."""
    return int(config.per_device_train_batch_size) * int(config.gradient_accumulation_steps) * int(num_processes)


def rollouts_for_learning_rate(learning_rate: float, rollouts: int, *, lora: bool = False,
                               bound: float = MAX_LR_PER_SQRT_ROLLOUT) -> str | None:
    """A warning when ``learning_rate / sqrt(rollouts)`` is above the bound (x ``LORA_FACTOR`` with LoRA), naming the
    rollouts per step the learning rate needs and the learning rate these rollouts allow; None when it fits."""
    if rollouts < 1 or not learning_rate > 0:
        raise ValueError(f"rollouts ({rollouts}) must be >= 1 and learning_rate ({learning_rate}) > 0")
    limit = bound * (LORA_FACTOR if lora else 1.0)
    lr_per_sqrt_rollout = learning_rate / math.sqrt(rollouts)
    if lr_per_sqrt_rollout <= limit:
        return None
    needed = math.ceil((learning_rate / limit) ** 2)
    kind = "LoRA" if lora else "full fine-tuning"
    return (f"learning_rate={learning_rate:g} on {rollouts} rollouts per optimizer step ({kind}): lr/sqrt(rollouts) = {lr_per_sqrt_rollout:.2g}, {lr_per_sqrt_rollout / limit:.0f}x the bound {limit:.2g} "
            f"(trl_rlvr.checks.batch_size: where RL started to lose); such steps move the batch's log-probabilities by whole nats (the policy-shift "
            f"metrics show it). Train on >= {needed} rollouts per step (per_device_train_batch_size x "
            f"gradient_accumulation_steps x processes), or lower learning_rate to <= {limit * math.sqrt(rollouts):.2g}")


def rollouts_per_step_verdict(config, num_processes: int = 1, lora: bool = False) -> Check:
    """The doctor's verdict (``warn`` or ``ok``) of :func:`rollouts_for_learning_rate` for a built config
    (``RLVRConfig`` or ``GRPOConfig``) launched on ``num_processes`` processes, with LoRA or not."""
    rollouts = rollouts_per_step(config, num_processes)
    lr = float(config.learning_rate)
    limit = MAX_LR_PER_SQRT_ROLLOUT * (LORA_FACTOR if lora else 1.0)
    numbers = {"learning_rate": lr, "rollouts_per_step": rollouts, "lr_per_sqrt_rollout": lr / math.sqrt(rollouts),
               "bound": limit, "lora": lora}
    message = rollouts_for_learning_rate(lr, rollouts, lora=lora)
    if message is None:
        return Check("step size", "ok", f"learning_rate={lr:g} on {rollouts} rollouts per optimizer step: "
                     f"lr/sqrt(rollouts) = {numbers['lr_per_sqrt_rollout']:.2g} <= {limit:.2g}", numbers=numbers)
    summary, _, advice = message.partition(". Train on")
    return Check("step size", "warn", summary, "Train on" + advice, numbers=numbers)
