"""The stale-rollout importance weight and its loss, against an independent reference written out token by token, on
a tiny model (loss and gradient), and as properties: weights in their bounds, the identity when the behaviour policy
is the current one, no gradient where the formula says none, the metrics of the ratio's spread."""

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.algorithms.stale_is import (
    MODES,
    check_stale_is,
    corrected_token_loss,
    importance_weights,
    log_importance_ratio,
    stale_is_metrics,
    stale_is_sums,
)

EPS_LOW, EPS_HIGH = 0.2, 0.28
C_MIN, C_MAX = 0.5, 2.0


def reference(logp, behaviour, adv, seg, mode, c_min, c_max, eps_low=EPS_LOW, eps_high=EPS_HIGH):
    """Per-token (loss, d loss / d logp, weight) in plain Python floats, from the formula alone:
    loss_t = -(w_t / r_t) min(r_t A, clip(r_t) A), its derivative in logp_t -w_t A where r_t A is the minimum."""
    n = len(logp)
    log_r = [logp[t] - behaviour[t] for t in range(n)]
    seq_log = {}
    for t in range(n):
        seq_log[seg[t]] = seq_log.get(seg[t], 0.0) + log_r[t]
    out = []
    for t in range(n):
        r = math.exp(log_r[t])
        rho = math.exp(seq_log[seg[t]]) if mode.startswith("sequence") else r
        lo = c_min if c_min is not None else 0.0
        hi = c_max if c_max is not None else math.inf
        if mode.endswith("truncate"):
            w = min(max(rho, lo), hi)
        else:
            w = rho if lo <= rho <= hi else 0.0
        a = adv[t]
        clipped_r = min(max(r, 1 - eps_low), 1 + eps_high)
        unclipped_term, clipped_term = r * a, clipped_r * a
        loss = -(w / r) * min(unclipped_term, clipped_term)
        # d/dlogp of r*A is r*A; of clip(r)*A it is r*A inside the clip range, 0 outside
        if unclipped_term <= clipped_term:
            grad = -(w / r) * r * a
        else:
            grad = 0.0
        out.append((loss, grad, w))
    return out


# Six tokens, three completions; token ratios from 0.37 to 4.5, completions' 0.37, 1.1 and 2.01: both advantage
# signs, both sides of every bound.
LOGP = [-1.0, -2.0, -0.5, -3.0, -1.2, -0.7]
BEHAVIOUR = [-1.1, -0.5, -2.0, -2.0, -1.2, -1.4]
ADV = [1.0, 1.0, -1.0, -1.0, 0.5, 0.5]
SEG = [0, 0, 0, 1, 1, 2]


@pytest.mark.parametrize("mode", MODES)
def test_matches_the_token_by_token_reference(mode):
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    loss, weights = corrected_token_loss(logp, torch.tensor(BEHAVIOUR, dtype=torch.float64),
                                         torch.tensor(ADV, dtype=torch.float64), torch.tensor(SEG),
                                         epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, mode=mode, clip_min=C_MIN,
                                         clip_max=C_MAX)
    loss.sum().backward()
    want = reference(LOGP, BEHAVIOUR, ADV, SEG, mode, C_MIN, C_MAX)
    assert loss.tolist() == pytest.approx([w[0] for w in want], rel=1e-12)
    assert logp.grad.tolist() == pytest.approx([w[1] for w in want], rel=1e-12, abs=1e-15)
    assert weights.tolist() == pytest.approx([w[2] for w in want], rel=1e-12)


def test_the_example_exercises_every_branch():
    """The example above is informative: each mode changes some weight, PPO's clip zeroes some gradient, and the
    negative-advantage token with the largest ratio (4.5) is truncated to C_max."""
    log_r = [a - b for a, b in zip(LOGP, BEHAVIOUR)]
    assert max(log_r) > math.log(C_MAX) and min(log_r) < math.log(C_MIN)
    token = reference(LOGP, BEHAVIOUR, ADV, SEG, "token_truncate", C_MIN, C_MAX)
    assert token[2][1] == pytest.approx(C_MAX * 1.0)  # r = e^1.5, A = -1: gradient -w A = +C_max, not +4.48
    assert any(g == 0.0 for _, g, _ in token)
    for mode in MODES:
        seq = mode.startswith("sequence")
        rho = [math.exp(sum(lr for lr, s in zip(log_r, SEG) if s == SEG[t]) if seq else log_r[t]) for t in range(6)]
        ws = [w for _, _, w in reference(LOGP, BEHAVIOUR, ADV, SEG, mode, C_MIN, C_MAX)]
        changed = [w != pytest.approx(r) for w, r in zip(ws, rho)]
        assert any(changed) and not all(changed), mode


