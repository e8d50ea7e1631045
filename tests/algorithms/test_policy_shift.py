"""The policy's shift on the batch it trained on, on a tiny seeded model: signs, the k3 KL against the exact KL,
and the alarm's bound on a small and on a too-large step."""

import copy
import math

import pytest
import torch

from trl_rlvr.algorithms.policy_shift import completion_logps, k3_kl, policy_shift, shift_alarm

PROMPT, COMPLETION, ROWS = 6, 12, 8


@pytest.fixture(scope="module")
def model_and_batch(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(6, model.config.vocab_size, (ROWS, PROMPT + COMPLETION), generator=g)
    mask = torch.ones(ROWS, COMPLETION)
    mask[0, -3:] = 0  # padding after an early end
    advantages = torch.tensor([1.0, -1.0] * (ROWS // 2))
    return model, ids, mask, advantages


def one_step(model, ids, mask, advantages, lr):
    """A copy of ``model`` after one Adam step of REINFORCE (-A * sum of the completion's log-probs)."""
    new = copy.deepcopy(model)
    opt = torch.optim.Adam(new.parameters(), lr=lr)
    logits = new(input_ids=ids).logits[:, PROMPT - 1:-1]
    logps = torch.log_softmax(logits, -1).gather(-1, ids[:, PROMPT:, None]).squeeze(-1)
    loss = -(advantages[:, None] * logps * mask).sum() / mask.sum()
    loss.backward()
    opt.step()
    return new


def test_no_update_no_shift(model_and_batch):
    model, ids, mask, adv = model_and_batch
    old = completion_logps(model, ids, torch.ones_like(ids), COMPLETION, batch_size=3)
    shift = policy_shift(old, old.clone(), mask, adv)
    assert shift["shift/logp_pos"] == 0 and shift["shift/logp_neg"] == 0 and shift["shift/kl_old_new"] == 0
    assert shift_alarm(shift) is None


def test_completion_logps_are_the_models_own(model_and_batch):
    model, ids, _, _ = model_and_batch
    got = completion_logps(model, ids, torch.ones_like(ids), COMPLETION, batch_size=3)
    with torch.no_grad():
        logits = model(input_ids=ids[:1]).logits[0]
    want = torch.log_softmax(logits[PROMPT + 1], -1)[ids[0, PROMPT + 2]]
    assert got.shape == (ROWS, COMPLETION)
    assert got[0, 2].item() == pytest.approx(want.item(), abs=1e-5)


def test_a_small_step_moves_each_sign_its_way_and_stays_under_the_alarm(model_and_batch):
    model, ids, mask, adv = model_and_batch
    att = torch.ones_like(ids)
    old = completion_logps(model, ids, att, COMPLETION)
    new = completion_logps(one_step(model, ids, mask, adv, lr=1e-4), ids, att, COMPLETION)
    shift = policy_shift(old, new, mask, adv)
    assert shift["shift/logp_pos"] > 0 > shift["shift/logp_neg"]
    assert 0 < shift["shift/kl_old_new"] < 0.05
    assert shift_alarm(shift) is None


def test_a_large_step_fires_the_alarm(model_and_batch):
    model, ids, mask, adv = model_and_batch
    att = torch.ones_like(ids)
    old = completion_logps(model, ids, att, COMPLETION)
    new = completion_logps(one_step(model, ids, mask, adv, lr=3e-2), ids, att, COMPLETION)
    shift = policy_shift(old, new, mask, adv)
    assert shift["shift/logp_neg"] < -1.0
    message = shift_alarm(shift, max_nats=1.0)
    assert message is not None and "negative-advantage" in message and "nats" in message


# The values of rlvr/shift_* logged on the two CPU main jobs' default steps (docs/tool_rl.md, "No false alarm on the
# main jobs"): examples/r1zero.py, its 9 steps (a run that takes held-out accuracy from 0% to 20%), and
# examples/tool_r1.py, step 1 (a run whose RL loses 19 points against its cold start).
R1ZERO_STEPS = [
    {"shift/logp_pos": 4.329, "shift/logp_neg": -18.949, "shift/kl_old_new": 0.2286, "shift/token_logp_max_abs": 4.155},
    {"shift/logp_pos": 2.374, "shift/logp_neg": -8.813, "shift/kl_old_new": 0.0484, "shift/token_logp_max_abs": 3.386},
    {"shift/logp_pos": 0.494, "shift/logp_neg": -2.961, "shift/kl_old_new": 0.0292, "shift/token_logp_max_abs": 1.894},
    {"shift/logp_pos": 1.436, "shift/logp_neg": -5.564, "shift/kl_old_new": 0.0257, "shift/token_logp_max_abs": 1.313},
    {"shift/logp_pos": 0.733, "shift/logp_neg": -6.278, "shift/kl_old_new": 0.0337, "shift/token_logp_max_abs": 4.338},
    {"shift/logp_pos": 1.821, "shift/logp_neg": -4.443, "shift/kl_old_new": 0.0206, "shift/token_logp_max_abs": 2.158},
    {"shift/logp_pos": 0.519, "shift/logp_neg": -5.537, "shift/kl_old_new": 0.0298, "shift/token_logp_max_abs": 2.428},
    {"shift/logp_pos": 0.620, "shift/logp_neg": -2.195, "shift/kl_old_new": 0.0295, "shift/token_logp_max_abs": 1.491},
    {"shift/logp_pos": 0.497, "shift/logp_neg": -2.446, "shift/kl_old_new": 0.0165, "shift/token_logp_max_abs": 1.661},
]
TOOL_STEP_1 = {"shift/logp_pos": 0.185, "shift/logp_neg": -8.563, "shift/kl_old_new": 0.0672,
               "shift/token_logp_max_abs": 8.729}


def test_the_default_bound_spares_the_healthy_main_job_and_names_the_failing_one():
    assert all(shift_alarm(step) is None for step in R1ZERO_STEPS)
    message = shift_alarm(TOOL_STEP_1)
    assert message is not None and "one trained token's log-probability by 8.73 nats (bound 6)" in message
    # bounds on the per-rollout change or the KL cannot tell them apart: the healthy steps are the larger
    for bound in ({"max_nats": 8.0}, {"max_kl": 0.06}):
        assert shift_alarm(TOOL_STEP_1, None, **bound) is not None and shift_alarm(R1ZERO_STEPS[0], None, **bound)


def test_masked_tokens_do_not_count():
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.1, 0.1, -50.0], [-0.2, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    shift = policy_shift(old, new, mask, torch.tensor([1.0, -1.0]))
    assert shift["shift/logp_pos"] == pytest.approx(0.2) and shift["shift/logp_neg"] == pytest.approx(-0.2)
    assert shift["shift/token_logp_max_abs"] == pytest.approx(0.2)
    assert math.isnan(policy_shift(old, new, mask, torch.tensor([1.0, 0.0]))["shift/logp_neg"])
    with pytest.raises(ValueError, match="policy_shift"):
        policy_shift(old, new, mask[:1], torch.tensor([1.0, 0.0]))


def test_k3_is_an_unbiased_estimate_of_kl_old_new(model_and_batch):
    """Tokens sampled from old at fixed contexts: the mean of k3 matches the exact KL(old||new) over the vocabulary."""
    model, ids, mask, adv = model_and_batch
    new_model = one_step(model, ids, mask, adv, lr=3e-3)
    with torch.no_grad():
        old_lp = torch.log_softmax(model(input_ids=ids[:2]).logits[:, PROMPT:].float(), -1)
        new_lp = torch.log_softmax(new_model(input_ids=ids[:2]).logits[:, PROMPT:].float(), -1)
    exact = (old_lp.exp() * (old_lp - new_lp)).sum(-1)  # (2, positions)
    g = torch.Generator().manual_seed(1)
    samples = torch.multinomial(old_lp.exp().reshape(-1, old_lp.shape[-1]), 4000, replacement=True, generator=g)
    o = old_lp.reshape(-1, old_lp.shape[-1]).gather(1, samples)
    n = new_lp.reshape(-1, new_lp.shape[-1]).gather(1, samples)
    estimate = k3_kl(o, n).mean()
    assert (k3_kl(o, n) >= 0).all()
    assert exact.mean().item() > 1e-3  # the step moved the policy
    assert estimate.item() == pytest.approx(exact.mean().item(), rel=0.1)
