"""Selective sampling on the tiny model, over a dataset small enough that prompts come back every few rounds.

The prompts are dynamic_sampling_harness's (q{i}: i % 3 == 0 always right, i % 3 == 1 always wrong, i % 3 == 2
informative), 8 of them, so 6 of 8 prompts give zero-signal groups and are skipped once seen.

Run directly (also under `accelerate launch`) to write each rank's record to OUT.rank{r}.pt:
    python -m tests.harness.selective_sampling_harness MODEL_DIR OUT [max_steps]
"""

from __future__ import annotations

import sys

import torch

from tests.harness.dynamic_sampling_harness import mixed_reward
from tests.harness.loss_harness import make_trainer

DATASET_SIZE = 8


def make_selective_trainer(model_dir, reward=mixed_reward, **overrides):
    """An RLVRTrainer with selective sampling over q0..q7 (its prompt stream rebuilt for that dataset)."""
    from datasets import Dataset

    settings = dict(selective_sampling=True, selective_sampling_window=1, revisit_probability=0.25, max_steps=6,
                    learning_rate=1e-3, per_device_train_batch_size=8, gradient_accumulation_steps=2,
                    max_completion_length=8)
    settings.update(overrides)
    trainer = make_trainer(model_dir, reward_funcs=[reward], **settings)
    trainer.train_dataset = Dataset.from_dict({"prompt": [f"q{i}" for i in range(DATASET_SIZE)]})
    trainer._round_driver = trainer._make_round_driver()
    return trainer


def record_rounds(trainer) -> list[list[int]]:
    """Make the trainer append the global prompt indices of every round it generates for to the returned list."""
    rounds = []
    next_prompts = trainer._round_driver.next_prompts

    def recording(*args):
        batch, groups = next_prompts(*args)
        rounds.append(list(groups))
        return batch, groups

    trainer._round_driver.next_prompts = recording
    return rounds


if __name__ == "__main__":
    model_dir, out = sys.argv[1], sys.argv[2]
    trainer = make_selective_trainer(model_dir, max_steps=int(sys.argv[3]) if len(sys.argv) > 3 else 6,
                                     per_device_train_batch_size=4, dynamic_sampling=True)
    rounds = record_rounds(trainer)
    trainer.train()
    rank = trainer.accelerator.process_index
    torch.save({"num_processes": trainer.accelerator.num_processes, "rounds": rounds,
                "stream": trainer._round_driver.stream.state_dict(), "log_history": trainer.state.log_history},
               f"{out}.rank{rank}.pt")
