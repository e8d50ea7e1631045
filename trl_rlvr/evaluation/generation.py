"""The one generation loop of the evaluation: ``n`` completions per question with HF ``generate``, greedy (``n=1``)
or sampled, reproducible whatever the batching.

Each sampled row draws its tokens from its own random stream, seeded by ``(seed, question id, sample index)``
(:class:`SeededSampler`): the samples of a question do not depend on which other questions share its batch, on
the batch size, or on how the questions are split over processes. (torch's global generator, which
``do_sample=True`` uses, would make them depend on all three.) Temperature, top-k and top-p are applied as HF
applies them; the token is then drawn by inverse-CDF sampling with the row's uniform draw, and handed to
``generate`` as the only finite logit (greedy decoding then picks it).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def cut_at_eos(token_ids: Sequence[int], eos_ids) -> tuple[list[int], bool]:
    """A generated row's tokens up to its first end-of-sequence token, and whether there was one (not truncated)."""
    for position, token in enumerate(token_ids):
        if token in eos_ids:
            return list(token_ids[:position]), True
    return list(token_ids), False


def end_of_sequence_ids(generation_config, tokenizer) -> set[int]:
    """The tokens that end an answer: the generation config's ``eos_token_id`` (one or a list) and the tokenizer's."""
    eos = getattr(generation_config, "eos_token_id", None)
    ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) | {tokenizer.eos_token_id}
    ids.discard(None)
    return ids


def row_seed(seed: int, question_id: int, sample: int) -> str:
    """The seed of one sample's random stream (a string: ``random.Random`` hashes it with SHA-512)."""
    return f"{seed}:{question_id}:{sample}"


def check_sampling(temperature: float, top_p: float, top_k: int) -> None:
    if not (isinstance(temperature, (int, float)) and temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature!r} (greedy: evaluation.evaluate)")
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not (isinstance(top_k, int) and top_k >= 0):
        raise ValueError(f"top_k must be an integer >= 0 (0: off), got {top_k!r}")


def check_request(where: str, prompts, question_ids, n: int, greedy: bool, temperature, top_p, top_k) -> None:
    """The arguments every generation loop checks: one question id per prompt, greedy only with ``n=1``, and
    valid sampling settings (:func:`check_sampling`) when sampling."""
    if len(prompts) != len(question_ids):
        raise ValueError(f"{where}: prompts and question_ids differ in length")
    if greedy and n != 1:
        raise ValueError(f"{where}: greedy decoding gives one completion per question, not n={n}")
    if not greedy:
        check_sampling(temperature, top_p, top_k)


@dataclass(frozen=True)
class SamplingSettings:
    """How the evaluation samples: one object for its three generation back-ends, HF ``generate``
    (:func:`generate_completions`), tool rollouts (:func:`trl_rlvr.evaluation.tool_rollouts.generate_tool_completions`)
    and vLLM (:func:`trl_rlvr.evaluation.vllm_generation.generate_completions_vllm`). Each back-end takes it as
    ``sampling=``, or its fields as keywords (:meth:`resolve`).

    ``greedy``: one completion per question, no sampling; else each sample draws from its own stream, named by
    ``(seed, question id, sample index)`` (:meth:`stream`), after ``temperature``, top-k (``top_k``, 0: off) and
    top-p (``top_p``), as HF applies them. ``max_new_tokens``: the completion's budget in tokens."""

    greedy: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    seed: int = 0

    @classmethod
    def resolve(cls, sampling: SamplingSettings | None = None, **keywords) -> SamplingSettings:
        """``sampling``, or the settings its field keywords give (an unknown keyword is a ``TypeError``); not both."""
        if sampling is None:
            return cls(**keywords)
        if keywords:
            raise TypeError(f"pass sampling= or its keywords {sorted(keywords)}, not both")
        return sampling

    def check(self, where: str, prompts, question_ids, n: int) -> None:
        """:func:`check_request` for these settings."""
        check_request(where, prompts, question_ids, n, self.greedy, self.temperature, self.top_p, self.top_k)

    def stream(self, question_id: int, sample: int) -> str | None:
        """One sample's random stream (:func:`row_seed`); None when greedy."""
        return None if self.greedy else row_seed(self.seed, question_id, sample)

    def sampler(self) -> dict:
        """The draw's settings (:class:`SeededSampler`'s keywords)."""
        return dict(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)


