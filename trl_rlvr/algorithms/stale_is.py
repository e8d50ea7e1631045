r"""Importance sampling for stale rollouts: a truncated (or masked) weight on the asynchronous trainer's one ratio.

TRL's ``AsyncGRPOTrainer`` trains each rollout once, up to ``max_staleness`` weight syncs after a vLLM server sampled
it, with PPO-clip on the one ratio it has (the sampling weights are gone, so no ``pi_old`` can be recomputed)::

    r_t = pi_theta(y_t) / mu(y_t),      mu = the behaviour policy: the log-probability vLLM returned for y_t
    loss_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)

For ``A < 0`` and ``r_t > 1 + eps_high`` the minimum is ``r_t A``: the loss, and its gradient ``-r_t A grad log
pi_theta``, grow without bound in ``r_t`` (huggingface/trl#7120). Here the ratio's *weight* in the gradient is
replaced by an importance weight ``w_t`` that is bounded, while PPO's clip keeps deciding which tokens move::

    loss_t = -(w_t / sg(r_t)) * min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)
    grad loss_t = -w_t A grad log pi_theta(y_t)   on the tokens PPO's clip leaves active, 0 on the others

(``sg``: stop-gradient). The weight, from ``log rho = sg(log pi_theta - log mu)``:

- ``token_truncate``: ``w_t = clamp(rho_t, C_min, C_max)``: truncated importance sampling, IMPALA's
  ``min(rho_bar, pi/mu)`` policy-gradient weight (Espeholt et al., 2018, "IMPALA: Scalable Distributed Deep-RL with
  Importance Weighted Actor-Learner Architectures", V-trace) and TIS for the sampler/trainer mismatch (Yao et al.,
  2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training");
- ``token_mask``: ``w_t = rho_t`` inside ``[C_min, C_max]``, 0 outside (the token is dropped);
- ``sequence_truncate`` / ``sequence_mask``: the same on the completion's ratio ``rho_i = exp(sum_t log rho_t)``,
  every token of the completion weighted alike (TRL's ``vllm_importance_sampling_mode`` names, same meaning).

Bounds: ``|grad loss_t| <= C_max |A| |grad log pi_theta(y_t)|`` on both advantage signs. With ``w = sg(r)`` (no
correction) the formula is exactly TRL's loss, value and gradient; with ``mu = pi_theta`` every weight is 1 (the
bounds must hold 1: ``C_min <= 1 <= C_max``) and the loss is the on-policy one. Truncation trades variance for bias:
the truncated estimator's fixed point lies between ``mu`` and ``pi_theta`` (Espeholt et al., 2018, Theorem 1).
Dual-clip PPO (Ye et al., 2020, "Mastering Complex Control in MOBA Games with Deep Reinforcement Learning") bounds the
negative branch by cutting its gradient to 0 above ``c``; truncation keeps the token's gradient at weight ``C_max``.

A log-ratio that is not a number (a missing vLLM log-probability) weighs 0: the token (``sequence_*``: its completion)
is left out of the gradient rather than trained at weight 1, and counted in ``stale_is/clipped_frac``.

All functions work on packed, flat tokens as the async trainer holds them: (K,) per loss token, ``segment_id`` (K,)
the completion each token belongs to (0..S-1). A padded (N, T) batch passes ``x[mask]`` and
``torch.arange(N)[:, None].expand(N, T)[mask]``.
"""

from __future__ import annotations

import math

import torch

#: ``stale_is_mode`` values (TRL's ``vllm_importance_sampling_mode`` names); None: no correction (TRL's loss).
MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")

#: The sums :func:`stale_is_sums` returns, in order (added over micro-batches and processes, except the last two:
#: the largest and the smallest log-ratio, reduced by max and min).
STALE_IS_SUMS = ("count", "finite", "ratio", "log_ratio", "log_ratio_sq", "changed", "weight", "weight_sq",
                 "log_ratio_max", "log_ratio_min")


