"""DAPO dynamic sampling: only informative groups reach the loss, on one process and on two."""

import logging

import pytest
import torch

from tests.harness.dynamic_sampling_harness import constant_reward, mixed_reward, run
from tests.harness.launch import launch_on_cpu
from trl_rlvr.sampling.dynamic import PromptStream, concat_rows, informative_rows, rows_per_process

HARNESS = ("--module", "tests.harness.dynamic_sampling_harness")


def test_every_row_that_reaches_the_loss_has_signal(tiny_model_dir):
    drawn = []
    trainer, seen = run(tiny_model_dir, record_prompts=drawn)
    assert len(seen) == 6  # 3 optimizer steps x 2 accumulation steps
    for advantages in seen:
        assert advantages.numel() > 0 and (advantages != 0).all()
    logged = [h for h in trainer.state.log_history if "rlvr/sampling_rounds" in h]
    assert len(logged) == 3
    # First rounds and refills draw from one stream: within a pass (64 prompts) no prompt comes twice.
    prompts = [[row["prompt"] for row in batch[::4]] for batch in drawn]
    flat = [p for round_ in prompts for p in round_]
    assert len(flat) == 4 * sum(entry["rlvr/sampling_rounds"] for entry in logged) == len(set(flat))
    for entry in logged:
        assert 1 <= entry["rlvr/sampling_rounds"] <= 3
        assert entry["rlvr/prompts_sampled"] == 4 * entry["rlvr/sampling_rounds"]
        assert 0 < entry["rlvr/kept_groups_frac"] <= 1
        # measured before filtering: at least the groups of prompts i % 3 in {0, 1}, which never carry signal
        step_rounds, prompts = prompts[: int(entry["rlvr/sampling_rounds"])], prompts[int(entry["rlvr/sampling_rounds"]):]
        constant = sum(int(p[1:]) % 3 != 2 for round_ in step_rounds for p in round_) / (4 * len(step_rounds))
        assert entry["rlvr/zero_signal_frac"] >= constant - 1e-6


def test_a_padded_partial_batch_trains_every_kept_row_and_logs_only_micro_batches_with_tokens(tiny_model_dir):
    """dynamic_sampling_partial_batch='pad', one round of 4 groups, 8 micro-batches of 2 rows per update: every
    kept row reaches the loss (non-zero advantage), the other slots are fillers (no loss token, advantage 0), and
    TRL's loss metrics (entropy, clip ratios) are logged only for micro-batches that have a loss token."""
    entropy_logged = []

    def after_loss(trainer, inputs):
        entropy_logged.append((bool(inputs["completion_mask"].any()), len(trainer._metrics["train"].get("entropy", []))))

    trainer, seen = run(tiny_model_dir, per_device_train_batch_size=2, gradient_accumulation_steps=8,
                        max_sampling_rounds=1, dynamic_sampling_partial_batch="pad", after_loss=after_loss)
    logged = [h for h in trainer.state.log_history if "rlvr/filler_rows" in h]
    assert len(logged) == 3 and sum(h["rlvr/filler_rows"] for h in logged) > 0  # the case is exercised
    for step, entry in enumerate(logged):
        rows = torch.cat(seen[8 * step : 8 * (step + 1)])
        kept = round(entry["rlvr/kept_groups_frac"] * entry["rlvr/prompts_sampled"] * 4)
        assert int((rows != 0).sum()) == kept  # every kept row trained
        assert int((rows == 0).sum()) == entry["rlvr/filler_rows"] == len(rows) - kept
    for step in range(3):  # within a step (logged, then cleared, at its end) one entry per micro-batch with tokens
        expected = 0
        for has_tokens, entries in entropy_logged[8 * step : 8 * (step + 1)]:
            expected += has_tokens
            assert entries == expected
    assert 0 < sum(has for has, _ in entropy_logged) < len(entropy_logged)


def test_without_dynamic_sampling_zero_advantage_rows_match_the_metric(tiny_model_dir):
    trainer, seen = run(tiny_model_dir, dynamic_sampling=False, gradient_accumulation_steps=1)
    logged = [h["rlvr/zero_signal_frac"] for h in trainer.state.log_history if "rlvr/zero_signal_frac" in h]
    zero_rows = [(a == 0).float().mean().item() for a in seen]
    assert zero_rows == pytest.approx(logged)
    assert max(zero_rows) > 0  # the mixed reward does produce zero-signal groups


