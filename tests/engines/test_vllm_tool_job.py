"""The tool job (``examples/tool_r1.py --use_vllm --vllm_mode colocate``) on vLLM's CPU engine, one short step of
each stage: every rollout of the RL step and of both held-out evaluations comes from the engine (transformers'
``generate`` is made to fail), the step applies TRL's importance-sampling correction for the engine's bf16 sampling
(its metrics are logged only on that path), and the job writes its table as on HF ``generate``.
Optional: skipped without vLLM (its own venv, as tests/engines/test_vllm_cpu.py)."""

import importlib.util
import json
import os
import sys

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed (vllm-cpu, own venv)"),
    pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox"),
]


def test_the_tool_job_generates_and_evaluates_on_the_engine(tmp_path, monkeypatch):
    from transformers.generation.utils import GenerationMixin

    from tests.harness.recipes import run_example
    from trl_rlvr.testing import build_tiny_chatml_model

    def hf_generate(*args, **kwargs):
        raise AssertionError("transformers' generate was called: the job did not generate on vLLM")

    monkeypatch.setattr(GenerationMixin, "generate", hf_generate)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    model = build_tiny_chatml_model(tmp_path / "model", hidden_size=256)  # heads of 64: vLLM's CPU attention
    out = tmp_path / "out"
    trainer = run_example("tool_r1", "--smoke", "--model_name_or_path", str(model), "--output_dir", str(out),
                          "--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_max_model_length", "1024",
                          "--max_completion_length", "24", "--overlong_buffer_length", "8", "--plot", "false",
                          "--save_model", "false")["trainer"]
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"  # the job's bound on the engine's KV cache
    assert trainer.state.global_step == 1 and trainer.vllm_generation.llm is not None
    saved = json.loads((out / "tool_r1_metrics.json").read_text())
    assert list(saved["arms"]) == ["cold start (tool)", "cold start + tool RL"]
    for arm_metrics in saved["arms"].values():
        assert arm_metrics["questions"] == 6 and arm_metrics["n"] == 2 and arm_metrics["tool_call_rate"] is not None
    (step,) = saved["history"]
    # TRL's correction ran (sequence-masked: a ratio outside [0, 3] counts 0) on the engine's own log-probs
    assert 0.0 <= step["sampling/importance_sampling_ratio/mean"] <= 3.0
    assert step["sampling/sampling_logp_difference/max"] >= 0.0
