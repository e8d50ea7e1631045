"""rlvr/shift_* during training (``policy_shift_metrics``): the metrics of each optimizer step equal those computed
independently from the weights before and after it, and the alarm fires on a step that is too large, not on one
that is not."""

from __future__ import annotations

import copy
import logging
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

from tests.rollouts.test_tool_rollouts import _logged, make_trainer, run_recorded  # noqa: E402
from trl_rlvr.algorithms.policy_shift import completion_logps, policy_shift  # noqa: E402


def train_with_snapshots(trainer):
    """Train; -> (micro-batches, the weights before each optimizer step and after the last)."""
    from transformers import TrainerCallback

    weights = []

    class Snapshots(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            weights.append(copy.deepcopy(trainer.model.state_dict()))

    trainer.add_callback(Snapshots())
    batches, _, _ = run_recorded(trainer)
    weights.append(copy.deepcopy(trainer.model.state_dict()))
    return batches, weights


def independent_metrics(model_dir, batch, before, after):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logps = []
    for weights in (before, after):
        model.load_state_dict(weights)
        logps.append(completion_logps(model, input_ids, attention_mask, batch["completion_ids"].size(1)))
    return policy_shift(*logps, batch["completion_mask"] * batch["tool_mask"], batch["advantages"])


def test_each_steps_metrics_are_those_of_the_weights_before_and_after_it(tiny_model_dir, caplog):
    trainer = make_trainer(tiny_model_dir, learning_rate=1e-4, policy_shift_metrics=True,
                           policy_shift_alarm_token_nats=1e6)
    with caplog.at_level(logging.WARNING):
        batches, weights = train_with_snapshots(trainer)
    assert len(batches) == 2 and len(weights) == 3  # one micro-batch per optimizer step here
    for step, batch in enumerate(batches):
        want = independent_metrics(tiny_model_dir, batch, weights[step], weights[step + 1])
        assert want["shift/kl_old_new"] > 0 and want["shift/logp_pos"] != 0
        for name, logged in (("shift/logp_pos", "rlvr/shift_pos_logp"), ("shift/logp_neg", "rlvr/shift_neg_logp"),
                             ("shift/kl_old_new", "rlvr/shift_kl"), ("shift/token_logp_max_abs", "rlvr/shift_token_max_abs")):
            assert _logged(trainer, logged)[step] == pytest.approx(want[name], rel=1e-3, abs=1e-6), name
    assert _logged(trainer, "rlvr/alarm/policy_shift") == [0.0, 0.0]
    assert all(t > 0 for t in _logged(trainer, "rlvr/shift_seconds"))
    assert not [r for r in caplog.records if "policy_shift" in r.getMessage()]


def test_no_update_moves_nothing_and_raises_no_alarm(tiny_model_dir):
    trainer = make_trainer(tiny_model_dir, learning_rate=0.0, policy_shift_metrics=True)
    run_recorded(trainer)
    assert _logged(trainer, "rlvr/shift_kl") == [0.0, 0.0]
    assert _logged(trainer, "rlvr/shift_token_max_abs") == [0.0, 0.0]
    assert _logged(trainer, "rlvr/alarm/policy_shift") == [0.0, 0.0]


def test_a_step_too_large_for_its_batch_fires_the_alarm_once_and_is_counted(tiny_model_dir, caplog):
    """lr 0.05 on the tiny random model moves every token a little (each by < 3 nats) and the batch by a lot (KL 0.3
    to 0.6 per token): the KL bound, set, fires."""
    trainer = make_trainer(tiny_model_dir, learning_rate=0.05, policy_shift_metrics=True, policy_shift_alarm_kl=0.05)
    with caplog.at_level(logging.WARNING):
        run_recorded(trainer)
    assert _logged(trainer, "rlvr/alarm/policy_shift") == [1.0, 1.0]
    assert min(_logged(trainer, "rlvr/shift_kl")) > 0.05
    warnings = [r.getMessage() for r in caplog.records if "alarm policy_shift" in r.getMessage()]
    assert len(warnings) == 1 and "lower the learning rate" in warnings[0] and "at step 1" in warnings[0]
    assert "KL(old||new) to" in warnings[0] and "(bound 0.05)" in warnings[0]


def test_off_by_default_records_nothing(tiny_model_dir):
    trainer = make_trainer(tiny_model_dir, max_steps=1)
    run_recorded(trainer)
    assert not _logged(trainer, "rlvr/shift_kl") and trainer._policy_shift.recorded == []
    assert "_get_per_token_logps_and_entropies" not in vars(trainer)  # the class's method, never shadowed