def test_constant_reward_skips_the_update_without_hanging(tiny_model_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_rlvr.trainer"):
        trainer2, seen2 = run(tiny_model_dir, reward=constant_reward, max_steps=2)
    assert "no informative group" in caplog.text
    assert all((a == 0).all() for a in seen2)
    # weights never move: every optimizer step was fed by an empty batch
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for name, param in initial.named_parameters():
        torch.testing.assert_close(trainer2.model.get_parameter(name), param, atol=0, rtol=0)


@pytest.mark.trl_contract
def test_an_empty_update_leaves_the_optimizer_and_the_weights_alone(tiny_model_dir):
    """Step 1 learns; step 2 finds no informative group. AdamW at lr 0 would still decay exp_avg/exp_avg_sq and
    count the step: the step updates nothing instead (its gradients dropped before it), and the learning-rate schedule
    does not advance (the scheduler's state and the groups' learning rates as after step 1)."""
    from transformers import TrainerCallback

    snapshots = {}

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
            snapshots[state.global_step] = (
                {k: v.detach().clone() for k, v in model.named_parameters()},
                {id_: {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}
                 for id_, st in optimizer.state_dict()["state"].items()},
                {k: lr_scheduler.state_dict()[k] for k in ("last_epoch", "_step_count", "_last_lr")},
                [group["lr"] for group in optimizer.param_groups],
            )

    def first_step_only(prompts, completions, **kwargs):
        return mixed_reward(prompts, completions) if not snapshots else constant_reward(prompts, completions)

    first_step_only.__name__ = "first_step_only"
    trainer, _ = run(tiny_model_dir, reward=first_step_only, callbacks=[Snapshot()], max_steps=2, weight_decay=0.1,
                     lr_scheduler_type="linear")
    (params1, state1, schedule1, lrs1), (params2, state2, schedule2, lrs2) = snapshots[1], snapshots[2]
    assert state1 and state1.keys() == state2.keys()
    for id_ in state1:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(state2[id_][key], state1[id_][key], atol=0, rtol=0)
    for name in params1:
        torch.testing.assert_close(params2[name], params1[name], atol=0, rtol=0)
    assert schedule2 == schedule1 and lrs2 == lrs1 and lrs1[0] > 0 and trainer.state.global_step == 2


@pytest.mark.slow
def test_two_processes_stay_in_lockstep(tiny_model_dir, tmp_path):
    out = tmp_path / "ds"
    launch_on_cpu(*HARNESS, tiny_model_dir, out, 3)
    ranks = [torch.load(f"{out}.rank{r}.pt") for r in range(2)]
    assert all(r["num_processes"] == 2 for r in ranks)
    rows = [[a.numel() for a in r["advantages"]] for r in ranks]
    assert rows[0] == rows[1] and len(rows[0]) == 6  # same micro-batches, same sizes, on both ranks
    for r in ranks:
        assert all((a != 0).all() for a in r["advantages"])
    rounds = [[h["rlvr/sampling_rounds"] for h in r["log_history"] if "rlvr/sampling_rounds" in h] for r in ranks]
    assert rounds[0] == rounds[1]


@pytest.mark.slow
def test_two_processes_pad_a_partial_batch_in_lockstep(tiny_model_dir, tmp_path):
    """Two processes, 4 micro-batches of 2 rows each per update: every kept row is trained once over the two ranks,
    the fillers (advantage 0) fill the same number of slots on both, whichever rank generated the kept rows."""
    out = tmp_path / "pad"
    launch_on_cpu(*HARNESS, tiny_model_dir, out, 6, "per_device_train_batch_size=2", "gradient_accumulation_steps=4",
                  "max_sampling_rounds=1", "dynamic_sampling_partial_batch=pad")
    ranks = [torch.load(f"{out}.rank{r}.pt") for r in range(2)]
    assert [[a.numel() for a in r["advantages"]] for r in ranks][0] == [[a.numel() for a in r["advantages"]]
                                                                      for r in ranks][1]
    logged = [h for h in ranks[0]["log_history"] if "rlvr/filler_rows" in h]
    assert len(logged) == 6 and sum(h["rlvr/filler_rows"] for h in logged) > 0, [h["rlvr/filler_rows"] for h in logged]
    for step, entry in enumerate(logged):
        rows = torch.cat([a for r in ranks for a in r["advantages"][4 * step : 4 * (step + 1)]])
        kept = round(entry["rlvr/kept_groups_frac"] * entry["rlvr/prompts_sampled"] * 4)
        if kept == 0:  # no informative group: the empty batch of a skipped update, not fillers
            assert not rows.any() and entry["rlvr/filler_rows"] == 0
            continue
        assert int((rows != 0).sum()) == kept and int((rows == 0).sum()) == entry["rlvr/filler_rows"]


def test_informative_rows_and_rows_per_process():
    rewards = torch.tensor([1.0, 1, 1, 1, 0, 1, 0, 0, 0.5, 0.5, 0.5, 0.5])
    assert informative_rows(rewards, 4).tolist() == [False] * 4 + [True] * 4 + [False] * 4
    assert rows_per_process(kept_rows=12, num_processes=2, steps_per_generation=2, target=8) == 6
    assert rows_per_process(kept_rows=40, num_processes=2, steps_per_generation=2, target=8) == 8
    assert rows_per_process(kept_rows=3, num_processes=2, steps_per_generation=2, target=8) == 0
    assert rows_per_process(kept_rows=3, num_processes=2, steps_per_generation=2, target=8, partial_batch="pad") == 2
    assert rows_per_process(kept_rows=12, num_processes=2, steps_per_generation=4, target=8, partial_batch="pad") == 8
    assert rows_per_process(kept_rows=40, num_processes=2, steps_per_generation=2, target=8, partial_batch="pad") == 8
    assert rows_per_process(kept_rows=0, num_processes=2, steps_per_generation=2, target=8, partial_batch="pad") == 0


def test_concat_rows_pads_prompts_left_and_completions_right():
    a = {"prompt_ids": torch.tensor([[5, 6]]), "completion_ids": torch.tensor([[7]]), "advantages": torch.tensor([1.0])}
    b = {"prompt_ids": torch.tensor([[1, 2, 3]]), "completion_ids": torch.tensor([[8, 9]]),
         "advantages": torch.tensor([2.0])}
    out = concat_rows([a, b], {"prompt_ids": 0, "completion_ids": 0})
    assert out["prompt_ids"].tolist() == [[0, 5, 6], [1, 2, 3]]
    assert out["completion_ids"].tolist() == [[7, 0], [8, 9]]
    assert out["advantages"].tolist() == [1.0, 2.0]


def test_prompt_stream_covers_every_prompt_once_per_pass_and_resumes():
    stream = PromptStream(dataset_size=10, prompts_per_round=3, group_size=2, seed=7)
    first_pass = [stream.next_indices() for _ in range(stream.rounds_per_pass)]
    prompts = [i for round_ in first_pass for i in round_[::2]]
    assert len(prompts) == len(set(prompts)) == 9  # 3 rounds x 3 prompts, none repeated
    assert all(r[0::2] == r[1::2] for r in first_pass)  # each prompt repeated group_size times
    state = stream.state_dict()
    expected = stream.next_indices()
    resumed = PromptStream(dataset_size=10, prompts_per_round=3, group_size=2, seed=7)
    resumed.load_state_dict(state)
    assert resumed.next_indices() == expected


def test_checkpoint_saves_the_prompt_stream_position_and_resume_restores_it(tiny_model_dir, tmp_path, monkeypatch):
    import json

    from tests.harness.loss_harness import make_trainer
    from trl_rlvr.trainer import RLVRTrainer

    settings = dict(dynamic_sampling=True, learning_rate=1e-3, per_device_train_batch_size=8, max_completion_length=8,
                    output_dir=str(tmp_path), save_strategy="steps", save_steps=1, max_steps=2)
    trainer = make_trainer(tiny_model_dir, reward_funcs=[mixed_reward], **settings)
    trainer.train()
    saved = [json.loads((tmp_path / f"checkpoint-{s}" / "rlvr_prompt_stream.json").read_text()) for s in (1, 2)]
    assert saved[1] == trainer._round_driver.stream.state_dict()
    assert saved[0] != {"epoch": 0, "position": 0}  # so a fresh, unrestored stream would fail the check below
    restored = []
    load = RLVRTrainer._load_optimizer_and_scheduler

    def recording_load(self, checkpoint):
        load(self, checkpoint)
        restored.append(self._round_driver.stream.state_dict())

    monkeypatch.setattr(RLVRTrainer, "_load_optimizer_and_scheduler", recording_load)
    resumed = make_trainer(tiny_model_dir, reward_funcs=[mixed_reward], **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert restored == [saved[0]]
    assert resumed.state.global_step >= 2


def test_batch_scaling_uses_the_kept_groups_only(tiny_model_dir):
    """With scale_rewards="batch" the std is the kept groups' (as verl), not the generated batch's."""
    from tests.harness.loss_harness import make_trainer
    from trl_rlvr.algorithms.advantages import group_advantages
    from trl_rlvr.sampling.rounds import RoundRecord

    trainer = make_trainer(tiny_model_dir, reward_funcs=[mixed_reward], dynamic_sampling=True, scale_rewards="batch",
                           per_device_train_batch_size=8, max_completion_length=8)
    trainer.model.train()
    rewards = torch.tensor([1.0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0])  # groups 0 and 2 carry no signal

    def fake_round(prompts, prompt_indices=None, drops_rows=False):
        rows = torch.arange(16)
        record = RoundRecord(prompt_indices, rewards_per_func=rewards[:, None], rewards=rewards,
                             lengths=torch.full((16,), 3.0), truncated=torch.zeros(16, dtype=torch.bool),
                             trl_advantages=group_advantages(rewards, 4, "batch"), table=_empty_table(16))
        return {"prompt_ids": rows[:, None].repeat(1, 2), "prompt_mask": torch.ones(16, 2, dtype=torch.long),
                "completion_ids": rows[:, None].repeat(1, 3), "completion_mask": torch.ones(16, 3, dtype=torch.long),
                "advantages": group_advantages(rewards, 4, "batch"), "num_items_in_batch": torch.tensor(48)}, record

    trainer._round_driver.score_round = fake_round
    batch, _ = trainer._round_driver.generation_batch([{}] * 8)
    assert batch["completion_ids"][:, 0].tolist() == [4, 5, 6, 7, 12, 13, 14, 15]
    kept = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0])
    torch.testing.assert_close(batch["advantages"], group_advantages(kept, 4, "batch"))
    assert not torch.allclose(batch["advantages"], group_advantages(rewards, 4, "batch")[rewards.new_tensor(
        [0, 1, 1, 0]).bool().repeat_interleave(4)])
    assert batch["num_items_in_batch"].item() == 24


