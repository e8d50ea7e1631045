"""Multi-turn generation that encodes each token once: a batch's rows are continued turn after turn on one KV cache.

HF ``generate`` alone (like TRL's tool loop and :func:`trl_rlvr.evaluation.generation.generate_token_rows`)
re-encodes a row's whole conversation at every turn: the second turn of a tool rollout pays a forward pass over the
prompt, the first turn and the tool reply again. :class:`CachedTurns` keeps the batch's cache between calls and
encodes only what is new (the tool reply). A new batch's rows often start alike (the system prompt and the tools'
schema): their longest common prefix is encoded once, on one row, and its cache repeated over the rows.

How a row is continued. The batch keeps its token columns, the attention mask over them and, per row, which columns
hold the row's tokens. The mask is 0 on left padding and on columns the row does not keep: tokens generated after
its end-of-sequence token, or beyond what the caller kept of a turn. A continued row's new tokens are appended as a
chunk, left-padded to the chunk's width, and ``generate`` runs from the cache. HF derives each token's position from
the mask (``cumsum - 1``), so every token a row keeps has the position, the neighbors it attends to and the token
it would have if the row were re-encoded left-padded: the same computation, done incrementally. In exact arithmetic
the next-token distributions are equal; in float32 they differ by rounding (the same products summed in another
order), so a seeded sample can differ where its uniform draw falls within rounding of a boundary of the cumulative
distribution. docs/evaluation.md gives the measured count on the tool job.

A call names, for each of its token lists, the row of the previous call it continues. What the list shares with the
start of that row's tokens (its longest common prefix) is reused; the rest of the row is masked and the rest of the
list encoded, at least its last token (whose logits the next token is sampled from). A cache that cannot be
continued column by column (a sliding-window or other non-dynamic layer, a length other than the one expected) is
dropped and the next call re-encodes, as plain ``generate`` would.
"""

from __future__ import annotations

from collections.abc import Sequence

from trl_rlvr.evaluation.generation import SeededSampler, cut_after_eos


def _cache_keyword() -> str:
    """The ``generate`` keyword (and output attribute) of the KV cache: ``cache`` where transformers knows it (5.25
    deprecates ``past_key_values``), ``past_key_values`` before (5.17, vLLM's CPU build)."""
    try:
        from transformers.generation.utils import ALL_CACHE_NAMES
    except ImportError:
        return "past_key_values"
    return "cache" if "cache" in ALL_CACHE_NAMES else "past_key_values"


def _continuable(cache, length: int) -> bool:
    """Whether ``cache`` holds ``length`` columns in plain dynamic layers (every column of every row kept, none
    evicted), the layout a continued row's mask indexes."""
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:
        return False
    layers = getattr(cache, "layers", None)
    return (type(cache) is DynamicCache and bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
            and cache.get_seq_length() == length)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    k = 0
    for x, y in zip(a, b):
        if x != y:
            break
        k += 1
    return k