def check_stale_is(mode: str | None, clip_min: float | None, clip_max: float | None, prefix: str = "") -> None:
    """Raise ``ValueError`` naming the field when the correction's settings make no sense: an unknown mode, a
    truncation without an upper bound, bounds that do not hold 1 (``C_min <= 1 <= C_max``: an unchanged policy must
    weigh 1)."""
    if mode is None:
        return
    if mode not in MODES:
        raise ValueError(f"{prefix}stale_is_mode must be one of {MODES} or None, got {mode!r}")
    if mode.endswith("_truncate") and clip_max is None:
        raise ValueError(f"{prefix}stale_is_clip_max is required with stale_is_mode={mode!r} (the truncation bound)")
    if clip_min is not None and not 0 <= clip_min <= 1:
        raise ValueError(f"{prefix}stale_is_clip_min must be in [0, 1], got {clip_min!r}")
    if clip_max is not None and not clip_max >= 1:
        raise ValueError(f"{prefix}stale_is_clip_max must be >= 1, got {clip_max!r}")


def segment_sum(values: torch.Tensor, segment_id: torch.Tensor) -> torch.Tensor:
    """(S,) sum of ``values`` (K,) over each segment, S = ``segment_id.max() + 1`` (0 segments for K = 0)."""
    num = int(segment_id.max()) + 1 if segment_id.numel() else 0
    return torch.zeros(num, dtype=values.dtype, device=values.device).index_add_(0, segment_id, values)


def log_importance_ratio(log_ratio: torch.Tensor, segment_id: torch.Tensor, mode: str) -> torch.Tensor:
    """(K,) ``log rho`` each token is weighted by: its own log-ratio (``token_*``), or its completion's summed
    log-ratio broadcast to the completion's tokens (``sequence_*``). Detached."""
    log_ratio = log_ratio.detach()
    if mode.startswith("sequence_"):
        return segment_sum(log_ratio, segment_id)[segment_id]
    return log_ratio


def importance_weights(log_ratio: torch.Tensor, segment_id: torch.Tensor, mode: str, clip_min: float | None = None,
                       clip_max: float | None = None) -> torch.Tensor:
    """(K,) detached weights ``w`` of the module docstring for per-token ``log_ratio = log pi_theta - log mu``.

    Truncation clamps in log space, so a completion's product of ratios never overflows before it is bounded;
    a masked weight outside ``[clip_min, clip_max]`` is 0 (no bound where None); a NaN log-ratio weighs 0."""
    check_stale_is(mode, clip_min, clip_max)
    log_rho = log_importance_ratio(log_ratio, segment_id, mode)
    low = math.log(clip_min) if clip_min else -math.inf
    high = math.log(clip_max) if clip_max is not None else math.inf
    if mode.endswith("_truncate"):
        weights = torch.exp(torch.clamp(log_rho, min=low, max=high))
    else:
        inside = (log_rho >= low) & (log_rho <= high)
        weights = torch.where(inside, torch.exp(log_rho), torch.zeros_like(log_rho))
    return torch.nan_to_num(weights, nan=0.0)


def ppo_clip_active(ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float, epsilon_high: float
                    ) -> torch.Tensor:
    """(K,) bool: the tokens where PPO's ``min(r A, clip(r) A)`` takes ``r A`` (the unclipped term carries the
    gradient): not (``A > 0`` and ``r > 1 + eps_high``) and not (``A < 0`` and ``r < 1 - eps_low``)."""
    return ~(((advantages > 0) & (ratio > 1 + epsilon_high)) | ((advantages < 0) & (ratio < 1 - epsilon_low)))