def _empty_table(rows):
    from collections import defaultdict

    return {"images": [], "prompt": [None] * rows, "completion": [None] * rows, "rewards": defaultdict(list),
            "advantages": [], "extra": defaultdict(list)}


@pytest.mark.trl_contract
def test_kl_term_uses_reference_log_probs_of_kept_rows(tiny_model_dir, monkeypatch):
    """Rounds generate with beta swapped to 0, so TRL computes no reference log-probs for rows then dropped
    (TRL's _generate_and_score_completions reads self.beta); the kept rows get theirs afterwards."""
    from trl_rlvr.trainer import RLVRTrainer

    round_keys, generate = [], RLVRTrainer._score_round

    def recording(self, *args, **kwargs):
        output, record = generate(self, *args, **kwargs)
        round_keys.append(set(output))
        return output, record

    monkeypatch.setattr(RLVRTrainer, "_score_round", recording)
    trainer, seen = run(tiny_model_dir, beta=0.04, max_steps=2, gradient_accumulation_steps=1)
    assert round_keys and not any("ref_per_token_logps" in keys for keys in round_keys)
    assert all((a != 0).all() for a in seen)
    kl = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    assert len(kl) == 2 and all(k >= 0 for k in kl)


def _checkpointing_trainer(tiny_model_dir, tmp_path, **overrides):
    from tests.harness.loss_harness import make_trainer

    settings = dict(dynamic_sampling=True, per_device_train_batch_size=8, max_completion_length=8,
                    output_dir=str(tmp_path), save_strategy="steps", save_steps=1, max_steps=1)
    settings.update(overrides)
    return make_trainer(tiny_model_dir, reward_funcs=[mixed_reward], **settings)


