r"""How far one update moved the policy on the batch it trained on (pure functions on tensors).

After an optimizer step, the batch's tokens are scored again under the updated policy (one forward pass without
gradients) and set against the log-probabilities the loss used (``old``, the policy that sampled them)::

    dlogp_i   = sum_t m_it (log pi_new(y_it) - log pi_old(y_it))          (nats per rollout)
    shift/logp_pos = mean of dlogp_i over rollouts with A_i > 0
    shift/logp_neg = mean of dlogp_i over rollouts with A_i < 0
    shift/kl_old_new = (1 / sum m) sum_it m_it k3(r_it),  r = pi_new / pi_old,  k3(r) = (r - 1) - log r

``k3`` (Schulman, 2020, "Approximating KL Divergence") is an unbiased estimate of KL(old || new) from tokens
sampled by ``old`` and never negative: E_old[r] = 1, so E_old[(r - 1) - log r] = E_old[log old - log new].

A step raises ``logp_pos`` and lowers ``logp_neg``; by how much a healthy step may do so depends on the run. Measured
on the two CPU main jobs' default steps (policy_shift_metrics=True, docs/tool_rl.md): the first main job
(``examples/r1zero.py``, which takes held-out accuracy from 0% to 20%) moves its negatives by -19 and -8.8 nats per
rollout in steps 1 and 2 (-2.2 to -6.3 later), KL(old||new) up to 0.23 per token, its largest single token by at
most 4.3 nats in its 9 steps; the tool
job (``examples/tool_r1.py``, whose RL loses 19 points of held-out pass@1 against its cold start) moves its
negatives by -8.6 nats and its positives by +0.19 in step 1, KL 0.067, and one token by 8.7 nats: a token its
policy sampled made e^-8.7 = 1/6000 as likely in one update. The per-rollout and KL metrics do not tell the two
apart (the failing step is the smaller on both); the largest token change does. :func:`shift_alarm` fires on it
(:data:`SHIFT_ALARM_TOKEN_NATS`); bounds on the per-rollout change and on the KL are optional.
"""

from __future__ import annotations

import math

import torch

#: Alarm when one trained token's log-probability changes by more than this in one update (nats): e^6 ~ 400x.
#: Between the largest change of the first main job's healthy steps (4.3) and the tool job's failing one (8.7).
SHIFT_ALARM_TOKEN_NATS = 6.0


