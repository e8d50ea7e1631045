"""The plugins from TRL's own CLI, and TRL's own reward functions in the registry."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_rlvr.rewards import registry as rewards
from trl_rlvr.rewards.registry import describe_reward, load_reward

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_trl_grpo_cli_runs_two_steps_with_ready_made_plugins(tiny_model_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": f"What is {i} + 1? Put the answer in \\boxed{{}}.", "answer": str(i + 1)} for i in range(16)]
    (data / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", "import sys; from trl.cli import main; sys.exit(main())", "grpo",
           "--model_name_or_path", str(tiny_model_dir), "--dtype", "float32", "--dataset_name", str(data),
           "--reward_funcs", "reward_plugins.boxed_math.reward", "reward_plugins.think_format.reward",
           "--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "4",
           "--max_completion_length", "16", "--use_cpu", "--bf16", "false", "--output_dir", str(out),
           "--report_to", "none", "--save_strategy", "no", "--logging_steps", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Training completed" in run.stdout + run.stderr
    logged = run.stdout + run.stderr
    for key in ("rewards/boxed_math/mean", "rewards/think_format/mean", "boxed_math/no_box"):
        assert f"'{key}'" in logged, key
    assert (out / "model.safetensors").exists()


def test_ready_made_functions_score_like_the_registry():
    from reward_plugins import boxed_math, code_sandbox, think_format

    assert think_format.reward.__name__ == "think_format" and boxed_math.reward.__name__ == "boxed_math"
    assert code_sandbox.reward.__name__ == "code_sandbox" and code_sandbox.reward.verifies_correctness
    completions = ["<think>1+1=2</think> \\boxed{2}", "<think>x</think> \\boxed{3}", "no think \\boxed{2}"]
    assert think_format.reward(None, completions) == load_reward("think_format")(None, completions) == [1.0, 1.0, 0.0]
    assert boxed_math.reward(None, completions, answer=["2"] * 3) == [1.0, 0.0, 1.0]


TRL_REWARDS = {
    "accuracy_reward": {}, "reasoning_accuracy_reward": {}, "think_format_reward": {},
    "cosine_scaled_reward": {"max_len": 100}, "repetition_penalty_reward": {},
    "soft_overlong_punishment_reward": {"max_completion_len": 20, "soft_punish_cache": 5},
}


@pytest.mark.parametrize("name", sorted(TRL_REWARDS))
def test_trl_rewards_registered_under_their_log_names(name):
    import pickle

    from trl.trainer.utils import get_callable_name

    reward = load_reward(name, **TRL_REWARDS[name])
    assert get_callable_name(reward) == name  # what GRPOTrainer logs rewards/<name>/mean under
    assert pickle.loads(pickle.dumps(reward)).__name__ == name
    assert describe_reward(name)["description"].startswith(f"TRL's {name}")


def test_trl_rewards_score_as_trl_does():
    from trl.rewards import accuracy_reward, get_soft_overlong_punishment, think_format_reward

    completions = [[{"role": "assistant", "content": "<think>x</think> \\boxed{\\frac{1}{2}}"}],
                   [{"role": "assistant", "content": "\\boxed{3}"}]]
    solution = ["\\frac{1}{2}", "\\frac{1}{2}"]
    assert load_reward("accuracy_reward")(completions=completions, solution=solution) == accuracy_reward(
        completions, solution) == [1.0, 0.0]
    assert load_reward("think_format_reward")(completions=completions) == think_format_reward(completions)
    ids = [[1] * 10, [1] * 18, [1] * 25]
    assert load_reward("soft_overlong_punishment_reward", max_completion_len=20, soft_punish_cache=5)(
        completion_ids=ids) == get_soft_overlong_punishment(20, 5)(completion_ids=ids)
    assert load_reward("accuracy_reward").required_columns == ("solution",)


def test_registry_name_is_the_log_name_and_the_success_reward_name(tiny_model_dir, monkeypatch):
    """A plugin whose function carries another __name__ is logged, and found by success_reward, by its registry
    name (it was logged as rewards/short/mean and success_reward='short_answer' was an error)."""
    from tests.harness.loss_harness import make_trainer

    monkeypatch.setitem(rewards.BUILTIN_REWARDS, "short_answer", "tests.scripts.test_trl_cli:short_answer_factory")
    reward = load_reward("short_answer")
    assert reward.__name__ == "short_answer"
    trainer = make_trainer(tiny_model_dir, reward_funcs=["short_answer"], success_reward="short_answer")
    assert trainer.reward_func_names == ["short_answer"] and trainer.success_reward_index == 0


def short_answer_factory():
    """Test plugin: 1.0 for a completion under 5 characters; its function is called `short`."""

    def short(completions, **kwargs):
        return [float(len(c) < 5) for c in completions]

    return short
