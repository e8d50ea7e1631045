"""Held-out evaluation: greedy (:func:`evaluate`) and sampled (:func:`evaluate_sampled`: pass@k, maj@k, mean@n).

Scores completions with the same reward functions the trainer uses (TRL's signature:
``f(prompts=, completions=, completion_ids=, **dataset_columns) -> list[float]``), so "right" means
exactly what it means during training. Works single-process and distributed: the prompts are split
evenly over the processes (every rank runs the same number of ``generate`` calls, which ZeRO-3 and
FSDP need) and the results are gathered on every rank.
"""

from __future__ import annotations

import ctypes
import gc
import math
import time
from contextlib import contextmanager, nullcontext

from .seeded_sampling import cut_at_eos


def _render(prompt, tokenizer) -> str:
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def generate_greedy(model, tokenizer, prompts, max_new_tokens: int = 96, batch_size: int = 32,
                    synced_gpus: bool = False, n_batches: int | None = None):
    """Greedy completions (text, token count, finished-with-eos) for ``prompts`` (strings or messages)."""
    import torch

    texts = [_render(p, tokenizer) for p in prompts]
    n_batches = n_batches if n_batches is not None else math.ceil(len(texts) / batch_size)
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) | {tokenizer.eos_token_id}
    eos_ids.discard(None)
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    out = []
    device = next(model.parameters()).device
    try:
        for i in range(n_batches):
            chunk = texts[i * batch_size:(i + 1) * batch_size] or texts[-1:]  # keep ranks in step
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            with torch.no_grad():
                gen = model.generate(
                    **enc, max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None,
                    top_k=None, pad_token_id=tokenizer.pad_token_id, eos_token_id=sorted(eos_ids),
                    synced_gpus=synced_gpus,
                )
            if i * batch_size >= len(texts):
                continue
            for row in gen[:, enc["input_ids"].shape[1]:].tolist():
                ids, finished = cut_at_eos(row, eos_ids)
                out.append((tokenizer.decode(ids, skip_special_tokens=True), ids, finished))
    finally:
        tokenizer.padding_side = side
    return out


