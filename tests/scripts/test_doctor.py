"""``trl-rlvr doctor``: one real batch of the tiny model through the run's own trainer, and the verdicts it prints.

It must flag a truncating budget, a reward that reads no answer and a batch with no signal (exit 1), pass on the
offline main job's settings (examples/r1zero.py's defaults; the tiny model and a reward it can earn), stop with exit 2
when it cannot run, and fail the machine check of a GPU recipe on a CPU before any model loads."""

import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def even_length(prompts=None, completions=None, **kwargs):
    """1.0 for a completion of even length: a reward every answer can be read by, right about half the time."""
    return [1.0 if len(c) % 2 == 0 else 0.0 for c in completions]


def always_zero(prompts=None, completions=None, **kwargs):
    """The same score for every answer: no group has signal."""
    return [0.0 for _ in completions]


def main_job_defaults() -> dict:
    """examples/r1zero.py's defaults: the main job's settings (trl_rlvr.presets.R1ZERO_ON_CPU)."""
    from trl_rlvr.presets import R1ZERO_ON_CPU

    return dict(R1ZERO_ON_CPU)


def run_doctor(tmp_path, tiny_model_dir, capsys, **fields):
    from trl_rlvr.scripts.cli import main

    settings = {**main_job_defaults(), "output_dir": str(tmp_path / "out"), "use_cpu": True, "bf16": False,
                "model_name_or_path": str(tiny_model_dir), "reward_funcs": [f"{__name__}.even_length"],
                "num_train_samples": 32, "num_eval_samples": 4, **fields}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(settings))
    report = tmp_path / "report.json"
    code = main(["doctor", "--config", str(recipe), "--json", str(report)])
    out = capsys.readouterr()
    return code, (json.loads(report.read_text()) if report.exists() else None), out


def verdicts(report) -> dict:
    return {c["name"]: c["verdict"] for c in report["checks"]}


def test_passes_on_the_main_jobs_settings(tmp_path, tiny_model_dir, capsys):
    code, report, out = run_doctor(tmp_path, tiny_model_dir, capsys, max_completion_length=160,
                                   overlong_buffer_length=32)
    assert code == 0, out.out
    v = verdicts(report)
    assert v["machine"] == v["zero-signal groups"] == v["loss normalization"] == v["reward even_length"] == "ok", v
    assert report["batch"]["answers"] == 16 and report["batch"]["group_size"] == 8  # one generation batch
    assert "verdict:" in out.out and "per_batch_token (DAPO)" in out.out
    # the main job's step (lr 3e-5 on 16 rollouts) is 5x the bound of trl_rlvr.checks.batch_size: a warning
    step = next(c for c in report["checks"] if c["name"] == "step size")
    assert step["verdict"] == "warn" and step["numbers"]["rollouts_per_step"] == 16 and "= 7.5e-06, 5x the bound" in step["summary"]
    assert "step size" in out.out and "Train on >= 400 rollouts per step" in out.out


def test_a_step_the_rollouts_allow_is_ok(tmp_path, tiny_model_dir, capsys):
    code, report, out = run_doctor(tmp_path, tiny_model_dir, capsys, learning_rate=1e-6, max_completion_length=160,
                                   overlong_buffer_length=32)
    step = next(c for c in report["checks"] if c["name"] == "step size")
    assert code == 0 and step["verdict"] == "ok", out.out
    assert step["numbers"]["lr_per_sqrt_rollout"] == pytest.approx(1e-6 / 4)


def test_flags_a_truncating_budget(tmp_path, tiny_model_dir, capsys):
    code, report, out = run_doctor(tmp_path, tiny_model_dir, capsys, max_completion_length=1,
                                   overlong_buffer_length=None)
    assert code == 1
    assert verdicts(report)["truncation"] == "fail"
    assert "--max_completion_length 2" in out.out


def test_flags_a_reward_that_reads_no_answer(tmp_path, tiny_model_dir, capsys):
    code, report, out = run_doctor(tmp_path, tiny_model_dir, capsys, reward_funcs=["boxed_math"],
                                   overlong_buffer_length=None, reward_options={"boxed_math": {"prestart": False}})
    assert code == 1
    boxed = next(c for c in report["checks"] if c["name"] == "reward boxed_math")
    assert boxed["verdict"] == "fail" and boxed["numbers"]["unreadable_frac"] == 1.0
    assert "no_box 16" in boxed["summary"]
    # with another reward that tells the answers apart (the overlong penalty), the run can still learn: a warning
    _, report, _ = run_doctor(tmp_path, tiny_model_dir, capsys, reward_funcs=["boxed_math"],
                              reward_options={"boxed_math": {"prestart": False}})
    boxed = next(c for c in report["checks"] if c["name"] == "reward boxed_math")
    assert boxed["verdict"] == "warn" and "learns only from the other rewards" in boxed["advice"]


def test_flags_a_batch_without_signal(tmp_path, tiny_model_dir, capsys):
    code, report, _ = run_doctor(tmp_path, tiny_model_dir, capsys, reward_funcs=[f"{__name__}.always_zero"],
                                 overlong_buffer_length=None, dynamic_sampling=False, max_completion_length=16)
    assert code == 1
    zero = next(c for c in report["checks"] if c["name"] == "zero-signal groups")
    assert zero["verdict"] == "fail" and zero["numbers"]["zero_signal_frac"] == 1.0


def test_exit_2_when_it_cannot_run(tmp_path, tiny_model_dir, capsys):
    code, report, out = run_doctor(tmp_path, tiny_model_dir, capsys, model_name_or_path=str(tmp_path / "missing"))
    assert code == 2 and report is None
    assert "could not run" in out.err


def test_a_gpu_recipe_on_a_cpu_fails_the_machine_check_before_any_model_loads(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    from trl_rlvr.scripts.cli import main

    report = tmp_path / "r.json"
    code = main(["doctor", "--config", str(ROOT / "examples" / "recipes" / "dr_grpo.yaml"), "--model_name_or_path",
                 str(tmp_path / "missing-model"), "--output_dir", str(tmp_path), "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 1
    assert "--bf16 false" in out and "machine" in out
    assert json.loads(report.read_text())["checks"][0]["verdict"] == "fail"
