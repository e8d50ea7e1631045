"""What is logged is what was trained: the completions table (``log_completions``) and TRL's reward and length
metrics describe the rows that reached the loss, each with the advantage the loss used, under every switch."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.harness.dynamic_sampling_harness import mixed_reward


def _record(trainer):
    """Train; -> per optimizer step (logging_steps=1): (rows that reached the loss, the table entries written and the
    metrics logged for that step)."""
    steps, current = [], []
    compute_loss, log = trainer.compute_loss, trainer.log

    def recording_loss(model, inputs, *args, **kwargs):
        current.append({k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return compute_loss(model, inputs, *args, **kwargs)

    def recording_log(logs, *args, **kwargs):
        if "loss" in logs:  # a training step's log (not the end-of-training summary)
            table = {"advantages": list(trainer._logs["advantages"]), "completion": list(trainer._logs["completion"]),
                     "rewards": {name: list(v) for name, v in trainer._logs["rewards"].items()}}
            metrics = {k: sum(v) / len(v) for k, v in trainer._metrics["train"].items() if v}
            steps.append((list(current), table, metrics))
            current.clear()
        out = log(logs, *args, **kwargs)
        for column in ("prompt", "completion", "advantages", "images"):  # TRL's table rolls over steps: one step each
            trainer._logs[column].clear()
        for columns in (trainer._logs["rewards"], trainer._logs["extra"]):
            for values in columns.values():
                values.clear()
        return out

    trainer.compute_loss, trainer.log = recording_loss, recording_log
    trainer.train()
    return steps


def _check(trainer, steps, weights=None):
    assert steps
    for rows, table, metrics in steps:
        trained = torch.cat([r["advantages"] for r in rows])
        mask = torch.cat([(r["completion_mask"] * r.get("tool_mask", 1)).sum(dim=1) for r in rows]).float()
        logged = torch.tensor(table["advantages"])
        assert len(logged) == len(trained), "the table's rows are not the rows trained on"
        torch.testing.assert_close(logged.sort().values, trained.float().sort().values, atol=1e-5, rtol=1e-5)
        names = list(table["rewards"])
        w = torch.tensor(weights or [1.0] * len(names))
        rewards = (torch.tensor([table["rewards"][n] for n in names]).T * w).nansum(dim=1)
        assert metrics["reward"] == pytest.approx(rewards.mean().item(), abs=1e-5)
        assert metrics["completions/mean_length"] == pytest.approx(mask.mean().item(), abs=1e-5)
        assert metrics["completions/max_length"] == pytest.approx(mask.max().item(), abs=1e-5)


SWITCHES = {
    "population_std": {},
    "sample_std_leave_one_out": {"advantage_std": "sample", "advantage_baseline": "leave_one_out"},
    "batch_scaling": {"scale_rewards": "batch"},
    "dynamic_sampling": {"dynamic_sampling": True},
    "dynamic_sampling_batch_scaling": {"dynamic_sampling": True, "scale_rewards": "batch"},
    "selective_sampling": {"selective_sampling": True},
    "trls_own_advantages": {"advantage_std": "sample"},  # a control: TRL's own advantages, right before too
}


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_table_and_figures_are_the_trained_rows(tiny_model_dir, switch):
    from tests.harness.loss_harness import make_trainer

    settings = dict(max_steps=2, per_device_train_batch_size=8, gradient_accumulation_steps=2, num_generations=4,
                    max_completion_length=8, mask_truncated_completions=False, log_completions=True,
                    temperature=1.0, learning_rate=1e-3)
    settings.update(SWITCHES[switch])
    trainer = make_trainer(tiny_model_dir, reward_funcs=[mixed_reward], **settings)
    _check(trainer, _record(trainer))


@pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")
def test_table_and_figures_are_the_trained_rows_with_tools(tiny_model_dir):
    from tests.rollouts.test_tool_rollouts import make_trainer

    trainer = make_trainer(tiny_model_dir, log_completions=True, mask_truncated_completions=False)
    _check(trainer, _record(trainer))


def test_a_figure_trl_adds_to_its_block_is_not_left_describing_untrained_rows(tiny_model_dir, monkeypatch):
    """A TRL release that logs a new metric of every generated row (here faked in TRL's own ``_generate``): under
    dynamic sampling it is not logged under its own name, where it would read as the trained rows' metric, but as
    ``generated/<name>``; TRL's known metrics stay those of the trained rows."""
    from trl import GRPOTrainer

    from tests.harness.loss_harness import make_trainer

    generate = GRPOTrainer._generate

    def generate_with_a_new_figure(self, prompts):
        out = generate(self, prompts)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["completions/new_trl_figure"].append(float(len(prompts)))  # of every generated row
        return out

    monkeypatch.setattr(GRPOTrainer, "_generate", generate_with_a_new_figure)
    trainer = make_trainer(tiny_model_dir, reward_funcs=[mixed_reward], dynamic_sampling=True, max_steps=2,
                           per_device_train_batch_size=8, gradient_accumulation_steps=2, num_generations=4,
                           max_completion_length=8, logging_steps=1, learning_rate=1e-3)
    steps = _record(trainer)
    _check(trainer, steps)
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logged and all("completions/new_trl_figure" not in entry for entry in logged)
    assert all(entry["generated/completions/new_trl_figure"] == 16.0 for entry in logged)