def release_memory() -> None:
    """Give what a phase freed back to the OS: a garbage collection, then glibc's ``malloc_trim(0)`` (freed heap
    pages stay in the process's RSS until then; no-op elsewhere) and, on a GPU, torch's cached blocks."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def score(rows, completions, prompts, success_fn, format_fn=None, success_threshold: float = 1.0,
          format_threshold: float = 1.0) -> dict:
    """Per-answer verdicts and the summary metrics for generated ``completions``."""
    texts = [c[0] for c in completions]
    conversational = not isinstance(prompts[0], str)
    comp = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    kwargs = dict(prompts=prompts, completions=comp, completion_ids=[c[1] for c in completions], **columns)
    success = success_fn(**kwargs)
    fmt = format_fn(**kwargs) if format_fn is not None else [None] * len(texts)
    right = [s is not None and s >= success_threshold for s in success]
    formatted = [f is not None and f >= format_threshold for f in fmt]
    lengths = [len(c[1]) for c in completions]
    len_right = [n for n, r in zip(lengths, right) if r]
    len_wrong = [n for n, r in zip(lengths, right) if not r]
    n = max(len(texts), 1)
    return {
        "n": len(texts),
        "accuracy": sum(right) / n,
        "format_rate": sum(formatted) / n if format_fn is not None else None,
        "mean_length": sum(lengths) / n,
        "length_right": sum(len_right) / len(len_right) if len_right else None,
        "length_wrong": sum(len_wrong) / len(len_wrong) if len_wrong else None,
        "truncated_frac": sum(not c[2] for c in completions) / n,
        "samples": [
            {"question": r.get("question"), "answer": r.get("answer"), "completion": t, "right": rt, "format": ft}
            for r, t, rt, ft in zip(rows[:5], texts[:5], right[:5], formatted[:5])
        ],
    }


def _distributed(accelerator):
    """(world size, rank, generation context factory, synced_gpus) for an Accelerator, a PartialState or None."""
    if accelerator is None:
        return 1, 0, nullcontext, False
    world, rank = accelerator.num_processes, accelerator.process_index
    dist = str(accelerator.distributed_type)
    synced = world > 1 and ("DEEPSPEED" in dist or "FSDP" in dist)
    if hasattr(accelerator, "unwrap_model"):  # an Accelerator: the model may be wrapped (DDP, ZeRO-3, FSDP)
        from trl.models import unwrap_model_for_generation

        return world, rank, lambda m: unwrap_model_for_generation(m, accelerator), synced
    return world, rank, nullcontext, synced


@contextmanager
def _generating(model, unwrap):
    """The model to generate with (unwrapped: DDP, ZeRO-3, FSDP), in eval mode, put back in training mode after."""
    with unwrap(model) as gen_model:
        was_training = gen_model.training
        gen_model.eval()
        try:
            yield gen_model
        finally:
            if was_training:
                gen_model.train()


def evaluate(model, tokenizer, dataset, success_fn, format_fn=None, *, accelerator=None,
             max_new_tokens: int = 96, batch_size: int = 32, success_threshold: float = 1.0,
             format_threshold: float = 1.0) -> dict:
    """Greedy held-out evaluation of ``model`` on ``dataset`` (rows with ``prompt`` and reference columns).

    ``model`` may be a wrapped training model (DDP, DeepSpeed, FSDP) when ``accelerator`` is given: it is
    unwrapped for generation (ZeRO-3 parameters gathered) and every process evaluates a share.
    """
    from accelerate.utils import gather_object

    rows = [dict(r) for r in dataset]
    world, rank, unwrap, synced = _distributed(accelerator)
    mine = list(range(rank, len(rows), world))
    n_batches = math.ceil(math.ceil(len(rows) / world) / batch_size)
    t0 = time.time()
    with _generating(model, unwrap) as gen_model:
        completions = generate_greedy(gen_model, tokenizer, [rows[i]["prompt"] for i in mine], max_new_tokens,
                                      batch_size, synced_gpus=synced, n_batches=n_batches)
    release_memory()  # the generation's KV caches and activations, before training or the next phase
    local = list(zip(mine, completions))
    gathered = gather_object(local) if world > 1 else local
    gathered = sorted(dict(gathered).items())
    completions = [c for _, c in gathered]
    ordered = [rows[i] for i, _ in gathered]
    result = score(ordered, completions, [r["prompt"] for r in ordered], success_fn, format_fn,
                   success_threshold, format_threshold)
    result["seconds"] = round(time.time() - t0, 1)
    return result


# ------------------------------------------------------------------------------------------------ sampled
def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to ``n``, and ``n`` itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def resolve_ks(n: int, ks=None) -> list[int]:
    """The sorted, distinct ``ks`` (default :func:`default_ks`), each checked against ``n`` (:func:`passk.check_k`)."""
    from .passk import check_k

    ks = sorted(set(ks)) if ks else default_ks(n)
    for k in ks:
        check_k(n, k)
    return ks


def score_question(samples, row: dict, prompt, success_fn, format_fn, ks, *, success_threshold: float,
                   format_threshold: float) -> dict:
    """One question's ``n`` samples scored with the rewards: counts, pass@k, maj@k and per-sample details."""
    from .passk import maj_at_k, pass_at_k
    from .voting import answer_classes, supports_voting

    n = len(samples)
    texts = [s[0] for s in samples]
    conversational = not isinstance(prompt, str)
    comp = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    columns = {k: [v] * n for k, v in row.items() if k != "prompt"}
    kwargs = dict(prompts=[prompt] * n, completions=comp, completion_ids=[s[1] for s in samples], **columns)
    success = success_fn(**kwargs)
    right = [s is not None and s >= success_threshold for s in success]
    formatted = None
    if format_fn is not None:
        formatted = [f is not None and f >= format_threshold for f in format_fn(**kwargs)]
    c = sum(right)
    out = {
        "right": c,
        "unscored": sum(s is None for s in success),
        "formatted": sum(formatted) if formatted is not None else None,
        "pass@k": {k: pass_at_k(n, c, k) for k in ks},
        "maj@k": None,
        "lengths": [len(s[1]) for s in samples],
        "right_flags": right,
        "finished": [s[2] for s in samples],
    }
    if supports_voting(success_fn):
        answers, classes = answer_classes(success_fn, [comp])
        answers, classes = answers[0], classes[0]
        cls_right: dict[int, bool] = {}
        for cls, r in zip(classes, right):
            if cls is not None:
                cls_right[cls] = cls_right.get(cls, False) or r  # an answer is right if the reward scored it so
        out["maj@k"] = {k: maj_at_k(classes, cls_right, k) for k in ks}
        out["no_answer"] = sum(a is None for a in answers)
        votes: dict[int, list] = {}
        for a, cls in zip(answers, classes):
            if cls is not None:
                votes.setdefault(cls, [a, 0, cls_right[cls]])[1] += 1
        out["answers"] = sorted(votes.values(), key=lambda v: -v[1])  # [first text, votes, right]
    return out