def test_prompt_stream_state_is_in_the_checkpoint_before_any_other_file(tiny_model_dir, tmp_path, monkeypatch):
    """A crash at the first write of a checkpoint (the model) leaves the stream's position, whole, already there."""
    import json

    from trl_rlvr.trainer import RLVRTrainer

    def crash(self, *args, **kwargs):
        raise RuntimeError("killed while saving the model")

    monkeypatch.setattr(RLVRTrainer, "save_model", crash)
    trainer = _checkpointing_trainer(tiny_model_dir, tmp_path)
    with pytest.raises(RuntimeError, match="killed while saving"):
        trainer.train()
    folder = tmp_path / "checkpoint-1"
    assert sorted(p.name for p in folder.iterdir()) == ["rlvr_prompt_stream.json"]  # no temporary file left
    assert json.loads((folder / "rlvr_prompt_stream.json").read_text()) == trainer._round_driver.stream.state_dict()


def test_resume_from_a_checkpoint_without_the_prompt_stream_state_warns(tiny_model_dir, tmp_path, caplog):
    _checkpointing_trainer(tiny_model_dir, tmp_path).train()
    (tmp_path / "checkpoint-1" / "rlvr_prompt_stream.json").unlink()
    resumed = _checkpointing_trainer(tiny_model_dir, tmp_path, max_steps=2)
    with caplog.at_level(logging.WARNING, logger="trl_rlvr.trainer"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    warning = [r.getMessage() for r in caplog.records if "rlvr_prompt_stream.json" in r.getMessage()]
    assert len(warning) == 1 and "restarts from the beginning" in warning[0]
    assert warning[0].count(str(tmp_path / "checkpoint-1")) == 1
