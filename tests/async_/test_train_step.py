"""One optimizer step of RLVRAsyncTrainer.train() on a CPU through TRL's whole loop (train-begin weight sync,
rollout queue, group admission, packing, the RLVR loss, the step metrics), the rollout worker and weight transfer
stubbed by TRL's protocols: the model's weights move and the RLVR metrics are logged."""

import numpy as np
import pytest
import torch

pytest.importorskip("trl.experimental.async_grpo")

from trl.experimental.async_grpo.async_rollout_worker import RolloutSample  # noqa: E402

from tests.async_.test_async_trainer import make_trainer  # noqa: E402
from tests.async_.test_cpu_tree_attention import rollout_rows  # noqa: E402


def test_one_step(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, learning_rate=1e-2, logging_steps=1, save_strategy="no",
                           stale_is_clip_max=2.0,
                           reward_options={"boxed_math": {"prestart": False}})
    # rows for more micro-batches than one step trains on: accelerate's dispatcher fetches one batch ahead
    for row in rollout_rows(old_shift=0.3) * 4:
        trainer.rollout_queue.put(RolloutSample(prompt=[], completion=[], input_ids=row["input_ids"],
                                                completion_mask=row["completion_mask"],
                                                old_log_probs=row["old_log_probs"], advantage=row["advantage"],
                                                model_version=0, group_id=row["group_id"], metrics={"reward": 1.0}))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert moved
    logged = trainer.state.log_history[0]
    assert np.isfinite(logged["loss"]) and 0 < logged["stale_is/ess_frac"] <= 1
    assert logged["rlvr/queue_stale_total"] == 0.0 and trainer.group_filter.counts.rows_admitted == 0  # reset: logged