class SeededSampler:
    """A ``LogitsProcessor`` that samples row ``i``'s next token from ``random.Random(seeds[i])``."""

    def __init__(self, seeds: Sequence[str], temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0):
        check_sampling(temperature, top_p, top_k)
        self.rngs = [random.Random(s) for s in seeds]
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)

    def probabilities(self, scores):
        """The sampling distribution (float64) after temperature, top-k and top-p (nucleus; the top token is
        always kept)."""
        import torch

        logits = scores.double() / self.temperature
        if 0 < self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -math.inf)
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = torch.sort(probs, dim=-1, descending=True)
            before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the more likely tokens
            sorted_p = sorted_p.masked_fill(before >= self.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        return probs

    def __call__(self, input_ids, scores):
        import torch

        if scores.shape[0] != len(self.rngs):
            raise RuntimeError(f"SeededSampler: {scores.shape[0]} rows, {len(self.rngs)} seeds")
        cdf = torch.cumsum(self.probabilities(scores), dim=-1)
        u = torch.tensor([r.random() for r in self.rngs], dtype=cdf.dtype, device=cdf.device).unsqueeze(1)
        # the first token whose cumulative mass exceeds u * total: never one of probability 0
        token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp(max=cdf.shape[-1] - 1)
        out = torch.full_like(scores, -math.inf)
        return out.scatter(1, token, 0.0)


def cut_after_eos(token_ids: Sequence[int], eos_ids) -> tuple[list[int], bool]:
    """A generated row's tokens up to and including its first end-of-sequence token (as TRL keeps a completion's
    ids), and whether there was one."""
    for position, token in enumerate(token_ids):
        if token in eos_ids:
            return list(token_ids[: position + 1]), True
    return list(token_ids), False


def generate_token_rows(model, pad_token_id: int, id_lists: Sequence[Sequence[int]], seeds: Sequence[str] | None, *,
                        max_new_tokens: int, eos_ids, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                        synced_gpus: bool = False) -> list[tuple[list[int], bool]]:
    """One ``generate`` call that continues each token-id list (left-padded into one batch, as the tokenizer pads):
    row ``i`` sampled by :class:`SeededSampler` from ``random.Random(seeds[i])``, or greedy when ``seeds`` is None.
    Returns per row its new tokens up to and including the first end-of-sequence token, and whether it ended so."""
    import torch
    from transformers import LogitsProcessorList

    width = max(len(ids) for ids in id_lists)
    device = next(model.parameters()).device
    input_ids = torch.tensor([[pad_token_id] * (width - len(ids)) + list(ids) for ids in id_lists], device=device)
    attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in id_lists], device=device)
    processors = [] if seeds is None else [SeededSampler(seeds, temperature, top_p, top_k)]
    with torch.no_grad():
        gen = model.generate(
            input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens, do_sample=False,
            temperature=None, top_p=None, top_k=None, logits_processor=LogitsProcessorList(processors),
            pad_token_id=pad_token_id, eos_token_id=sorted(eos_ids), synced_gpus=synced_gpus,
        )
    return [cut_after_eos(row, eos_ids) for row in gen[:, width:].tolist()]


def render_prompt(prompt, tokenizer) -> str:
    """A prompt as text: a string as is, a list of messages through the tokenizer's chat template."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def generate_completions(
    model,
    tokenizer,
    prompts: Sequence,
    question_ids: Sequence[int],
    n: int = 1,
    *,
    sampling: SamplingSettings | None = None,
    batch_size: int = 64,
    n_batches: int | None = None,
    synced_gpus: bool = False,
    on_batch: Callable[[int], None] | None = None,
    **sampling_keywords,
) -> list[list[tuple[str, list[int], bool]]]:
    """``n`` completions ``(text, token ids, finished with EOS)`` for each prompt: greedy (``greedy=True``, ``n=1``)
    or sampled by :class:`SeededSampler` (temperature, top-p, top-k, each sample's stream from ``seed``, its
    question id and its index): ``sampling``, a :class:`SamplingSettings`, or its fields as keywords.

    A ``generate`` call takes ``max(1, batch_size // n)`` questions (all ``n`` samples of each). ``n_batches``
    forces that many calls (extra ones repeat the last question and are discarded), so that every process of
    a distributed run makes the same number of calls (ZeRO-3 / FSDP need it). ``on_batch(questions_done)`` is
    called after each call (a progress bar).
    """
    settings = SamplingSettings.resolve(sampling, **sampling_keywords)
    settings.check("generate_completions", prompts, question_ids, n)
    per_call = max(1, batch_size // n)
    texts = [render_prompt(p, tokenizer) for p in prompts]
    n_batches = n_batches if n_batches is not None else math.ceil(len(texts) / per_call)
    eos_ids = end_of_sequence_ids(model.generation_config, tokenizer)
    device = next(model.parameters()).device
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    out: list[list[tuple[str, list[int], bool]]] = []
    try:
        for b in range(n_batches):
            lo = b * per_call
            idx = list(range(lo, min(lo + per_call, len(texts)))) or [len(texts) - 1]  # keep ranks in step
            rows = _generate_rows(model, tokenizer, [texts[i] for i in idx for _ in range(n)],
                                  [settings.stream(question_ids[i], j) for i in idx for j in range(n)], settings,
                                  eos_ids=eos_ids, device=device, synced_gpus=synced_gpus)
            if lo >= len(texts):
                continue
            for q in range(len(idx)):
                group = []
                for row in rows[q * n:(q + 1) * n]:
                    ids, finished = cut_at_eos(row, eos_ids)
                    group.append((tokenizer.decode(ids, skip_special_tokens=True), ids, finished))
                out.append(group)
            if on_batch is not None:
                on_batch(len(idx))
    finally:
        tokenizer.padding_side = side
    return out


def _generate_rows(model, tokenizer, texts: list[str], seeds: list, settings: SamplingSettings, *, eos_ids: set[int],
                   device, synced_gpus: bool) -> list[list[int]]:
    """One HF ``generate`` call on ``texts`` (left-padded): the new token ids of each row, sampled by
    :class:`SeededSampler` from its ``seeds`` stream (greedy: no processor, ``seeds`` unused)."""
    import torch
    from transformers import LogitsProcessorList

    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    processors = [] if settings.greedy else [SeededSampler(seeds, **settings.sampler())]
    with torch.no_grad():
        gen = model.generate(
            **enc, max_new_tokens=settings.max_new_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
            logits_processor=LogitsProcessorList(processors), pad_token_id=tokenizer.pad_token_id,
            eos_token_id=sorted(eos_ids), synced_gpus=synced_gpus,
        )
    return gen[:, enc["input_ids"].shape[1]:].tolist()
