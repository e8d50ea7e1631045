"""RLVRTrainer's loss equals an independent reference, for every normalization, on 1 and 2 processes."""


import pytest
import torch

from tests.harness.launch import launch_on_cpu
from tests.harness.loss_harness import (
    MAX_COMPLETION,
    NORMALIZATIONS,
    assert_grads_equal,
    fixed_batch,
    make_trainer,
    reference_grads,
    run_trainer,
    select_rows,
)
from trl_rlvr.testing import load_tokenizer

pytestmark = pytest.mark.trl_contract  # the TRL-upgrade check: `pytest -m trl_contract`

HARNESS = ("--module", "tests.harness.loss_harness")


def check_every_step(model_dir, normalization, spg, ga, steps, loss_constant=None, **config):
    grads, rows, _ = run_trainer(model_dir, normalization, spg, ga, steps, loss_constant=loss_constant, **config)
    assert len(grads) == steps
    batch = fixed_batch(len(load_tokenizer(model_dir)))
    extra = {"constant": loss_constant} if loss_constant else {}
    for step in range(steps):
        want = reference_grads(model_dir, select_rows(batch, rows[step]), normalization, **extra)
        assert_grads_equal(grads[step], want)


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_gradient_matches_reference_with_accumulation(tiny_model_dir, normalization):
    # gradient_accumulation_steps=2, steps_per_generation=2: one optimizer step = the whole generation batch.
    check_every_step(tiny_model_dir, normalization, spg=2, ga=2, steps=1)


@pytest.mark.parametrize("spg,ga", [(4, 2), (2, 1)])
def test_per_batch_token_is_exact_when_a_generation_spans_several_steps(tiny_model_dir, spg, ga):
    # Each optimizer step has its own token count; TRL's estimate divides by the generation-batch average.
    check_every_step(tiny_model_dir, "per_batch_token", spg=spg, ga=ga, steps=2)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "activation_checkpointing"])
def test_memory_layout_of_the_main_job_keeps_the_gradient(tiny_model_dir, checkpointing):
    # examples/r1zero.py's memory layout: the generation batch split into micro-batches of one optimizer step
    # (there 8 of 2 rows), with and without activation checkpointing (which recomputes the forward in the backward).
    check_every_step(tiny_model_dir, "per_batch_token", spg=4, ga=4, steps=1, activation_checkpointing=checkpointing)


def test_activation_checkpointing_gives_the_very_same_gradient(tiny_model_dir):
    plain, _, _ = run_trainer(tiny_model_dir, "per_batch_token", 4, 4, 1, activation_checkpointing=False)
    recomputed, _, trainer = run_trainer(tiny_model_dir, "per_batch_token", 4, 4, 1, activation_checkpointing=True)
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing  # it did recompute
    for name, grad in plain[0].items():
        assert torch.equal(grad, recomputed[0][name]), name


def test_trl_estimate_alone_is_not_exact_there(tiny_model_dir, monkeypatch):
    # Guards the test above against passing vacuously: without the exact count the gradients differ.
    from trl_rlvr.trainer import RLVRTrainer

    monkeypatch.setattr(RLVRTrainer, "optimizer_step_token_counts", lambda self, batches: None)
    with pytest.raises(AssertionError):
        check_every_step(tiny_model_dir, "per_batch_token", spg=4, ga=2, steps=2)


def test_constant_normalization_uses_loss_constant(tiny_model_dir):
    check_every_step(tiny_model_dir, "constant", spg=2, ga=2, steps=1, loss_constant=3 * MAX_COMPLETION)


@pytest.mark.slow
def test_two_processes_give_the_one_process_gradient(tiny_model_dir, tmp_path):
    """2 processes (gloo, DDP) on the same global batch: gradient == reference == 1-process gradient."""
    out = tmp_path / "grads.pt"
    launch_on_cpu(*HARNESS, tiny_model_dir, out, ",".join(NORMALIZATIONS))
    results = torch.load(out)
    assert results.pop("num_processes") == 2  # `--cpu` would silently run one process
    batch = fixed_batch(len(load_tokenizer(tiny_model_dir)))
    for normalization in NORMALIZATIONS:
        (grads,), (rows,) = results[normalization]["grads"], results[normalization]["rows"]
        assert rows.shape[0] == 8
        assert_grads_equal(grads, reference_grads(tiny_model_dir, select_rows(batch, rows), normalization))


def test_clip_higher_zeroes_gradient_outside_the_asymmetric_range(tiny_model_dir, monkeypatch):
    from transformers import Trainer

    """num_iterations=2 (ratio != 1): tokens past 1+eps_high with A>0, or below 1-eps with A<0, get no gradient."""
    trainer = make_trainer(tiny_model_dir, num_iterations=2, per_device_train_batch_size=4)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop otherwise
    logps = torch.full((4, 3), -1.0, requires_grad=True)
    mask = torch.ones(4, 3, dtype=torch.long)
    ratio = torch.tensor([
        [1.5, 1.25, 1.0],   # A>0: 1.5 > 1.28 clipped; 1.25 inside (between 1.2 and 1.28: clip-higher lets it grow)
        [0.7, 0.85, 1.0],   # A<0: 0.7 < 0.8 clipped; 0.85 inside
        [0.7, 0.5, 1.0],    # A>0: low ratio with positive advantage is never clipped (min keeps the unclipped)
        [1.5, 2.0, 1.0],    # A<0: high ratio with negative advantage is never clipped
    ])
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    inputs = {
        "prompt_ids": torch.ones(4, 2, dtype=torch.long), "prompt_mask": torch.ones(4, 2, dtype=torch.long),
        "completion_ids": torch.ones(4, 3, dtype=torch.long), "completion_mask": mask,
        "advantages": advantages, "num_items_in_batch": mask.sum(),
        "old_per_token_logps": logps.detach() - torch.log(ratio),
    }
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.zeros(4, 3), None)
    trainer._compute_loss(trainer.model, inputs).backward()
    zero = logps.grad == 0
    assert zero.tolist() == [[True, False, False], [True, False, False],
                             [False, False, False], [False, False, False]]
    # The asymmetric clip fractions are TRL's metrics, re-published as rlvr/ when the trainer logs.
    captured = {}
    monkeypatch.setattr(Trainer, "log", lambda self, logs, start_time=None: captured.update(logs))
    trainer.log({})
    assert captured["rlvr/clip_high_frac"] == pytest.approx(1 / 12)
    assert captured["rlvr/clip_low_frac"] == pytest.approx(1 / 12)