class CachedTurns:
    """A batch generated turn after turn on one KV cache (module docstring). ``generate`` has
    :func:`trl_rlvr.evaluation.generation.generate_token_rows`'s contract, plus ``rows``: the row of the previous
    call each token list continues (None: a new batch)."""

    def __init__(self, model, pad_token_id: int, *, eos_ids, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, synced_gpus: bool = False):
        self.model, self.pad_token_id, self.eos_ids = model, pad_token_id, eos_ids
        self.sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k)
        self.synced_gpus = synced_gpus
        self.cache = None
        self.sequences = self.mask = None
        self.columns: list[list[int]] = []  # per row: the columns of its tokens, in order
        self.tokens: list[list[int]] = []  # per row: its tokens

    def _new_batch(self, id_lists):
        import torch

        width = max(len(ids) for ids in id_lists)
        device = next(self.model.parameters()).device
        self.sequences = torch.tensor([[self.pad_token_id] * (width - len(ids)) + list(ids) for ids in id_lists],
                                      device=device)
        self.mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in id_lists], device=device)
        self.columns = [list(range(width - len(ids), width)) for ids in id_lists]
        self.tokens = [list(ids) for ids in id_lists]
        self.cache = None

    def _shared_prefix_batch(self, id_lists) -> None:
        """A new batch whose rows' common first tokens (a system prompt, a question sampled several times) are
        encoded once, on one row, and its cache repeated over the rows; each row then continues with the rest of
        its list. Fewer than two rows, nothing in common, or ``synced_gpus`` (ZeRO-3 / FSDP: every process must make
        the same forward passes, and another process's batch may share nothing): :meth:`_new_batch`."""
        import torch

        shared = min(len(ids) for ids in id_lists) - 1  # every row encodes at least its last token
        for ids in id_lists[1:]:
            shared = min(shared, _common_prefix(id_lists[0], ids))
        if len(id_lists) < 2 or shared < 1 or self.synced_gpus:
            self._new_batch(id_lists)
            return
        self._new_batch([id_lists[0][:shared]])
        with torch.no_grad():
            out = self.model(input_ids=self.sequences, attention_mask=self.mask, use_cache=True, logits_to_keep=1)
        cache = getattr(out, _cache_keyword(), None)
        if not _continuable(cache, shared):
            self._new_batch(id_lists)
            return
        cache.batch_repeat_interleave(len(id_lists))
        self.cache = cache
        self.sequences, self.mask = self.sequences.repeat(len(id_lists), 1), self.mask.repeat(len(id_lists), 1)
        self.columns, self.tokens = self.columns * len(id_lists), self.tokens * len(id_lists)
        self._continue_batch(id_lists, list(range(len(id_lists))))

    def _continue_batch(self, id_lists, rows):
        """Keep the rows ``rows`` (in that order), mask what each does not keep, and append each one's new tokens."""
        import torch

        for r, ids in zip(rows, id_lists):
            if not 0 <= r < len(self.tokens) or not ids:
                raise ValueError(f"CachedTurns: no row {r} to continue, or an empty token list for it")
        index = torch.tensor(rows, device=self.sequences.device)
        sequences, mask = self.sequences[index], self.mask[index].clone()
        self.cache.batch_select_indices(index)
        width, chunks, columns, tokens = sequences.shape[1], [], [], []
        for j, (r, ids) in enumerate(zip(rows, id_lists)):
            have, cols = self.tokens[r], self.columns[r]
            keep = min(_common_prefix(ids, have), len(ids) - 1)  # at least one token encoded anew: its logits
            if keep < len(have):
                mask[j, torch.tensor(cols[keep:], device=mask.device)] = 0
            chunks.append(list(ids[keep:]))
            columns.append(cols[:keep])
            tokens.append(list(ids))
        chunk_width = max(len(c) for c in chunks)
        pad = [[self.pad_token_id] * (chunk_width - len(c)) + c for c in chunks]
        chunk_mask = [[0] * (chunk_width - len(c)) + [1] * len(c) for c in chunks]
        self.sequences = torch.cat([sequences, torch.tensor(pad, device=sequences.device)], dim=1)
        self.mask = torch.cat([mask, torch.tensor(chunk_mask, device=mask.device)], dim=1)
        for cols, chunk in zip(columns, chunks):
            cols.extend(range(width + chunk_width - len(chunk), width + chunk_width))
        self.columns, self.tokens = columns, tokens

    def generate(self, id_lists: Sequence[Sequence[int]], seeds: Sequence[str] | None, *, max_new_tokens: int,
                 rows: Sequence[int] | None = None) -> list[tuple[list[int], bool]]:
        """Continue each token list (row ``rows[i]`` of the previous call, or a new batch) and generate: row ``i``
        sampled by :class:`SeededSampler` from ``random.Random(seeds[i])``, or greedy when ``seeds`` is None. Per row
        its new tokens up to and including the first end-of-sequence token, and whether it ended so."""
        import torch
        from transformers import LogitsProcessorList

        if rows is None:
            self._shared_prefix_batch(id_lists)
        elif self.cache is None:
            self._new_batch(id_lists)
        else:
            self._continue_batch(id_lists, list(rows))
        processors = [] if seeds is None else [SeededSampler(seeds, **self.sampling)]
        keyword = _cache_keyword()
        cache = {keyword: self.cache} if self.cache is not None else {}
        width = self.sequences.shape[1]
        with torch.no_grad():
            out = self.model.generate(
                input_ids=self.sequences, attention_mask=self.mask, max_new_tokens=max_new_tokens, do_sample=False,
                temperature=None, top_p=None, top_k=None, logits_processor=LogitsProcessorList(processors),
                pad_token_id=self.pad_token_id, eos_token_id=sorted(self.eos_ids), synced_gpus=self.synced_gpus,
                return_dict_in_generate=True, use_cache=True, **cache,
            )
        results = [cut_after_eos(row, self.eos_ids) for row in out.sequences[:, width:].tolist()]
        new_width = out.sequences.shape[1] - width
        kept = torch.tensor([[1] * len(ids) + [0] * (new_width - len(ids)) for ids, _ in results],
                            device=self.mask.device, dtype=self.mask.dtype)
        self.sequences, self.mask = out.sequences, torch.cat([self.mask, kept], dim=1)
        for cols, tokens, (ids, _) in zip(self.columns, self.tokens, results):
            cols.extend(range(width, width + len(ids)))
            tokens.extend(ids)
        cache = getattr(out, keyword, None)
        # the last sampled token is not fed to the model: the cache holds every column but that one
        self.cache = cache if _continuable(cache, self.sequences.shape[1] - 1) else None
        return results
