"""The warning for TRL's vLLM importance-sampling correction under truncated sampling, and the arithmetic behind it.

vLLM (``logprobs_mode="processed_logprobs"``, as TRL starts it) returns the sampled token's log-prob after min-p,
top-k and top-p, renormalized over the tokens they keep; the trainer's log-prob is over the full vocabulary. On
identical weights the ratio pi_trainer / pi_vLLM is then the kept probability mass Z <= 1, not 1. Here, in torch:
the ratio departs from 1 only under settings the warning names (so a setting it stays silent on is unbiased), and
under each truncation it names the ratio is Z < 1. The same bias on vLLM's own CPU engine: tests/engines/
test_vllm_cpu.py (``test_truncated_sampling_biases_the_importance_ratio``).
"""

import importlib.util
import math
import tempfile
import types
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.harness.truncated_sampling import processed_logprobs
from trl_rlvr.checks.settings import biased_importance_sampling, truncated_sampling_fields
from trl_rlvr.checks.verdicts import importance_sampling_verdict


def sampling(**fields):
    """The fields the warning reads, at TRL's defaults unless given (GRPOConfig: top_p 1.0, top_k 0, min_p None)."""
    values = dict(use_vllm=True, vllm_importance_sampling_correction=True, top_p=1.0, top_k=0, min_p=None,
                  generation_kwargs=None)
    values.update(fields)
    return types.SimpleNamespace(**values)


def importance_ratios(logits: torch.Tensor, **truncation) -> torch.Tensor:
    """pi_trainer / pi_vLLM for every token vLLM can sample, on the same logits (identical weights)."""
    processed = processed_logprobs(logits, **truncation)
    kept = processed > -math.inf
    return (logits.log_softmax(-1)[kept] - processed[kept]).exp()


truncations = st.fixed_dictionaries({
    "top_k": st.sampled_from([-1, 0, 1, 2, 5, 31, 32]),
    "top_p": st.sampled_from([1.0, 0.999, 0.9, 0.5, 0.1]),
    "min_p": st.sampled_from([None, 0.0, 0.01, 0.2, 0.9]),
})


@settings(max_examples=150, deadline=None)
@given(truncation=truncations, seed=st.integers(0, 2**16), scale=st.sampled_from([0.5, 2.0, 8.0]))
def test_the_ratio_departs_from_one_only_where_the_warning_fires(truncation, seed, scale):
    logits = torch.randn(32, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale
    ratios = importance_ratios(logits, top_k=max(truncation["top_k"], 0), top_p=truncation["top_p"],
                               min_p=truncation["min_p"])
    warned = biased_importance_sampling(sampling(**truncation)) is not None
    assert ratios.max().item() <= 1 + 1e-12  # renormalized over fewer tokens: never above the full log-prob
    if not warned:
        assert torch.allclose(ratios, torch.ones_like(ratios), atol=1e-12), (truncation, ratios)
    else:
        mass = ratios[0].item()  # every kept token has the same ratio: the kept mass Z
        assert torch.allclose(ratios, torch.full_like(ratios, mass))


@pytest.mark.parametrize("truncation", [dict(top_k=2), dict(top_p=0.5), dict(min_p=0.5)])
def test_each_truncation_the_warning_names_biases_the_ratio(truncation):
    logits = torch.linspace(0, 3, 32, dtype=torch.float64)
    full = dict(top_k=0, top_p=1.0, min_p=None)
    ratios = importance_ratios(logits, **{**full, **truncation})
    assert ratios.max().item() < 0.9  # a tenth of the mass or more cut: every kept token down-weighted
    assert biased_importance_sampling(sampling(**truncation)) is not None


@pytest.mark.parametrize("fields,named", [
    (dict(top_p=0.95), ["top_p=0.95"]),
    (dict(top_k=20), ["top_k=20"]),
    (dict(min_p=0.05), ["min_p=0.05"]),
    (dict(top_p=0.9, top_k=50, min_p=0.1), ["top_p=0.9", "top_k=50", "min_p=0.1"]),
    (dict(generation_kwargs={"top_k": 20}), ["generation_kwargs['top_k']=20"]),  # TRL passes it over top_k
    (dict(top_k=20, generation_kwargs={"top_k": 0}), []),
    (dict(top_k=-1, min_p=0.0), []),  # vLLM's and TRL's "off"
    (dict(), []),
])
def test_the_warning_names_the_truncating_fields(fields, named):
    assert truncated_sampling_fields(sampling(**fields)) == named
    message = biased_importance_sampling(sampling(**fields))
    assert (message is None) == (not named)
    for field in named:
        assert field in message and "vllm_importance_sampling_correction" in message


@pytest.mark.parametrize("off", [dict(use_vllm=False), dict(vllm_importance_sampling_correction=False)])
def test_no_warning_without_vllm_or_without_the_correction(off):
    assert biased_importance_sampling(sampling(top_k=20, top_p=0.9, **off)) is None


def test_the_config_warns_naming_the_fields(monkeypatch):
    from trl_rlvr import RLVRConfig

    if importlib.util.find_spec("vllm") is None:  # the config refuses use_vllm without vLLM; the warning comes first
        find_spec = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: types.SimpleNamespace() if name == "vllm" else find_spec(name, *a))
    common = dict(output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, report_to="none", use_vllm=True,
                  per_device_train_batch_size=4, num_generations=4)
    with pytest.warns(UserWarning, match=r"vllm_importance_sampling_correction=True with top_p=0\.9, top_k=20"):
        RLVRConfig(**common, top_p=0.9, top_k=20)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        RLVRConfig(**common)
        RLVRConfig(**common, top_k=20, vllm_importance_sampling_correction=False)


def test_the_doctor_warns_naming_the_fields():
    from trl import GRPOConfig

    from trl_rlvr.scripts.doctor import diagnose

    verdict = importance_sampling_verdict(sampling(min_p=0.1))
    assert verdict.verdict == "warn" and "min_p=0.1" in verdict.summary and verdict.numbers == {"truncating": ["min_p=0.1"]}
    assert importance_sampling_verdict(sampling()).verdict == "ok"
    assert importance_sampling_verdict(sampling(top_k=5, vllm_importance_sampling_correction=False)).verdict == "ok"

    batch = {"truncated": [False] * 4, "lengths": [3] * 4, "reward_names": ["r"], "scores": [[1.0, 0.0, 1.0, 0.0]],
             "counters": {"r": {}}, "zero_signal": [False], "success_rate": 0.5, "group_size": 4,
             "success_zero_signal": [False], "loss_tokens": [3] * 4}
    args = GRPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, report_to="none", use_vllm=True,
                      top_k=20, per_device_train_batch_size=4, num_generations=4)
    (check,) = [c for c in diagnose(batch, args) if c.name == "vLLM importance sampling"]
    assert check.verdict == "warn" and "top_k=20" in check.summary
    args.use_vllm = False
    assert not [c for c in diagnose(batch, args) if c.name == "vLLM importance sampling"]
