"""Nothing is retained from one training step to the next (rollouts, rewards, metrics, dynamic-sampling rounds).

Counted after every optimizer step, after a full garbage collection: the live torch tensors (number and bytes of
their distinct storages) and the objects the garbage collector tracks. From the second step on (the first one
creates the optimizer state) the counts must stay flat: a rollout, a reward tensor or a metrics list kept per step
would add at least one tensor or a few objects each step. The bytes may move by the width of the current batch
(its answers' lengths vary), so they get a bound well below one retained batch.
"""

import gc

import pytest
import torch
from transformers import TrainerCallback

from tests.harness.dynamic_sampling_harness import mixed_reward
from tests.harness.loss_harness import make_trainer

STEPS = 7


def live_counts() -> tuple[int, int, int]:
    """(live tensors, bytes of their distinct storages, gc-tracked objects) after a full collection."""
    gc.collect()
    objects = gc.get_objects()
    storages = {}
    tensors = 0
    for obj in objects:
        if isinstance(obj, torch.Tensor):
            tensors += 1
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return tensors, sum(storages.values()), len(objects)


class CountAfterSteps(TrainerCallback):
    def __init__(self, leak_per_step=None):
        self.counts, self.leak_per_step, self.kept = [], leak_per_step, []

    def on_step_end(self, args, state, control, **kwargs):
        if self.leak_per_step is not None:
            self.kept.append(self.leak_per_step(kwargs))
        self.counts.append(live_counts())


def train_and_count(model_dir, leak_per_step=None, **overrides):
    settings = {"dynamic_sampling": True, "max_steps": STEPS, "learning_rate": 1e-3, "per_device_train_batch_size": 8,
                "gradient_accumulation_steps": 2, "max_completion_length": 8, "logging_steps": 1}
    settings.update(overrides)
    trainer = make_trainer(model_dir, reward_funcs=[mixed_reward], **settings)
    counter = CountAfterSteps(leak_per_step)
    trainer.add_callback(counter)
    trainer.train()
    return counter.counts


def growth(counts) -> tuple[int, int, int]:
    """Largest increase over step 2's counts, at any later step."""
    base = counts[1]
    return tuple(max(c[i] for c in counts[2:]) - base[i] for i in range(3))


def assert_flat(counts, batch_bytes_bound: int = 64 * 1024):
    tensors, nbytes, objects = growth(counts)
    assert tensors <= 0, f"{tensors} more live tensors after {len(counts)} steps than after step 2: {counts}"
    assert nbytes <= batch_bytes_bound, f"live tensor bytes grew by {nbytes}: {counts}"
    assert objects <= 50, f"{objects} more gc-tracked objects than after step 2: {counts}"


@pytest.mark.parametrize("dynamic_sampling", [True, False], ids=["dynamic_sampling", "plain"])
def test_training_steps_retain_nothing(tiny_model_dir, dynamic_sampling):
    assert_flat(train_and_count(tiny_model_dir, dynamic_sampling=dynamic_sampling))


def test_the_count_sees_one_small_tensor_kept_per_step(tiny_model_dir):
    """The check is sharp enough: keeping one 8-element tensor per step (a reward vector) fails it."""
    counts = train_and_count(tiny_model_dir, leak_per_step=lambda kwargs: torch.zeros(8))
    with pytest.raises(AssertionError, match="more live tensors"):
        assert_flat(counts)
