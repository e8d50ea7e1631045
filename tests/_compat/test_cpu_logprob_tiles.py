"""``cpu_logprob_tile_tokens``: on a CPU, TRL's fused LM head projects the configured number of tokens per tile, in
the forward and in the backward of every training step, and the loss's gradient is still the reference's."""

from __future__ import annotations

import pytest
import torch

from tests.harness.loss_harness import (
    assert_grads_equal,
    fixed_batch,
    make_trainer,
    reference_grads,
    run_trainer,
    select_rows,
)
from trl_rlvr._compat import trl_contract
from trl_rlvr._compat.logprob_tiles import cpu_logprob_tiles
from trl_rlvr.testing import load_tokenizer


def record_tiles(monkeypatch) -> dict[str, list[int]]:
    """The token rows of every tile TRL's torch fold sees, by pass."""
    from trl.kernels import chunked_logprob

    seen = {"forward": [], "backward": []}
    for name, kind in (("_forward_tile", "forward"), ("_backward_tile", "backward")):
        fold = getattr(chunked_logprob, name)

        def recording(tile, *args, _fold=fold, _kind=kind, **kwargs):
            seen[_kind].append(tile.shape[0])
            return _fold(tile, *args, **kwargs)

        monkeypatch.setattr(chunked_logprob, name, recording)
    return seen


def test_each_training_step_projects_the_configured_tiles_forward_and_backward(tiny_model_dir, monkeypatch):
    from trl.kernels import chunked_logprob

    tiles = record_tiles(monkeypatch)
    run_trainer(tiny_model_dir, "per_batch_token", 2, 2, 1, cpu_logprob_tile_tokens=5)
    assert tiles["forward"] and tiles["backward"]
    assert max(tiles["forward"]) == max(tiles["backward"]) == 5
    assert chunked_logprob.TOKEN_CHUNK_SIZE == 4096  # put back after the step

    tiles["forward"].clear(), tiles["backward"].clear()
    run_trainer(tiny_model_dir, "per_batch_token", 2, 2, 1, cpu_logprob_tile_tokens=0)  # TRL's tile: one per pass
    assert max(tiles["forward"]) > 5 and len(tiles["forward"]) == len(tiles["backward"]) == 2  # 2 micro-batches


def test_small_tiles_keep_the_reference_gradient(tiny_model_dir):
    grads, rows, _ = run_trainer(tiny_model_dir, "per_batch_token", 2, 2, 1, cpu_logprob_tile_tokens=3)
    batch = fixed_batch(len(load_tokenizer(tiny_model_dir)))
    assert_grads_equal(grads[0], reference_grads(tiny_model_dir, select_rows(batch, rows[0]), "per_batch_token"))


def test_small_tiles_give_the_log_probs_and_entropies_to_float32_rounding(tiny_model_dir):
    """Each token's dot products and its sum over the vocabulary are the same; only the BLAS's blocking of a tile's
    rows may round differently (bit-equal here at tiles of 4, 8, 16... tokens, not at 3 or 5)."""
    trainer = make_trainer(tiny_model_dir)
    batch = fixed_batch(len(trainer.processing_class))
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.ones_like(ids)
    width = batch["completion_ids"].size(1)
    with torch.no_grad():
        trl_tiles = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, width, compute_entropy=True)
        with cpu_logprob_tiles(3, torch.device("cpu")):
            small = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, width, compute_entropy=True)
    for trl_tile, small_tile in zip(trl_tiles[:2], small[:2], strict=True):
        torch.testing.assert_close(small_tile, trl_tile, rtol=1e-6, atol=2e-6)


def test_the_tile_is_swapped_on_a_cpu_only_and_put_back_however_the_block_ends():
    from trl.kernels import chunked_logprob

    with cpu_logprob_tiles(64, torch.device("cpu")):
        assert chunked_logprob.TOKEN_CHUNK_SIZE == 64
    for device, tokens in ((torch.device("cuda"), 64), ("cuda", 64), (torch.device("cpu"), 0)):
        with cpu_logprob_tiles(tokens, device):
            assert chunked_logprob.TOKEN_CHUNK_SIZE == 4096
    with pytest.raises(RuntimeError, match="mid-step"), cpu_logprob_tiles(64, "cpu"):
        raise RuntimeError("mid-step")
    assert chunked_logprob.TOKEN_CHUNK_SIZE == 4096


@pytest.mark.parametrize("bad", [-1, 2.5, True, "256"])
def test_a_bad_tile_is_refused_by_name(bad):
    from trl_rlvr import RLVRConfig

    with pytest.raises(ValueError, match="cpu_logprob_tile_tokens"):
        RLVRConfig(output_dir="unused", bf16=False, cpu_logprob_tile_tokens=bad)


@pytest.mark.trl_contract
def test_a_trl_whose_tile_moved_is_named(monkeypatch):
    """The contract check can fail: the constant gone, or no longer read where the swap needs it."""
    import sys
    import types

    assert trl_contract.module_constant_violations("here") == []
    module = types.ModuleType("fake_chunked_logprob")

    class ChunkedLogProbFunction:
        @staticmethod
        def forward(ctx, hidden):
            return hidden  # tiles of another size, read from elsewhere

        @staticmethod
        def backward(ctx, grad):
            return grad

    module.ChunkedLogProbFunction = ChunkedLogProbFunction
    monkeypatch.setitem(sys.modules, "fake_chunked_logprob", module)
    constants = {"fake_chunked_logprob": ("TOKEN_CHUNK_SIZE", "ChunkedLogProbFunction")}
    assert trl_contract.module_constant_violations("here", constants) == [
        "change GRPOAdapter.training_step: fake_chunked_logprob.TOKEN_CHUNK_SIZE is gone or no longer an integer in "
        "here"]
    module.TOKEN_CHUNK_SIZE = 4096
    problems = trl_contract.module_constant_violations("here", constants)
    assert [p.split(" no longer")[0] for p in problems] == [
        "change GRPOAdapter.training_step: fake_chunked_logprob.ChunkedLogProbFunction.forward",
        "change GRPOAdapter.training_step: fake_chunked_logprob.ChunkedLogProbFunction.backward"]
