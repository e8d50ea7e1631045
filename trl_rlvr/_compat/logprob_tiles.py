"""TRL's fused LM head on a CPU, in token tiles sized for a CPU (declared in :data:`.trl_contract.MODULE_CONSTANTS`).

GRPOTrainer scores a micro-batch through ``trl.kernels.chunked_logprob.ChunkedLogProbFunction``: the hidden states
times the LM head in tiles of ``TOKEN_CHUNK_SIZE`` tokens (4096) x ``chunk_size`` vocabulary entries (32768), folded
into an online log-sum-exp, forward and again in backward. Without Triton (a CPU) the fold runs as torch ops on the
whole tile, several float32 copies of it at once, and every position of the micro-batch is scored (prompt included):
a micro-batch of 4 rows of ~250 tokens is one tile of ~1000 x 32768, 0.13 GB a copy. A smaller tile computes each
token's log-probability and entropy with the same dot products and the same sum over the vocabulary (the BLAS may
block a tile's rows differently: a float32 rounding at most); the LM head's weight gradient, a sum over tokens, is
added up in more pieces (differences ~1e-7). Measured: docs/benchmarks.md, "On a CPU: the LM head in tiles of 256
tokens".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from trl_rlvr._compat.swaps import swapped


@contextlib.contextmanager
def cpu_logprob_tiles(tokens: int, device) -> Iterator[None]:
    """Within the block (a training step: its forward and its backward), TRL's chunked log-prob function projects
    ``tokens`` tokens per tile when ``device`` is a CPU; on other devices (where TRL's Triton kernel runs), or with
    ``tokens`` 0, TRL's tile is kept. The module constant is put back however the block ends."""
    if not tokens or getattr(device, "type", device) != "cpu":
        yield
        return
    from trl.kernels import chunked_logprob

    with swapped(chunked_logprob, "TOKEN_CHUNK_SIZE", tokens):
        yield
