"""RLVRAsyncTrainer reads TRL's rollout queue through the group filter: a group is admitted at its first row only if
it will be within max_staleness at its loss (one weight sync after its read, fixed-count batching), a group too old
then is dropped whole and counted, a follower a sync takes over the bound is dropped, counted; every admitted row's
version rides to the collator; and the dynamic-sampling switch reaches the reward process's scoring."""

import numpy as np
import pytest

pytest.importorskip("trl.experimental.async_grpo")

from trl.experimental.async_grpo.async_rollout_worker import RolloutSample  # noqa: E402

from tests.async_.test_async_trainer import make_trainer  # noqa: E402
from trl_rlvr._compat.async_adapter import ROW_VERSION_KEY  # noqa: E402


def row(group_id: int, version: int) -> RolloutSample:
    return RolloutSample(prompt=[], completion=[], input_ids=np.array([5, 6, 7]), completion_mask=np.array([0, 1, 1]),
                         old_log_probs=np.array([0.0, -1.0, -1.0], dtype=np.float32), advantage=1.0,
                         model_version=version, group_id=group_id, metrics={})


def test_groups_are_admitted_within_the_bound_at_their_loss(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, max_staleness=2, dynamic_sampling=True,
                           reward_options={"boxed_math": {"prestart": False}})
    assert trainer.group_scoring.dynamic_sampling and trainer.group_filter.syncs_before_loss == 1  # token_budget=0
    trainer.get_train_dataloader()
    # group 3 trails, so that a filter dropping more than it should returns a wrong row instead of waiting forever
    for sample in (row(0, 0), row(0, 0), row(0, 0), row(1, 0), row(2, 2), row(3, 2), row(3, 2)):
        trainer.rollout_queue.put(sample)
    rows = iter(trainer._rollout_dataset)
    trainer.model_version = 1
    first = next(rows)  # group 0, 1 version old: 2 at its loss, admitted
    second = next(rows)  # its follower, read before the sync: admitted
    trainer.model_version = 2  # a weight sync between two rows of group 0
    third = next(rows)  # group 0's last row, 2 old: 3 at its loss, dropped; group 1 (2 old at its first row) too
    assert [first["group_id"], second["group_id"], third["group_id"]] == [0, 0, 2]
    assert [r["metrics"][ROW_VERSION_KEY] for r in (first, second, third)] == [0, 0, 2]
    counts = trainer.group_filter.counts
    assert (counts.stale, counts.refills_requested, counts.rows_admitted, counts.rows_dropped_stale) == (1, 1, 3, 2)
    logged = {}
    trainer.model.train()  # TRL logs the train metrics in training mode
    trainer.log(logged)
    assert logged["rlvr/queue_stale_total"] == 1.0 and logged["rlvr/queue_refills_requested_total"] == 1.0
    assert logged["rlvr/queue_rows_dropped_stale_total"] == 2.0
    assert trainer.group_filter.counts.stale == 0  # counted per logging window


def test_the_stale_is_alarm_runs_on_the_async_trainer(tiny_model_dir, tmp_path, caplog):
    trainer = make_trainer(tiny_model_dir, tmp_path, reward_options={"boxed_math": {"prestart": False}})
    trainer.model.train()
    with caplog.at_level("WARNING", logger="trl_rlvr.checks.alarms"):
        for step in range(1, 4):  # patience: 3 logging windows, each mean 0.3
            trainer.state.global_step = step
            for ess in (0.2, 0.4):
                trainer._metrics["train"]["stale_is/ess_frac"].append(ess)
            trainer.log({"reward": 0.5})
    assert "trl-rlvr alarm stale_is" in caplog.text and "30%, 30%, 30%" in caplog.text
    trainer.state.global_step = 4
    trainer.log({"reward": 0.5})
    assert trainer.state.log_history[-1]["rlvr/alarm/stale_is"] == 1.0
