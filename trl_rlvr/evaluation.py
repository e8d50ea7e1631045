"""Held-out evaluation with greedy decoding: accuracy, format rate, answer lengths.

Scores completions with the same reward functions the trainer uses (TRL's signature:
``f(prompts=, completions=, completion_ids=, **dataset_columns) -> list[float]``), so "right" means
exactly what it means during training. Works single-process and distributed: the prompts are split
evenly over the processes (every rank runs the same number of ``generate`` calls, which ZeRO-3 and
FSDP need) and the results are gathered on every rank.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext


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
                ids = []
                finished = False
                for t in row:
                    if t in eos_ids:
                        finished = True
                        break
                    ids.append(t)
                out.append((tokenizer.decode(ids, skip_special_tokens=True), ids, finished))
    finally:
        tokenizer.padding_side = side
    return out


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


def evaluate(model, tokenizer, dataset, success_fn, format_fn=None, *, accelerator=None,
             max_new_tokens: int = 96, batch_size: int = 32, success_threshold: float = 1.0,
             format_threshold: float = 1.0) -> dict:
    """Greedy held-out evaluation of ``model`` on ``dataset`` (rows with ``prompt`` and reference columns).

    ``model`` may be a wrapped training model (DDP, DeepSpeed, FSDP) when ``accelerator`` is given: it is
    unwrapped for generation (ZeRO-3 parameters gathered) and every process evaluates a share.
    """
    from accelerate.utils import gather_object

    rows = [dict(r) for r in dataset]
    world, rank = 1, 0
    ctx = nullcontext(model)
    synced = False
    if accelerator is not None:
        from trl.models import unwrap_model_for_generation

        world, rank = accelerator.num_processes, accelerator.process_index
        ctx = unwrap_model_for_generation(model, accelerator)
        dist = str(accelerator.distributed_type)
        synced = world > 1 and ("DEEPSPEED" in dist or "FSDP" in dist)
    mine = list(range(rank, len(rows), world))
    n_batches = math.ceil(math.ceil(len(rows) / world) / batch_size)
    t0 = time.time()
    with ctx as gen_model:
        was_training = gen_model.training
        gen_model.eval()
        try:
            completions = generate_greedy(gen_model, tokenizer, [rows[i]["prompt"] for i in mine], max_new_tokens,
                                          batch_size, synced_gpus=synced, n_batches=n_batches)
        finally:
            if was_training:
                gen_model.train()
    local = list(zip(mine, completions))
    gathered = gather_object(local) if world > 1 else local
    gathered = sorted(dict(gathered).items())
    completions = [c for _, c in gathered]
    ordered = [rows[i] for i, _ in gathered]
    result = score(ordered, completions, [r["prompt"] for r in ordered], success_fn, format_fn,
                   success_threshold, format_threshold)
    result["seconds"] = round(time.time() - t0, 1)
    return result
