"""``metric_for_best_model="eval/pass@1"`` with ``load_best_model_at_end``: SampledEvalCallback's evaluations choose
the checkpoint (trl_rlvr.evaluation.best_model), on the tiny model."""

import zlib
from types import SimpleNamespace

import pytest

from trl_rlvr.evaluation.best_model import sampled_best_metric

KEYS = ["eval/pass@1", "eval/pass@4", "eval/maj@1", "eval/maj@4", "eval/format_rate"]


def test_which_metric_names_a_callback_key():
    args = SimpleNamespace(metric_for_best_model="eval/pass@1", load_best_model_at_end=True, save_strategy="steps",
                           save_steps=4)
    assert sampled_best_metric(args, 2, KEYS) == "eval/pass@1"
    assert sampled_best_metric(SimpleNamespace(**{**vars(args), "metric_for_best_model": "eval_eval/maj@4"}), 2,
                               KEYS) == "eval/maj@4"
    assert sampled_best_metric(SimpleNamespace(**{**vars(args), "metric_for_best_model": "loss"}), 2, KEYS) is None
    with pytest.raises(ValueError, match=r"metric_for_best_model='eval/pass@8' is not a key"):
        sampled_best_metric(SimpleNamespace(**{**vars(args), "metric_for_best_model": "eval/pass@8"}), 2, KEYS)
    with pytest.raises(ValueError, match=r"save_steps \(3\) must be a multiple of its eval_steps \(2\)"):
        sampled_best_metric(SimpleNamespace(**{**vars(args), "save_steps": 3}), 2, KEYS)


class _BestAtStep:
    """Held-out answers are right only at ``best`` optimizer steps; training answers half the time (by a hash)."""

    def __init__(self, best: int):
        self.best, self.trainer, self.__name__ = best, None, "best_at"

    def __call__(self, prompts=None, completions=None, split=None, **kwargs):
        step = self.trainer.state.global_step
        return [float(step == self.best) if where == "heldout" else float(zlib.crc32(text.encode()) % 2)
                for text, where in zip(completions, split)]


def test_load_best_model_at_end_keeps_the_checkpoint_with_the_best_held_out_pass_at_1(tiny_model_dir, tmp_path):
    import torch
    from datasets import Dataset
    from safetensors.torch import load_file

    from trl_rlvr import RLVRConfig, RLVRTrainer
    from trl_rlvr.evaluation.callback import SampledEvalCallback
    from trl_rlvr.testing import load_tokenizer

    rows = lambda n, split: Dataset.from_dict({"prompt": [f"q{i}: " for i in range(n)], "split": [split] * n})  # noqa: E731
    heldout = rows(4, "heldout")
    reward = _BestAtStep(best=2)
    args = RLVRConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4,
        num_generations=4, max_completion_length=8, max_steps=6, logging_steps=1, learning_rate=1e-2,
        activation_checkpointing=False, seed=0, eval_strategy="steps", eval_steps=2, save_strategy="steps",
        save_steps=2, load_best_model_at_end=True, metric_for_best_model="eval/pass@1", alarms=False,
    )
    trainer = RLVRTrainer(model=str(tiny_model_dir), reward_funcs=[reward], args=args, train_dataset=rows(16, "train"),
                          eval_dataset=heldout, processing_class=load_tokenizer(tiny_model_dir))
    reward.trainer = trainer
    trainer.add_callback(SampledEvalCallback(trainer, heldout, n=2, batch_size=8, max_new_tokens=8))
    trainer.train()
    assert [h["eval/pass@1"] for h in trainer.state.log_history if "eval/pass@1" in h] == [1.0, 0.0, 0.0]
    assert trainer.state.best_global_step == 2 and trainer.state.best_metric == 1.0
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-2")
    best = load_file(str(tmp_path / "checkpoint-2" / "model.safetensors"))
    last = load_file(str(tmp_path / "checkpoint-6" / "model.safetensors"))
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(best[name], last[name])  # the weights moved: the check below can tell them apart
    assert torch.equal(trainer.model.state_dict()[name].cpu(), best[name])  # loaded back at the end
    assert not any("eval_reward" in h for h in trainer.state.log_history)  # GRPO's own evaluation did not run
