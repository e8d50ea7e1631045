"""The doctor's check of rollouts per optimizer step against the learning rate (no model)."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from trl_rlvr.checks.batch_size import (
    MAX_LR_PER_SQRT_ROLLOUT,
    rollouts_for_learning_rate,
    rollouts_per_step,
    rollouts_per_step_verdict,
)

ROOT = Path(__file__).resolve().parents[2]


def job_defaults(job: str) -> SimpleNamespace:
    """The settings an example job runs with by default (the recipe's defaults, from their public home)."""
    if job == "tool_r1":
        from trl_rlvr.tasks.tool_arithmetic import DEFAULTS
    else:
        from trl_rlvr.presets import R1ZERO_ON_CPU as DEFAULTS
    return SimpleNamespace(**DEFAULTS)


def test_the_tool_jobs_step_fits_and_its_earlier_steps_are_flagged_with_what_would_fit():
    config = job_defaults("tool_r1")
    assert rollouts_per_step(config) == 32
    check = rollouts_per_step_verdict(config)  # 32 rollouts at 8e-6 (1.4e-6): RL added 14 points (3 seeds)
    assert check.verdict == "ok" and check.numbers["rollouts_per_step"] == 32
    # the job's earlier steps, whose RL lost 19 points (16 at 2e-5) and 35 (16 at 1e-5) to its cold start
    for lr, times, needed, allowed in ((2e-5, "3x", 178, "6e-06"), (1e-5, "2x", 45, "6e-06")):
        earlier = rollouts_per_step_verdict(SimpleNamespace(per_device_train_batch_size=2,
                                                            gradient_accumulation_steps=8, learning_rate=lr))
        assert earlier.verdict == "warn", earlier
        assert earlier.summary.startswith(f"learning_rate={lr:g} on 16 rollouts per optimizer step (full fine-tuning)")
        assert f", {times} the bound" in earlier.summary
        assert f">= {needed} rollouts" in earlier.advice and f"<= {allowed}" in earlier.advice


def test_the_first_main_jobs_step_is_above_the_bound():
    check = rollouts_per_step_verdict(job_defaults("r1zero"))
    assert check.verdict == "warn" and "= 7.5e-06, 5x the bound" in check.summary


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "examples" / "recipes").glob("*.yaml")))
def test_the_gpu_recipes_fit(recipe):
    d = yaml.safe_load((ROOT / "examples" / "recipes" / recipe).read_text())
    config = SimpleNamespace(learning_rate=d["learning_rate"], per_device_train_batch_size=d["per_device_train_batch_size"],
                             gradient_accumulation_steps=d.get("gradient_accumulation_steps", 1))
    assert rollouts_per_step_verdict(config, lora=bool(d.get("use_peft"))).verdict == "ok"


def test_the_bound_scales_with_the_square_root_and_lora_gets_more():
    at_16 = MAX_LR_PER_SQRT_ROLLOUT * 4
    assert rollouts_for_learning_rate(at_16, 16) is None
    assert rollouts_for_learning_rate(at_16 * 1.01, 16) is not None
    assert rollouts_for_learning_rate(at_16 * 2, 64) is None  # 4x the rollouts allow 2x the learning rate
    assert rollouts_for_learning_rate(1e-4, 16, lora=True) is not None  # 1.7x the LoRA bound
    assert rollouts_for_learning_rate(1e-4, 64, lora=True) is None
    assert rollouts_per_step(SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=2), 8) == 64
    for bad in ((1e-6, 0), (0.0, 16)):
        with pytest.raises(ValueError, match="rollouts"):
            rollouts_for_learning_rate(*bad)
