r"""The three loss normalizations on packed tokens, as TRL's asynchronous trainer holds them (pure functions).

``AsyncGRPOTrainer`` packs each micro-batch into one flat row per process: the loss tokens ``l_k`` (K,) of that
process, ``segment_id`` (K,) the completion (training row) each belongs to. Processes average their gradients
(DDP/FSDP: the mean over P processes), so each process divides its summed loss by its share, ``1/P``, of the global
divisor. With ``T`` the loss tokens and ``N`` the completions of the micro-batch over every process, ``n_i`` the
tokens of completion ``i``, ``C`` the constant:

    per_batch_token (DAPO, TRL's own):  (1/T) sum_i sum_t l_it
    per_answer (GRPO):                  (1/N) sum_i (1/n_i) sum_t l_it
    constant (Dr. GRPO):                (1/(N C)) sum_i sum_t l_it

A completion's tokens are all in one process's row, so the per-answer mean is taken locally. TRL then divides by the
gradient-accumulation steps (each micro-batch is normalized by its own counts, as TRL's trainer does).
"""

from __future__ import annotations

import torch

#: ``loss_normalization`` values of the asynchronous trainer.
NORMALIZATIONS = ("per_answer", "per_batch_token", "constant")


def local_answer_count(segment_id: torch.Tensor) -> int:
    """Completions in this process's row (segments with at least one loss token)."""
    return int(torch.unique(segment_id).numel())


def packed_loss(per_token_loss: torch.Tensor, segment_id: torch.Tensor, normalization: str, *,
                global_tokens: float, global_answers: float, num_processes: int,
                loss_constant: float | None = None) -> torch.Tensor:
    """This process's share of the micro-batch loss (module docstring): the mean over processes of the values
    returned is the normalized loss of the whole micro-batch.

    Args:
        per_token_loss: (K,) this process's per-token losses.
        segment_id: (K,) the completion each token belongs to (0..S-1, any order).
        normalization: one of :data:`NORMALIZATIONS`.
        global_tokens, global_answers: ``T`` and ``N`` over every process.
        num_processes: ``P``.
        loss_constant: ``C`` (``constant`` only).
    """
    share = num_processes
    if normalization == "per_batch_token":
        return per_token_loss.sum() * share / max(float(global_tokens), 1.0)
    if normalization == "per_answer":
        num = int(segment_id.max()) + 1 if segment_id.numel() else 0
        sums = torch.zeros(num, dtype=per_token_loss.dtype, device=per_token_loss.device).index_add_(
            0, segment_id, per_token_loss)
        counts = torch.bincount(segment_id, minlength=num).to(per_token_loss.dtype)
        per_answer = sums[counts > 0] / counts[counts > 0]
        return per_answer.sum() * share / max(float(global_answers), 1.0)
    if normalization == "constant":
        if loss_constant is None or not loss_constant > 0:
            raise ValueError(f"loss_normalization='constant' needs a positive loss_constant, got {loss_constant!r}")
        return per_token_loss.sum() * share / (max(float(global_answers), 1.0) * float(loss_constant))
    raise ValueError(f"loss_normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
