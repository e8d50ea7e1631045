"""Settings found before any model loads that do nothing (a warning naming the option and what it needs) or cannot
work together (an error naming both options).

:data:`ACTS_WHEN` says, per RLVR option, under which other settings it acts; ``RLVRConfig`` warns for each option
set away from its default where it would not, and :meth:`RLVRConfig.from_grpo_config` sets only the options that
act. :func:`check_settings` also warns for bf16 on a CPU (it runs, slowly) and for vLLM's importance-sampling
correction under truncated sampling (:func:`truncated_sampling_fields`: the ratio is biased); settings this machine
cannot run at all are :mod:`trl_rlvr.checks.machine`'s.
"""

from __future__ import annotations


def _filtering(config) -> bool:
    return config.dynamic_sampling or config.selective_sampling  # both judge groups by metric and tolerance


#: option -> (whether it acts under a built config, what it needs). The two rules of the GRPOTrainer-compatible
#: switches (``advantage_std``, ``token_count_scope``) read only fields a plain ``GRPOConfig`` has too
#: (``loss_type == "dapo"`` is ``loss_normalization="per_batch_token"`` once RLVRConfig has resolved it).
ACTS_WHEN = {
    "max_sampling_rounds": (lambda c: c.dynamic_sampling, "dynamic_sampling=True"),
    "dynamic_sampling_oversample": (lambda c: c.dynamic_sampling, "dynamic_sampling=True"),
    "dynamic_sampling_partial_batch": (lambda c: c.dynamic_sampling, "dynamic_sampling=True"),
    "dynamic_sampling_metric": (_filtering, "dynamic_sampling=True or selective_sampling=True"),
    "dynamic_sampling_tolerance": (_filtering, "dynamic_sampling=True or selective_sampling=True"),
    "selective_sampling_window": (lambda c: c.selective_sampling, "selective_sampling=True"),
    "revisit_probability": (lambda c: c.selective_sampling, "selective_sampling=True"),
    "resample_on_correct_oversample": (lambda c: c.resample_on_correct, "resample_on_correct=True"),
    "policy_shift_alarm_token_nats": (lambda c: c.policy_shift_metrics, "policy_shift_metrics=True"),
    "policy_shift_alarm_nats": (lambda c: c.policy_shift_metrics, "policy_shift_metrics=True"),
    "policy_shift_alarm_kl": (lambda c: c.policy_shift_metrics, "policy_shift_metrics=True"),
    "overlong_penalty_factor": (lambda c: c.overlong_buffer_length is not None, "overlong_buffer_length"),
    "token_count_scope": (lambda c: c.loss_type == "dapo", "loss_normalization='per_batch_token'"),
    "advantage_std": (
        lambda c: c.scale_rewards != "none" and c.multi_objective_aggregation == "sum_then_normalize",
        "scale_rewards='group' or 'batch' and multi_objective_aggregation='sum_then_normalize'",
    ),
}


def option_acts(config, name: str) -> bool:
    """Whether RLVR option ``name`` changes anything under the other settings of ``config``."""
    return bool(ACTS_WHEN[name][0](config))