def k3_kl(old_logps: torch.Tensor, new_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(old || new) for tokens sampled by ``old``: ``(r - 1) - log r``, ``r = exp(new -
    old)`` (same shape as the inputs; >= 0)."""
    log_ratio = (new_logps - old_logps).float()
    return torch.expm1(log_ratio) - log_ratio


#: The sums :func:`shift_sums` returns, in order (added over micro-batches and processes; the last is a maximum).
SHIFT_SUMS = ("dlogp_pos", "n_pos", "dlogp_neg", "n_neg", "kl_tokens", "tokens", "token_max_abs")


def shift_sums(old_logps: torch.Tensor, new_logps: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor
               ) -> torch.Tensor:
    """(7,) float64 sums of one batch (:data:`SHIFT_SUMS`): summed per-rollout log-prob change and count of the
    positive- and of the negative-advantage rollouts, masked k3 sum and token count, largest token change. Sums of
    several micro-batches (processes) add, the last entry takes the maximum: :func:`shift_metrics` of the total is
    :func:`policy_shift` of the whole batch."""
    if old_logps.shape != new_logps.shape or old_logps.shape != mask.shape or advantages.shape != old_logps.shape[:1]:
        raise ValueError(f"policy_shift: old {tuple(old_logps.shape)}, new {tuple(new_logps.shape)}, mask "
                         f"{tuple(mask.shape)} must be (N, T) and advantages {tuple(advantages.shape)} (N,)")
    m = mask.to(torch.float64)
    delta = (new_logps.double() - old_logps.double()) * m
    per_rollout = delta.sum(dim=1)
    pos, neg = advantages > 0, advantages < 0
    kl = (k3_kl(old_logps.double(), new_logps.double()) * m).sum()
    biggest = delta.abs().max() if delta.numel() else torch.zeros((), dtype=torch.float64, device=delta.device)
    return torch.stack([per_rollout[pos].sum(), pos.sum().double(), per_rollout[neg].sum(), neg.sum().double(), kl,
                        m.sum(), biggest.to(torch.float64)])


def shift_metrics(sums: torch.Tensor) -> dict[str, float]:
    """The ``shift/`` metrics of :func:`policy_shift` from :func:`shift_sums` (NaN where nothing was counted)."""
    dpos, npos, dneg, nneg, kl, tokens, biggest = sums.tolist()
    return {
        "shift/logp_pos": dpos / npos if npos else math.nan,
        "shift/logp_neg": dneg / nneg if nneg else math.nan,
        "shift/kl_old_new": kl / tokens if tokens else math.nan,
        "shift/token_logp_max_abs": biggest if tokens else math.nan,
    }


def policy_shift(old_logps: torch.Tensor, new_logps: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor
                 ) -> dict[str, float]:
    """The ``shift/`` metrics of one update (module docstring).

    Args:
        old_logps, new_logps: (N, T) log-probabilities of each completion token before and after the update.
        mask: (N, T) 1 for the tokens the loss trained on (model tokens; tool replies and padding 0).
        advantages: (N,) the advantage each rollout was trained with.

    Returns ``shift/logp_pos``, ``shift/logp_neg`` (NaN when no rollout has that sign), ``shift/kl_old_new``,
    ``shift/token_logp_max_abs`` (the largest change of one trained token).
    """
    return shift_metrics(shift_sums(old_logps, new_logps, mask, advantages))


def shift_alarm(shift: dict[str, float], max_token_nats: float | None = SHIFT_ALARM_TOKEN_NATS,
                max_nats: float | None = None, max_kl: float | None = None) -> str | None:
    """A sentence when one update moved the batch by more than the bounds (a trained token's log-probability by more
    than ``max_token_nats``; when given, either sign's mean summed log-prob change above ``max_nats``, the
    per-token KL above ``max_kl``), else None. A bound of None is not checked; NaN metrics never fire."""
    parts = []
    biggest = shift.get("shift/token_logp_max_abs", math.nan)
    if max_token_nats is not None and not math.isnan(biggest) and biggest > max_token_nats:
        parts.append(f"one trained token's log-probability by {biggest:.2f} nats (bound {max_token_nats:g})")
    for key, what in (("shift/logp_pos", "positive"), ("shift/logp_neg", "negative")):
        value = shift.get(key, math.nan)
        if max_nats is not None and not math.isnan(value) and abs(value) > max_nats:
            parts.append(f"the {what}-advantage rollouts' log-probability by {value:+.2f} nats (bound {max_nats:g} "
                         "per rollout)")
    kl = shift.get("shift/kl_old_new", math.nan)
    if max_kl is not None and not math.isnan(kl) and kl > max_kl:
        parts.append(f"KL(old||new) to {kl:.3f} nats per token (bound {max_kl:g})")
    if not parts:
        return None
    return (f"one update moved {' and '.join(parts)}: the step is too large for the batch; lower the learning rate, "
            "train on more rollouts per step, add a KL to the reference (beta), or use LoRA")


def completion_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                     batch_size: int = 8) -> torch.Tensor:
    """(N, logits_to_keep) log-probabilities of the last ``logits_to_keep`` tokens of each row of ``input_ids`` under
    ``model`` (no gradients, ``batch_size`` rows per forward pass): what to score the batch with after the step.
    ``input_ids``: prompt + completion, left-padded prompts as TRL lays them out."""
    out = []
    with torch.no_grad():
        for start in range(0, input_ids.shape[0], batch_size):
            ids, att = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
            logits = model(input_ids=ids, attention_mask=att).logits[:, -logits_to_keep - 1:-1].float()
            targets = ids[:, -logits_to_keep:]
            out.append(torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1))
    return torch.cat(out)
