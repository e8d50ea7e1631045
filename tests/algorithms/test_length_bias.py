"""The length-bias study (examples/length_bias.py) through RLVRTrainer: the toy is the tutorial's, the trainer's update is
the tutorial's update, and a reduced run shows the bias (right answers shorter with per-answer normalization)."""


import pytest
import torch

import trl_rlvr.testing.length_bias_toy as toy  # light: no TRL import


def test_policy_is_the_seed_table():
    """Logits at each position are the table's (question, position, previous) row; an end token keeps "previous"."""
    model = toy.build_policy()
    with torch.no_grad():
        model.backbone.table.weight.normal_()
    table = model.table()
    q = 5
    #            q5                  a2  </s> a1  a3  </s>  (an end token mid-sequence, as in the tutorial's prev rule)
    ids = torch.tensor([[toy.FIRST_QUESTION_ID + q, 2, toy.EOS_ID, 1, 3, toy.EOS_ID]])
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
    expected_prev = [toy.START, 2, 2, 1, 3]  # previous answer token seen when predicting answer position t
    for t, prev in enumerate(expected_prev):
        assert torch.equal(logits[t, : toy.V + 1], table[q, t, prev])
        assert (logits[t, toy.V + 1 :] < -1e3).all()  # pad and question tokens can never be sampled
    # left padding does not move the question
    padded = torch.tensor([[toy.PAD_ID, toy.PAD_ID, toy.FIRST_QUESTION_ID + q, 2]])
    out = model(input_ids=padded, attention_mask=torch.tensor([[0, 0, 1, 1]])).logits[0]
    assert torch.equal(out[2, : toy.V + 1], table[q, 0, toy.START]) and torch.equal(out[3, : toy.V + 1], table[q, 1, 2])


def test_generation_samples_only_answer_tokens_and_end():
    model, tok = toy.build_policy(), toy.build_tokenizer()
    assert tok("q3")["input_ids"] == [toy.FIRST_QUESTION_ID + 3]
    ids = torch.tensor([[toy.FIRST_QUESTION_ID + 3]] * 64)
    torch.manual_seed(0)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=toy.LMAX,
                         do_sample=True, pad_token_id=toy.PAD_ID, eos_token_id=toy.EOS_ID)[:, 1:]
    assert set(out.unique().tolist()) <= set(range(toy.V + 2))  # answer tokens, end, and pad after the end
    assert ((out == toy.EOS_ID).any(1) | (out != toy.PAD_ID).all(1)).all()


def test_reference_update_one_is_uniform():
    """Update 1 samples from the zero table: accuracy ~1/5, right answers ~4.95 tokens, wrong ones ~3.96."""
    stats = [toy.reference_run("GRPO", 16, s, 1)[0] for s in range(8)]
    acc = sum(s["accuracy"] for s in stats) / len(stats)
    right = sum(s["len_right"] for s in stats) / len(stats)
    wrong = sum(s["len_wrong"] for s in stats) / len(stats)
    assert abs(acc - 0.2) < 0.03 and abs(right - 4.95) < 0.35 and abs(wrong - 3.96) < 0.25


@pytest.fixture(scope="module")
def lb():
    from examples import length_bias

    torch.set_num_threads(1)
    return length_bias


@pytest.mark.slow
@pytest.mark.parametrize("method", toy.METHODS)
def test_trainer_update_is_the_seeds_update(lb, method):
    """Replay the batches RLVRTrainer sampled through the tutorial's loss and plain Adam: same table.

    Exact up to float rounding; Adam turns rounding-level gradients (cells where contributions cancel) into
    steps of up to ~1e-3, far below one real step (lr = 0.05).
    """
    batches = []
    _, model = lb.trainer_run(method, 4, seed=1, updates=3, batches=batches, return_model=True)
    assert len(batches) == 3 and all(len(b[0]) == toy.Q * 4 for b in batches)
    replayed = lb.replay_reference(batches, method, 4)
    trained = model.table().detach()
    assert trained.abs().max() > 0.1  # it did train
    assert (trained - replayed).abs().max() < 2e-3


@pytest.mark.slow
def test_per_answer_normalization_shortens_right_answers(lb):
    """One seed, G=16, 150 updates: right answers end >= 1 token shorter with per_answer than with constant."""
    updates, window = 150, 20
    runs = {m: lb.trainer_run(m, 16, seed=0, updates=updates) for m in ("GRPO", "Dr. GRPO")}

    def late(history, field):
        return sum(h[field] for h in history[-window:]) / window

    right = {m: late(h, "len_right") for m, h in runs.items()}
    assert late(runs["GRPO"], "accuracy") > 0.9 and late(runs["Dr. GRPO"], "accuracy") > 0.9
    assert right["GRPO"] <= right["Dr. GRPO"] - 1.0, right
    assert right["Dr. GRPO"] > 4.3, right  # without per-answer normalization they stay near 5 tokens
    assert runs["GRPO"][0] == runs["Dr. GRPO"][0]  # same seed -> same first batch (sampled before any update)