def evaluate_sampled(model, tokenizer, dataset, success_fn, format_fn=None, *, n: int = 8,
                     ks: list[int] | None = None, accelerator=None, temperature: float = 1.0, top_p: float = 1.0,
                     top_k: int = 0, max_new_tokens: int = 256, batch_size: int = 64, seed: int = 0,
                     success_threshold: float = 1.0, format_threshold: float = 1.0, progress: bool = False,
                     keep_samples: int = 2) -> dict:
    """Sampled evaluation: ``n`` completions per question, scored by the training rewards.

    Returns overall metrics -- ``pass@k`` (Chen et al.'s unbiased estimator, averaged over questions) for each
    ``k`` in ``ks`` (default 1, 2, 4, ... n), ``mean@n`` (mean accuracy of all samples, = pass@1), ``maj@k``
    (majority vote over answers grouped by the reward's own equivalence; ``None`` with ``maj_note`` when the
    reward cannot extract answers), ``format_rate`` (share of samples ``format_fn`` scores >= ``format_threshold``),
    ``length_right`` / ``length_wrong`` (mean tokens of right / wrong samples), ``truncated_frac`` (share that
    hit ``max_new_tokens`` without EOS), ``no_answer_frac`` -- and ``per_question`` (right count, pass@k, maj@k,
    answer votes). Definitions: :mod:`trl_rlvr.passk`, :mod:`trl_rlvr.voting`, docs/evaluation.md.

    ``model``: a model (possibly wrapped by ``accelerator``, an ``Accelerator`` or a ``PartialState``). With
    several processes each evaluates every ``world``-th question (the same number of ``generate`` calls on every
    rank) and the results are gathered on every rank. A sample's tokens depend only on ``(seed, question index,
    sample index)``, so the numbers do not depend on the number of processes or the batch size.
    """
    from accelerate.utils import gather_object

    from .seeded_sampling import sample_completions
    from .voting import supports_voting

    rows = [dict(r) for r in dataset]
    if not rows:
        raise ValueError("evaluate_sampled: the dataset is empty")
    ks = resolve_ks(n, ks)
    world, rank, unwrap, synced = _distributed(accelerator)
    mine = list(range(rank, len(rows), world))
    per_call = max(1, batch_size // n)
    n_batches = math.ceil(math.ceil(len(rows) / world) / per_call)
    bar = None
    if progress and rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(rows), desc=f"sampling n={n}", unit="question")
    t0 = time.time()
    with _generating(model, unwrap) as gen_model:
        samples = sample_completions(
            gen_model, tokenizer, [rows[i]["prompt"] for i in mine], mine, n, temperature=temperature,
            top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size,
            n_batches=n_batches, synced_gpus=synced, on_batch=(lambda d: bar.update(d * world)) if bar else None,
        )
    if bar is not None:
        bar.close()
    release_memory()
    local = []
    for i, group in zip(mine, samples):
        rec = score_question(group, rows[i], rows[i]["prompt"], success_fn, format_fn, ks,
                             success_threshold=success_threshold, format_threshold=format_threshold)
        rec = {"index": i, "question": rows[i].get("question"), "answer": rows[i].get("answer"), **rec}
        if i < keep_samples:
            rec["samples"] = [s[0] for s in group]
        local.append(rec)
    per_question = sorted(gather_object(local) if world > 1 else local, key=lambda r: r["index"])
    result = summarize_sampled(per_question, n, ks, temperature=temperature, top_p=top_p, top_k=top_k,
                               max_new_tokens=max_new_tokens, seed=seed)
    if not supports_voting(success_fn):
        name = getattr(success_fn, "__name__", type(success_fn).__name__)
        result["maj_note"] = f"maj@k not defined: reward {name!r} has no extract_answer (trl_rlvr.voting)"
    result["seconds"] = round(time.time() - t0, 1)
    return result


def _mean(values):
    values = list(values)
    return sum(values) / len(values) if values else None


def summarize_sampled(per_question: list[dict], n: int, ks: list[int], **settings) -> dict:
    """Overall metrics from :func:`score_question` records (means over questions, or over all samples)."""
    lengths = [x for q in per_question for x in q["lengths"]]
    right = [x for q in per_question for x in q["right_flags"]]
    has_maj = all(q["maj@k"] is not None for q in per_question)
    has_format = all(q["formatted"] is not None for q in per_question)
    total = len(lengths)
    return {
        "questions": len(per_question),
        "n": n,
        "ks": ks,
        **settings,
        "mean@n": _mean(q["right"] / n for q in per_question),
        "pass@k": {k: _mean(q["pass@k"][k] for q in per_question) for k in ks},
        "maj@k": {k: _mean(q["maj@k"][k] for q in per_question) for k in ks} if has_maj else None,
        "format_rate": sum(q["formatted"] for q in per_question) / total if has_format else None,
        "no_answer_frac": sum(q["no_answer"] for q in per_question) / total if has_maj else None,
        "unscored_frac": sum(q["unscored"] for q in per_question) / total,
        "mean_length": _mean(lengths),
        "length_right": _mean(x for x, r in zip(lengths, right) if r),
        "length_wrong": _mean(x for x, r in zip(lengths, right) if not r),
        "truncated_frac": sum(not f for q in per_question for f in q["finished"]) / total,
        "per_question": per_question,
    }
