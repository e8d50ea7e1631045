"""Turns continued on one KV cache (``CachedTurns``) against re-encoding every turn's whole context
(``generate_token_rows``, what HF ``generate`` and TRL's tool loop do): in float64 the same tokens, row for row,
over turns that keep a subset of the rows, cut turns short and append replies of different lengths; and only the
new tokens are encoded."""

import random

import pytest


@pytest.fixture(scope="module")
def model64(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    return model, model.generation_config.pad_token_id, {model.generation_config.eos_token_id}


def _conversation(model, pad, eos, greedy, *, reuse, seed, turns=3):
    """Rows of random prompts; after each turn a random subset continues, each keeping a random part of its turn
    and appending a random 'reply': the tokens every turn returned, per row."""
    from trl_rlvr.evaluation.cached_turns import CachedTurns
    from trl_rlvr.evaluation.generation import generate_token_rows

    rng = random.Random(seed)
    vocab = model.config.vocab_size
    eos = eos | set(range(3, vocab, 8))  # rows end at different steps: a batch's rows hold tokens after their end
    shared = [rng.randrange(3, vocab) for _ in range(rng.randint(0, 6))]  # a system prompt, or none
    contexts = [shared + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 12))] for _ in range(7)]
    batch = CachedTurns(model, pad, eos_ids=eos, temperature=0.9)
    rows, returned = None, []
    for turn in range(turns):
        seeds = None if greedy else [f"{seed}:{i}:{turn}" for i in range(len(contexts))]
        if reuse:
            out = batch.generate(contexts, seeds, max_new_tokens=9, rows=rows)
        else:
            out = generate_token_rows(model, pad, contexts, seeds, max_new_tokens=9, eos_ids=eos, temperature=0.9)
        returned.append([ids for ids, _ in out])
        keep = sorted(rng.sample(range(len(contexts)), k=max(1, len(contexts) - 2)))
        contexts = [contexts[i] + out[i][0][:rng.randint(0, len(out[i][0]))]
                    + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 5))] for i in keep]
        rows = keep
    return returned


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_continued_turns_give_the_tokens_of_re_encoding(model64, greedy, seed):
    model, pad, eos = model64
    cached = _conversation(model, pad, eos, greedy, reuse=True, seed=seed)
    encoded = _conversation(model, pad, eos, greedy, reuse=False, seed=seed)
    assert cached == encoded
    assert sum(len(ids) for turn in cached for ids in turn) > 60  # the turns generated something to compare


def test_a_continued_turn_encodes_only_the_new_tokens(model64):
    import torch

    from trl_rlvr.evaluation.cached_turns import CachedTurns

    model, pad, eos = model64
    widths = []
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
                                           with_kwargs=True)
    try:
        batch = CachedTurns(model, pad, eos_ids=eos)
        first = batch.generate([[5, 6, 7, 8, 9, 10], [11, 12, 13]], ["a", "b"], max_new_tokens=4)
        assert batch.cache is not None and widths[0] == 6
        widths.clear()
        reply = [[20, 21, 22], [23]]
        batch.generate([[5, 6, 7, 8, 9, 10] + first[0][0] + reply[0], [11, 12, 13] + first[1][0] + reply[1]],
                       ["c", "d"], max_new_tokens=4, rows=[0, 1])
        # the last sampled token of the first call (never fed) and the widest reply: not the whole context
        assert widths[0] == 1 + 3
        assert batch.sequences.shape[0] == 2 and batch.mask.dtype == torch.long
    finally:
        hook.remove()


def test_a_batch_that_cannot_be_continued_is_re_encoded(model64, monkeypatch):
    from trl_rlvr.evaluation import cached_turns
    from trl_rlvr.evaluation.generation import generate_token_rows

    model, pad, eos = model64
    monkeypatch.setattr(cached_turns, "_continuable", lambda cache, length: False)  # e.g. a sliding-window cache
    batch = cached_turns.CachedTurns(model, pad, eos_ids=eos)
    first = batch.generate([[5, 6, 7], [8, 9]], ["a", "b"], max_new_tokens=3)
    assert batch.cache is None
    contexts = [[5, 6, 7] + first[0][0] + [30], [8, 9] + first[1][0] + [31, 32]]
    assert batch.generate(contexts, ["c", "d"], max_new_tokens=3, rows=[0, 1]) == generate_token_rows(
        model, pad, contexts, ["c", "d"], max_new_tokens=3, eos_ids=eos)


def test_the_rows_common_start_is_encoded_once(model64):
    from trl_rlvr.evaluation.cached_turns import CachedTurns
    from trl_rlvr.evaluation.generation import generate_token_rows

    model, pad, eos = model64
    widths = []
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: widths.append(tuple(kwargs["input_ids"].shape)),
                                           with_kwargs=True)
    contexts = [[7, 8, 9, 10, 11, 12], [7, 8, 9, 10, 20], [7, 8, 9, 10, 11, 30, 31]]
    try:
        out = CachedTurns(model, pad, eos_ids=eos).generate(contexts, ["a", "b", "c"], max_new_tokens=5)
    finally:
        hook.remove()
    assert widths[:2] == [(1, 4), (3, 3)]  # [7, 8, 9, 10] once, then each row's rest (the widest: 11, 30, 31)
    assert out == generate_token_rows(model, pad, contexts, ["a", "b", "c"], max_new_tokens=5, eos_ids=eos)


def test_with_synced_gpus_every_row_is_encoded_in_the_batch(model64):
    """ZeRO-3 / FSDP: every process must make the same forward passes; another process's batch may share nothing,
    so no process encodes a common start on its own."""
    from trl_rlvr.evaluation.cached_turns import CachedTurns

    model, pad, eos = model64
    calls = []
    hook = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        batch = CachedTurns(model, pad, eos_ids=eos, synced_gpus=True)
        batch._shared_prefix_batch([[7, 8, 9, 10], [7, 8, 9, 11]])
    finally:
        hook.remove()
    assert calls == [] and batch.cache is None and batch.sequences.shape == (2, 4)
