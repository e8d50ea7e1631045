r"""Loss normalization helpers (pure functions).

The per-token PPO-clip loss and its three aggregations are TRL's own code (``GRPOTrainer._compute_loss``,
``loss_type`` ``grpo`` / ``dapo`` / ``dr_grpo``), which tests/algorithms/test_loss_normalization.py holds to an
independent reference. One piece needs help to be exact: DAPO's token-level loss divides by the number
of answer tokens T_s in the *global batch of optimizer step s* (all processes, all gradient-accumulation
micro-steps). TRL divides each micro-step's summed loss by::

    num_items_in_batch / num_processes * gradient_accumulation_steps / steps_per_generation

with ``num_items_in_batch`` the tokens of the whole generation batch. That equals T_s / num_processes only
when one generation batch is exactly one optimizer step. When a generation batch spans several optimizer
steps (steps_per_generation = k * gradient_accumulation_steps), the micro-batches of different steps hold
different numbers of tokens. :func:`per_step_num_items` gives each micro-batch the value of
``num_items_in_batch`` that makes TRL's divisor exactly T_s / num_processes.
"""

from __future__ import annotations

import torch


def per_step_num_items(global_tokens_per_micro_batch: torch.Tensor, gradient_accumulation_steps: int) -> torch.Tensor:
    """For each micro-batch of a generation batch, the ``num_items_in_batch`` that makes TRL's "dapo" divisor exact.

    Args:
        global_tokens_per_micro_batch: (steps_per_generation,) answer tokens of each micro-batch, summed over
            processes, in the order the trainer consumes them.
        gradient_accumulation_steps: micro-batches per optimizer step; must divide steps_per_generation.

    Returns:
        (steps_per_generation,) float tensor: T_s * steps_per_generation / gradient_accumulation_steps, where
        T_s is the token count of the optimizer step the micro-batch belongs to.
    """
    steps_per_generation = global_tokens_per_micro_batch.numel()
    if steps_per_generation % gradient_accumulation_steps:
        raise ValueError(
            f"steps_per_generation ({steps_per_generation}) must be a multiple of gradient_accumulation_steps "
            f"({gradient_accumulation_steps}) for an exact per-step token count"
        )
    per_step = global_tokens_per_micro_batch.float().view(-1, gradient_accumulation_steps).sum(dim=1)
    per_micro = per_step.repeat_interleave(gradient_accumulation_steps)
    return per_micro * steps_per_generation / gradient_accumulation_steps
