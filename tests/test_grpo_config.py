"""RLVRTrainer accepts a TRL GRPOConfig and then computes what GRPOTrainer computes.

Both trainers run TRL's real generation, rewards and advantages on the tiny model, from the same seed, over a
generation batch that spans two optimizer steps (where the exact per-step token count would differ from TRL's
estimate) with mixed rewards (where the population std would differ from TRL's sample std)."""

import logging
import math
import tempfile

import pytest
import torch

from trl_rlvr.algorithms.advantages import group_advantages

pytestmark = pytest.mark.trl_contract  # the TRL-upgrade check: `pytest -m trl_contract`


def length_reward(completions, **kwargs):
    """A deterministic reward with several values per group: the completion's length mod 5, over 4."""
    return [(len(c) % 5) / 4 for c in completions]


def grpo_config(**overrides):
    from trl import GRPOConfig

    settings = dict(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, num_generations=4, steps_per_generation=4,
        gradient_accumulation_steps=2, max_completion_length=8, learning_rate=1e-2, max_steps=2, use_cpu=True,
        bf16=False, report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
        max_grad_norm=0.0, temperature=1.0,
    )
    settings.update(overrides)
    return GRPOConfig(**settings)


def train(trainer_cls, model_dir, args):
    """Gradients of every optimizer step and the logged losses."""
    from datasets import Dataset
    from transformers import TrainerCallback

    from trl_rlvr.testing import load_tokenizer

    dataset = Dataset.from_dict({"prompt": [f"question {i}:" for i in range(32)]})
    trainer = trainer_cls(model=str(model_dir), reward_funcs=[length_reward], args=args, train_dataset=dataset,
                          processing_class=load_tokenizer(model_dir))
    grads = []

    class GradCatcher(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            grads.append({n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None})

    trainer.add_callback(GradCatcher())
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, grads, losses


def assert_same_grads(a, b):
    assert len(a) == len(b) == 2
    for step_a, step_b in zip(a, b):
        assert step_a.keys() == step_b.keys()
        for name in step_a:
            torch.testing.assert_close(step_a[name], step_b[name], rtol=1e-5, atol=1e-7, msg=name)


def test_grpo_config_gives_grpo_trainer_loss_and_gradients(tiny_model_dir, caplog):
    from trl import GRPOTrainer

    from trl_rlvr import RLVRConfig, RLVRTrainer

    _, trl_grads, trl_losses = train(GRPOTrainer, tiny_model_dir, grpo_config())
    with caplog.at_level(logging.INFO, logger="trl_rlvr.trainer"):
        ours, rlvr_grads, rlvr_losses = train(RLVRTrainer, tiny_model_dir, grpo_config())
    assert isinstance(ours.args, RLVRConfig)
    assert (ours.args.advantage_std, ours.args.token_count_scope) == ("sample", "generation_batch")
    assert [r.message for r in caplog.records if "GRPOConfig was converted" in r.message], caplog.text
    assert_same_grads(trl_grads, rlvr_grads)
    assert rlvr_losses == pytest.approx(trl_losses, rel=1e-5, abs=1e-7)

    # The two switches matter here: RLVR's defaults on the same config give other gradients.
    defaults = RLVRConfig.from_grpo_config(grpo_config())
    defaults.advantage_std, defaults.token_count_scope = "population", "optimizer_step"
    _, default_grads, _ = train(RLVRTrainer, tiny_model_dir, defaults)
    with pytest.raises(AssertionError):
        assert_same_grads(trl_grads, default_grads)


def test_rlvr_config_from_grpo_config_to_dict():
    """The constructor accepts a built config's dict (generation_batch_size and steps_per_generation both set)."""
    from trl_rlvr import RLVRConfig

    source = grpo_config(loss_type="grpo", scale_rewards=False, epsilon_high=0.28)
    config = RLVRConfig(**source.to_dict())
    assert (config.generation_batch_size, config.steps_per_generation) == (16, 4)
    assert (config.loss_normalization, config.scale_rewards, config.epsilon_high) == ("per_answer", "none", 0.28)
    converted = RLVRConfig.from_grpo_config(source)
    assert {k: v for k, v in converted.to_dict().items() if k not in ("advantage_std", "token_count_scope")} == {
        k: v for k, v in config.to_dict().items() if k not in ("advantage_std", "token_count_scope")
    }
    with pytest.raises(ValueError, match="generation_batch_size=12 and steps_per_generation=4 disagree"):
        RLVRConfig(**{**source.to_dict(), "generation_batch_size": 12})


def test_rlvr_trainer_still_refuses_other_configs(tiny_model_dir):
    from transformers import TrainingArguments

    from trl_rlvr import RLVRTrainer

    with pytest.raises(TypeError, match="RLVRConfig or trl.GRPOConfig, got TrainingArguments"):
        RLVRTrainer(model=str(tiny_model_dir), reward_funcs=[length_reward],
                    args=TrainingArguments(tempfile.mkdtemp(), use_cpu=True))


def test_sample_std_is_trls_nanstd():
    from trl.trainer.utils import nanstd

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, float("nan"), 1.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    grouped = rewards.view(-1, 4)
    centered = grouped - torch.nanmean(grouped, dim=1, keepdim=True)
    trl = torch.nan_to_num((centered / (nanstd(grouped, dim=1).unsqueeze(1) + 1e-4)).reshape(-1), nan=0.0)
    torch.testing.assert_close(group_advantages(rewards, 4, "group", std="sample"), trl)
    population = group_advantages(rewards, 4, "group")
    assert population[0].item() == pytest.approx(0.5 / (0.5 + 1e-4))
    assert group_advantages(rewards, 4, "group", std="sample")[0].item() == pytest.approx(
        0.5 / (0.5 * math.sqrt(4 / 3) + 1e-4))