def corrected_token_loss(log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, advantages: torch.Tensor,
                         segment_id: torch.Tensor, *, epsilon_low: float, epsilon_high: float,
                         mode: str | None = None, clip_min: float | None = None, clip_max: float | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token loss (K,), weights (K,)) of the module docstring's formula.

    Args:
        log_probs: (K,) ``log pi_theta`` of each loss token, with gradient.
        behaviour_log_probs: (K,) ``log mu``: the log-probabilities vLLM returned when it sampled the tokens.
        advantages: (K,) each token's completion's advantage.
        segment_id: (K,) the completion (0..S-1) each token belongs to (read by the ``sequence_*`` modes).
        epsilon_low, epsilon_high: PPO's clip range (clip-higher: ``epsilon_high > epsilon_low``).
        mode, clip_min, clip_max: the correction (:data:`MODES`; None: TRL's loss, weights = the ratio).

    The caller aggregates the per-token loss (sum over tokens / its normalization's divisor).
    """
    log_ratio = log_probs - behaviour_log_probs
    ratio = torch.exp(log_ratio)
    if mode is None:  # TRL's AsyncGRPOTrainer loss, as written there
        clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
        return -torch.min(ratio * advantages, clipped * advantages), ratio.detach()
    weights = importance_weights(log_ratio, segment_id, mode, clip_min, clip_max)
    active = ppo_clip_active(ratio.detach(), advantages, epsilon_low, epsilon_high)
    # Active tokens: value -A w, gradient -A w grad log pi (exp(l - sg(l)) is 1 with gradient grad l).
    # Clipped tokens: the formula's constant value -A w clip(r) / r, computed in log space; no gradient.
    unit = torch.exp(log_probs - log_probs.detach())
    log_clip_over_r = torch.log(torch.clamp(ratio.detach(), 1 - epsilon_low, 1 + epsilon_high)) - log_ratio.detach()
    scale = torch.where(active, unit, torch.exp(log_clip_over_r))
    per_token = -advantages * torch.where(weights > 0, weights * scale, torch.zeros_like(scale))
    return per_token, weights


def stale_is_sums(log_rho: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(10,) float64 sums of one micro-batch (:data:`STALE_IS_SUMS`) from the per-token ``log rho`` the weights were
    computed from (:func:`log_importance_ratio`) and the weights: token count, count of finite ``log rho``, sums of
    ``rho``, ``log rho`` and its square over those, count of weights the correction changed (``w != rho``; a NaN
    log-ratio counts as changed), sums of ``w`` and ``w^2``, max and min of the finite ``log rho`` (NaN if none)."""
    log_rho = log_rho.detach().double()
    w = weights.detach().double()
    finite = torch.isfinite(log_rho)
    lr = log_rho[finite]
    rho = torch.exp(lr)
    changed = (~finite).sum() + (~torch.isclose(w[finite], rho, rtol=1e-5, atol=0.0)).sum()
    nan = torch.full((), math.nan, dtype=torch.float64, device=log_rho.device)
    return torch.stack([
        torch.full((), float(log_rho.numel()), dtype=torch.float64, device=log_rho.device), finite.sum().double(),
        rho.sum(), lr.sum(), (lr * lr).sum(), changed.double(), w.sum(), (w * w).sum(),
        lr.max() if lr.numel() else nan, lr.min() if lr.numel() else nan,
    ])


#: The metrics :func:`stale_is_metrics` returns (each under ``stale_is/``).
STALE_IS_METRICS = ("ratio_mean", "ratio_max", "ratio_min", "log_ratio_std", "clipped_frac", "ess_frac")


def stale_is_metrics(sums: torch.Tensor) -> dict[str, float]:
    """The ``stale_is/`` metrics from :func:`stale_is_sums` of a whole step (NaN where nothing was counted):
    ``ratio_mean``, ``ratio_max``, ``ratio_min`` (over the finite ratios), ``log_ratio_std`` (the ratio's spread, in
    nats), ``clipped_frac`` (weights the truncation or mask changed), ``ess_frac`` (Kish's effective sample size of
    the weights, ``(sum w)^2 / sum w^2``, over the token count: 1 when all weights are equal, 1/K when one token
    carries them all; 0 when every weight is 0)."""
    count, finite, ratio, log_ratio, log_sq, changed, w, w_sq, log_max, log_min = sums.tolist()
    out = dict.fromkeys((f"stale_is/{name}" for name in STALE_IS_METRICS), math.nan)
    if count:
        out["stale_is/clipped_frac"] = changed / count
        out["stale_is/ess_frac"] = (w * w / w_sq) / count if w_sq > 0 else 0.0
    if finite:
        mean_log = log_ratio / finite
        out.update({
            "stale_is/ratio_mean": ratio / finite,
            "stale_is/ratio_max": math.exp(log_max),
            "stale_is/ratio_min": math.exp(log_min),
            "stale_is/log_ratio_std": math.sqrt(max(log_sq / finite - mean_log * mean_log, 0.0)),
        })
    return out
