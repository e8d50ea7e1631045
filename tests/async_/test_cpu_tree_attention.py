"""TRL's asynchronous trainer on a CPU: its packed tree forward with the plain-PyTorch tree attention gives every
trained token the log-probability a plain forward gives it (shared prompts and forks included), and on that batch
RLVRAsyncTrainer's loss with TRL's switches is TRL's own compute_loss, value and gradient."""

import numpy as np
import pytest
import torch

pytest.importorskip("trl.experimental.async_grpo")

from trl.experimental.async_grpo import AsyncGRPOTrainer  # noqa: E402
from trl.experimental.async_grpo.async_grpo_trainer import DataCollatorForRollout  # noqa: E402
from trl.experimental.async_grpo.packing import TreeRow  # noqa: E402

from tests.async_.test_async_trainer import make_trainer  # noqa: E402
from trl_rlvr._compat.async_adapter import packed_forward  # noqa: E402

PROMPT = [5, 6, 7, 8]
# (input_ids, number of completion tokens at the end): two answers to one prompt forking after one shared token,
# and an answer to another prompt
SAMPLES = [(PROMPT + [9, 10, 11], 3), (PROMPT + [9, 12], 2), ([13, 14, 15, 16, 17], 2)]
ADVANTAGES = [1.0, -1.0, 0.5]


def rollout_rows(old_shift: float = 0.0) -> list[dict]:
    out = []
    for i, ((ids, n), adv) in enumerate(zip(SAMPLES, ADVANTAGES)):
        mask = np.array([0] * (len(ids) - n) + [1] * n, dtype=np.int64)
        g = np.random.default_rng(i)
        old = np.where(mask == 1, -1.5 + old_shift * g.standard_normal(len(ids)), 0.0).astype(np.float32)
        out.append({"input_ids": np.array(ids, dtype=np.int64), "completion_mask": mask, "old_log_probs": old,
                    "advantage": adv, "group_id": 0 if i < 2 else 1, "metrics": {}})
    return out


def packed_batch(rows):
    tree = TreeRow()
    for row in rows:
        tree.add(row)
    return DataCollatorForRollout(pad_token_id=0, num_processes=1)([[tree]])


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    return make_trainer(tiny_model_dir, tmp_path_factory.mktemp("out"), reward_options={"boxed_math": {"prestart": False}})


def plain_logps(model_dir, trainer) -> list[float]:
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    plain.load_state_dict(trainer.model.state_dict(), strict=False)
    out = []
    with torch.no_grad():
        for ids, n in SAMPLES:
            logps = torch.log_softmax(plain(input_ids=torch.tensor([ids])).logits[0].float(), -1)
            out += [logps[p - 1, ids[p]].item() for p in range(len(ids) - n, len(ids))]
    return out


def test_the_tree_forward_is_the_plain_forward(trainer, tiny_model_dir):
    batch = packed_batch(rollout_rows())
    assert batch["input_ids"].shape[1] < sum(len(ids) for ids, _ in SAMPLES)  # the shared prompt is forwarded once
    with torch.no_grad():
        fwd = packed_forward(trainer, trainer.model, batch)
    assert fwd.segment_id.tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert fwd.log_probs.tolist() == pytest.approx(plain_logps(tiny_model_dir, trainer), abs=1e-4)


def test_trls_switches_give_trls_loss_and_gradient(trainer, monkeypatch):
    batch = packed_batch(rollout_rows(old_shift=0.3))
    trainer.current_gradient_accumulation_steps = 1
    trainer._last_forward_time_s = 0.0
    monkeypatch.setattr(trainer.args, "stale_is_mode", None)
    monkeypatch.setattr(trainer.args, "loss_normalization", "per_batch_token")
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    results = []
    for compute in (AsyncGRPOTrainer.compute_loss, type(trainer).compute_loss):
        trainer.model.zero_grad()
        loss = compute(trainer, trainer.model, batch)
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in params]))
    (trl_loss, trl_grads), (our_loss, our_grads) = results
    assert our_loss == pytest.approx(trl_loss, rel=1e-6)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-8) for a, b in zip(trl_grads, our_grads))
    assert any(g.abs().sum() > 0 for g in our_grads)