def ineffective_options(config) -> list[str]:
    """One message per RLVR option set away from its default where the other settings make it do nothing."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    return [
        f"{name}={getattr(config, name)!r} has no effect without {needs}"
        for name, (_, needs) in ACTS_WHEN.items()
        if name in defaults and getattr(config, name) != defaults[name] and not option_acts(config, name)
    ]


def check_tool_settings(config, train_dataset, environment_factory) -> None:
    """Combinations with tools that cannot work, named by both options, before any model loads: selective sampling
    remembers prompts by their dataset row, and without a ``train_dataset`` the environment's ``reset()`` makes each
    prompt (TRL then cycles placeholder rows), so a row names no prompt to skip or revisit."""
    if environment_factory is not None and train_dataset is None and getattr(config, "selective_sampling", False):
        raise ValueError(
            "selective_sampling=True needs a train_dataset, but environment_factory is given without one (its "
            "reset() makes each prompt, so a dataset row names no prompt to skip or revisit): pass a train_dataset "
            "or set selective_sampling=False"
        )


def truncated_sampling_fields(config) -> list[str]:
    """The sampling settings of ``config`` that cut tokens out of the distribution vLLM samples from, as
    ``field=value``: ``top_p < 1``, ``top_k > 0`` (0 is TRL's "off", -1 vLLM's), ``min_p > 0`` (None is off), each
    read from ``generation_kwargs`` where that sets it (TRL passes those to vLLM over its own fields)."""
    overrides = getattr(config, "generation_kwargs", None) or {}
    if not isinstance(overrides, dict):
        overrides = {}
    cut = []
    for name, truncates in (("top_p", lambda v: v < 1), ("top_k", lambda v: v > 0),
                            ("min_p", lambda v: v is not None and v > 0)):
        where = "generation_kwargs" if name in overrides else None
        value = overrides[name] if where else getattr(config, name, None)
        if value is not None and truncates(value):
            cut.append(f"generation_kwargs[{name!r}]={value!r}" if where else f"{name}={value!r}")
    return cut


def biased_importance_sampling(config) -> str | None:
    r"""Why TRL's vLLM importance-sampling correction is biased under ``config``, or None where it is not (or off).

    With ``use_vllm`` and ``vllm_importance_sampling_correction``, TRL weighs each token by
    \(\pi_\theta(o_t) / \pi_\text{vLLM}(o_t)\). vLLM returns the sampled token's log-prob after top-k / top-p /
    min-p (``logprobs_mode="processed_logprobs"``, as TRL starts it): renormalized over the kept tokens, so
    \(\log\pi_\text{vLLM}(o_t) = \log\pi(o_t) - \log Z_t\) with \(Z_t \le 1\) the kept probability mass, while the
    trainer's \(\pi_\theta\) uses the full vocabulary. On identical weights the ratio is then \(Z_t\), not 1: every
    token is down-weighted by how much the truncation cut at its position (TRL's tracker, issue #6789; measured on
    vLLM's CPU engine in tests/engines/test_vllm_cpu.py)."""
    if not (getattr(config, "use_vllm", False) and getattr(config, "vllm_importance_sampling_correction", False)):
        return None
    cut = truncated_sampling_fields(config)
    if not cut:
        return None
    return (f"vllm_importance_sampling_correction=True with {', '.join(cut)} (use_vllm=True): vLLM returns the "
            "sampled tokens' log-probs renormalized over the tokens that top_k / top_p / min_p keep, the trainer's "
            "log-probs use the full vocabulary, so the importance-sampling ratio pi_trainer / pi_vLLM is biased "
            "(below 1 by the kept probability mass, even on identical weights; TRL issue #6789). Sample from the "
            "full distribution (top_p=1.0, top_k=0, min_p=None) or set vllm_importance_sampling_correction=False.")


_warned_bf16_on_cpu = False


def check_settings(config) -> None:
    """Errors and warnings that need no model: options without effect (warn), bf16 on a CPU (warn), vLLM's
    importance-sampling correction under truncated sampling (warn: :func:`biased_importance_sampling`), ``use_vllm``
    without vLLM installed (``ImportError`` now rather than after the model and data have loaded)."""
    import importlib.util
    import warnings

    for message in ineffective_options(config):
        warnings.warn(message, UserWarning, stacklevel=5)
    if config.use_vllm and importlib.util.find_spec("vllm") is None:
        raise ImportError(
            f"use_vllm=True (vllm_mode={config.vllm_mode!r}) needs vLLM, which is not installed: pip install "
            "'trl-rlvr[vllm]' (GPU) or see docs for vLLM's CPU build; or set use_vllm=False to generate with "
            "transformers"
        )
    bias = biased_importance_sampling(config)
    if bias is not None:
        warnings.warn(bias, UserWarning, stacklevel=5)
    global _warned_bf16_on_cpu
    if config.bf16 and not _warned_bf16_on_cpu and _on_cpu(config):
        _warned_bf16_on_cpu = True  # once per process: a suite or a sweep builds many configs on one machine
        warnings.warn(
            "bf16=True on a CPU (use_cpu=True or no GPU; TRL's GRPOConfig turns bf16 on by default): bfloat16 "
            "autocast is slower than float32 on a CPU (measured in docs/benchmarks.md). Set bf16=False.",
            UserWarning,
            stacklevel=5,
        )


def _on_cpu(config) -> bool:
    if config.use_cpu:
        return True
    import torch

    return not (torch.cuda.is_available() or getattr(torch, "xpu", None) and torch.xpu.is_available()
                or torch.backends.mps.is_available())