def test_no_correction_is_trls_async_loss():
    logp = torch.tensor(LOGP, requires_grad=True)
    loss, weights = corrected_token_loss(logp, torch.tensor(BEHAVIOUR), torch.tensor(ADV), torch.tensor(SEG),
                                         epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, mode=None)
    # AsyncGRPOTrainer.compute_loss, TRL 1.16, written out
    ratio = torch.exp(torch.tensor(LOGP) - torch.tensor(BEHAVIOUR))
    trl = -torch.min(ratio * torch.tensor(ADV), torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * torch.tensor(ADV))
    assert torch.equal(loss.detach(), trl) and torch.equal(weights, ratio)


# -- the tiny model: the stale policy is a perturbed copy, the loss and its gradient against the formula ---------

PROMPT, COMPLETION, ROWS = 5, 8, 4


@pytest.fixture(scope="module")
def policies(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    current = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    stale = copy.deepcopy(current)
    with torch.no_grad():
        for p in stale.parameters():
            p.add_(0.05 * torch.randn_like(p))  # token ratios 0.57..2.5, completions' 0.69..2.5
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(6, current.config.vocab_size, (ROWS, PROMPT + COMPLETION), generator=g)
    mask = torch.ones(ROWS, COMPLETION, dtype=torch.bool)
    mask[1, -3:] = False
    return current, stale, ids, mask


def completion_logps(model, ids):
    logits = model(input_ids=ids).logits[:, PROMPT - 1:-1]
    return torch.log_softmax(logits, -1).gather(-1, ids[:, PROMPT:, None]).squeeze(-1)


@pytest.mark.parametrize("mode", MODES)
def test_tiny_model_loss_and_gradient_match_the_formula(policies, mode):
    current, stale, ids, mask = policies
    with torch.no_grad():
        behaviour = completion_logps(stale, ids)
    advantages = torch.tensor([1.2, -0.8, -1.5, 0.6], dtype=torch.float64)[:, None].expand(ROWS, COMPLETION)
    seg = torch.arange(ROWS)[:, None].expand(ROWS, COMPLETION)

    current.zero_grad()
    logp = completion_logps(current, ids)
    loss, weights = corrected_token_loss(logp[mask], behaviour[mask], advantages[mask], seg[mask], epsilon_low=EPS_LOW,
                                   epsilon_high=EPS_HIGH, mode=mode, clip_min=C_MIN, clip_max=C_MAX)
    total = loss.sum() / mask.sum()
    total.backward()
    got = {name: p.grad.clone() for name, p in current.named_parameters()}

    # Reference: the formula with autograd, written on the padded (N, T) batch: w from the definition, then
    # -(w / sg(r)) min(r A, clip(r) A) summed over the mask.
    current.zero_grad()
    logp = completion_logps(current, ids)
    log_r = logp - behaviour
    r = torch.exp(log_r)
    log_rho = (log_r.detach() * mask).sum(1, keepdim=True).expand_as(r) if mode.startswith("sequence") else log_r.detach()
    rho = torch.exp(log_rho)
    if mode.endswith("truncate"):
        w = rho.clamp(C_MIN, C_MAX)
    else:
        w = rho * ((rho >= C_MIN) & (rho <= C_MAX))
    per_token = -(w / r.detach()) * torch.min(r * advantages, r.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * advantages)
    want_total = (per_token * mask).sum() / mask.sum()
    want_total.backward()

    assert total.item() == pytest.approx(want_total.item(), rel=1e-10)
    for name, p in current.named_parameters():
        assert torch.allclose(got[name], p.grad, rtol=1e-8, atol=1e-12), name
    assert any(g.abs().sum() > 0 for g in got.values())
    rho = torch.exp(log_importance_ratio((logp - behaviour)[mask], seg[mask], mode))
    changed = ~torch.isclose(weights, rho)
    assert changed.any() and not changed.all()  # the correction changes some weights and keeps others


# -- properties ------------------------------------------------------------------------------------------------

finite = st.floats(-6.0, 6.0, allow_nan=False)


@st.composite
def batches(draw):
    n = draw(st.integers(1, 12))
    logp = draw(st.lists(finite, min_size=n, max_size=n))
    behaviour = draw(st.lists(finite, min_size=n, max_size=n))
    adv = draw(st.lists(st.floats(-3.0, 3.0, allow_nan=False), min_size=n, max_size=n))
    cuts = sorted(draw(st.lists(st.integers(1, n), max_size=3)))
    seg = [sum(t >= c for c in cuts) for t in range(n)]
    seg = [sorted(set(seg)).index(s) for s in seg]
    return logp, behaviour, adv, seg


bounds = st.tuples(st.one_of(st.none(), st.floats(0.0, 1.0)), st.floats(1.0, 10.0))


@settings(max_examples=200, deadline=None)
@given(batches(), st.sampled_from(MODES), bounds)
def test_weights_stay_in_their_bounds(batch, mode, bound):
    logp, behaviour, _, seg = batch
    c_min, c_max = bound
    w = importance_weights(torch.tensor(logp, dtype=torch.float64) - torch.tensor(behaviour, dtype=torch.float64),
                           torch.tensor(seg), mode, c_min, c_max)
    lo = c_min or 0.0
    inside = (w >= lo * (1 - 1e-12)) & (w <= c_max * (1 + 1e-12))
    assert bool((inside | ((w == 0) & torch.tensor(mode.endswith("mask")))).all())
    if mode.startswith("sequence"):
        for s in set(seg):
            assert len({v for v, g in zip(w.tolist(), seg) if g == s}) == 1


@settings(max_examples=200, deadline=None)
@given(batches(), st.sampled_from(MODES), bounds)
def test_identity_when_the_behaviour_policy_is_the_current_one(batch, mode, bound):
    logp, _, adv, seg = batch
    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    a = torch.tensor(adv, dtype=torch.float64)
    loss, w = corrected_token_loss(lp, lp.detach().clone(), a, torch.tensor(seg), epsilon_low=EPS_LOW,
                                   epsilon_high=EPS_HIGH, mode=mode, clip_min=bound[0], clip_max=bound[1])
    loss.sum().backward()
    assert torch.equal(w, torch.ones_like(w))
    assert torch.allclose(loss.detach(), -a) and torch.allclose(lp.grad, -a)


@settings(max_examples=300, deadline=None)
@given(batches(), st.sampled_from(MODES), bounds)
def test_gradient_is_minus_w_a_on_active_tokens_zero_elsewhere_and_bounded(batch, mode, bound):
    logp, behaviour, adv, seg = batch
    c_min, c_max = bound
    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    a = torch.tensor(adv, dtype=torch.float64)
    loss, w = corrected_token_loss(lp, torch.tensor(behaviour, dtype=torch.float64), a, torch.tensor(seg),
                                   epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, mode=mode, clip_min=c_min,
                                   clip_max=c_max)
    loss.sum().backward()
    r = torch.exp(torch.tensor(logp, dtype=torch.float64) - torch.tensor(behaviour, dtype=torch.float64))
    clipped = ((a > 0) & (r > 1 + EPS_HIGH)) | ((a < 0) & (r < 1 - EPS_LOW))
    assert torch.allclose(lp.grad, torch.where(clipped, 0.0, -w * a), rtol=1e-12, atol=1e-12)
    assert bool((lp.grad[clipped | (w == 0)] == 0).all())
    assert bool((lp.grad.abs() <= c_max * a.abs() * (1 + 1e-12)).all())  # bounded on both advantage signs


@settings(max_examples=200, deadline=None)
@given(batches())
def test_bounds_that_hold_every_ratio_give_trls_loss(batch):
    logp, behaviour, adv, seg = batch
    args = (torch.tensor(behaviour, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64), torch.tensor(seg))
    lp_a = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    lp_b = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    ours, _ = corrected_token_loss(lp_a, *args, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, mode="token_truncate",
                                   clip_min=0.0, clip_max=math.exp(13))
    trl, _ = corrected_token_loss(lp_b, *args, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, mode=None)
    ours.sum().backward()
    trl.sum().backward()
    assert torch.allclose(ours, trl, rtol=1e-10) and torch.allclose(lp_a.grad, lp_b.grad, rtol=1e-10)


def test_the_unbounded_branch_is_bounded():
    """A < 0, r = e^5 = 148: TRL's gradient weight is 148 |A|; truncated, C_max |A|."""
    lp = torch.tensor([0.0], requires_grad=True)
    args = (torch.tensor([-5.0]), torch.tensor([-1.0]), torch.tensor([0]))
    trl, _ = corrected_token_loss(lp, *args, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH)
    (g_trl,) = torch.autograd.grad(trl.sum(), lp)
    ours, _ = corrected_token_loss(lp, *args, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, mode="token_truncate",
                                   clip_max=C_MAX)
    (g_ours,) = torch.autograd.grad(ours.sum(), lp)
    assert g_trl.item() == pytest.approx(math.exp(5)) and g_ours.item() == pytest.approx(C_MAX)


def test_a_missing_behaviour_log_prob_weighs_zero():
    lp = torch.tensor([-1.0, -1.0, -1.0], requires_grad=True)
    behaviour = torch.tensor([-1.0, math.nan, -1.0])
    for mode, zero in (("token_truncate", [False, True, False]), ("sequence_mask", [True, True, False])):
        loss, w = corrected_token_loss(lp, behaviour, torch.ones(3), torch.tensor([0, 0, 1]), epsilon_low=EPS_LOW,
                                       epsilon_high=EPS_HIGH, mode=mode, clip_max=C_MAX)
        assert (w == 0).tolist() == zero and not torch.isnan(loss).any()
        (grad,) = torch.autograd.grad(loss.sum(), lp)
        assert not torch.isnan(grad).any() and (grad == 0).tolist() == zero


def test_settings_are_checked():
    check_stale_is(None, None, None)
    check_stale_is("token_mask", None, None)  # mask without bounds: a no-op, but well defined
    for mode, c_min, c_max, field in (("token", None, 2.0, "stale_is_mode"),
                                      ("token_truncate", None, None, "stale_is_clip_max"),
                                      ("sequence_truncate", 1.5, 2.0, "stale_is_clip_min"),
                                      ("token_truncate", None, 0.9, "stale_is_clip_max")):
        with pytest.raises(ValueError, match=field):
            check_stale_is(mode, c_min, c_max)


# -- metrics ---------------------------------------------------------------------------------------------------

def test_metrics_of_a_hand_example():
    log_r = torch.tensor([0.0, math.log(4.0), math.log(0.25), math.nan])
    seg = torch.tensor([0, 1, 2, 3])
    w = importance_weights(log_r, seg, "token_truncate", 0.5, 2.0)  # [1, 2, 0.5, 0]
    m = stale_is_metrics(stale_is_sums(log_importance_ratio(log_r, seg, "token_truncate"), w))
    assert m["stale_is/ratio_mean"] == pytest.approx((1 + 4 + 0.25) / 3)
    assert m["stale_is/ratio_max"] == pytest.approx(4.0) and m["stale_is/ratio_min"] == pytest.approx(0.25)
    assert m["stale_is/log_ratio_std"] == pytest.approx(math.log(4.0) * math.sqrt(2 / 3))
    assert m["stale_is/clipped_frac"] == pytest.approx(3 / 4)
    assert m["stale_is/ess_frac"] == pytest.approx(3.5 ** 2 / 5.25 / 4)


def test_sums_add_over_micro_batches():
    g = torch.Generator().manual_seed(0)
    log_r = torch.randn(10, generator=g, dtype=torch.float64)
    w = importance_weights(log_r, torch.arange(10), "token_truncate", None, 1.5)
    whole = stale_is_sums(log_r, w)
    a, b = stale_is_sums(log_r[:4], w[:4]), stale_is_sums(log_r[4:], w[4:])
    parts = torch.cat([(a + b)[:-2], torch.maximum(a, b)[-2:-1], torch.minimum(a, b)[-1:]])
    assert torch.allclose(whole, parts)
    assert stale_is_metrics(whole)["stale_is/ess_frac"] < 1


def test_metrics_of_nothing_are_nan():
    m = stale_is_metrics(stale_is_sums(torch.zeros(0), torch.zeros(0)))
    assert all(math.isnan(v) for v in m.values())


@pytest.mark.parametrize("mode", [None, *MODES])
def test_clip_higher_decides_which_positive_tokens_move(mode):
    """A > 0, r = 1.25: inside clip-higher's range (eps_high 0.28) the token moves, above it (eps_high 0.2) not;
    A < 0, r = 0.75: below 1 - eps_low (0.2) it does not move, above 1 - 0.3 it does."""
    lp = torch.tensor([math.log(1.25), math.log(0.75)], dtype=torch.float64, requires_grad=True)
    args = (torch.zeros(2, dtype=torch.float64), torch.tensor([1.0, -1.0], dtype=torch.float64), torch.tensor([0, 1]))
    grads = []
    for eps_low, eps_high in ((0.2, 0.28), (0.3, 0.2)):
        loss, _ = corrected_token_loss(lp, *args, epsilon_low=eps_low, epsilon_high=eps_high, mode=mode, clip_max=3.0)
        grads.append(torch.autograd.grad(loss.sum(), lp)[0])
    assert grads[0][0] != 0 and grads[1][0] == 0
    assert grads[0][1] == 0 and grads[1][1] != 0


def test_one_token_carrying_the_weight_is_a_small_effective_sample():
    """A window where one token of 20 carries the weight: ESS 1/20 of the tokens."""
    log_r = torch.tensor([8.0] + [0.0] * 19)
    w = importance_weights(log_r, torch.arange(20), "token_truncate", None, 1e6)
    assert stale_is_metrics(stale_is_sums(log_r, w))["stale_is/ess_frac"] < 0.1
