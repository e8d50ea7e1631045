"""Held-out evaluation: greedy (:func:`evaluate`) and sampled (:func:`evaluate_sampled`: pass@k, maj@k, mean@n).

Both run the same pieces: one generation loop (:func:`trl_rlvr.evaluation.generation.generate_completions`; greedy is
one completion per question), one scorer (:func:`score_questions`: the rewards called once over all samples of a
process, then each question's counts, pass@k and maj@k) and one summary (:func:`summarize_sampled`).

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

from trl_rlvr._compat.notices import silence_trl_generation_notice
from trl_rlvr.evaluation.generation import SamplingSettings, generate_completions


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
    silence_trl_generation_notice()
    with unwrap(model) as gen_model:
        was_training = gen_model.training
        gen_model.eval()
        try:
            yield gen_model
        finally:
            if was_training:
                gen_model.train()


def _generate(model, tokenizer, prompts, question_ids, n, *, llm, unwrap, batch_size, n_batches, synced, on_batch,
              sampling, tool_rollouts=None):
    """One process's completions: with HF ``generate`` on ``model`` (unwrapped, in eval mode), or with the vLLM
    engine ``llm`` when one is given (:mod:`trl_rlvr.evaluation.vllm_generation`), each with the same ``sampling``
    (:class:`~trl_rlvr.evaluation.generation.SamplingSettings`). ``tool_rollouts``: the keyword
    arguments of :func:`trl_rlvr.evaluation.tool_rollouts.generate_tool_completions` (multi-turn tool rollouts, on
    either generator)."""
    if llm is not None:
        if tool_rollouts is not None:
            from trl_rlvr.evaluation.tool_rollouts import generate_tool_completions

            return generate_tool_completions(model, tokenizer, prompts, question_ids, n, batch_size=batch_size,
                                             n_batches=n_batches, on_batch=on_batch, llm=llm, **tool_rollouts,
                                             sampling=sampling)
        from trl_rlvr.evaluation.generation import end_of_sequence_ids
        from trl_rlvr.evaluation.vllm_generation import engine_end_of_sequence_ids, generate_completions_vllm

        eos_ids = end_of_sequence_ids(getattr(model, "generation_config", None), tokenizer)
        eos_ids |= engine_end_of_sequence_ids(llm)
        return generate_completions_vllm(llm, tokenizer, prompts, question_ids, n, eos_ids=eos_ids,
                                         on_batch=on_batch, sampling=sampling)
    with _generating(model, unwrap) as gen_model:
        if tool_rollouts is not None:
            from trl_rlvr.evaluation.tool_rollouts import generate_tool_completions

            return generate_tool_completions(gen_model, tokenizer, prompts, question_ids, n, batch_size=batch_size,
                                             n_batches=n_batches, synced_gpus=synced, on_batch=on_batch,
                                             **tool_rollouts, sampling=sampling)
        return generate_completions(gen_model, tokenizer, prompts, question_ids, n, batch_size=batch_size,
                                    n_batches=n_batches, synced_gpus=synced, on_batch=on_batch, sampling=sampling)


def _tool_rollout_options(tokenizer, environment_factory, chat_template, max_tool_calling_iterations, world, synced,
                          llm):
    """The tool-rollout arguments of :func:`_generate` (None without an environment), the tokenizer readied as TRL's
    trainer readies it (:func:`trl_rlvr.evaluation.tool_rollouts.tool_chat_template`)."""
    if environment_factory is None:
        return None
    if isinstance(environment_factory, dict) or not callable(environment_factory):
        raise ValueError("environment_factory must be one callable that returns an environment (a dict of "
                         "environments is not supported by the evaluation)")
    from trl_rlvr.evaluation.tool_rollouts import tool_chat_template

    options = dict(environment_factory=environment_factory, chat_template=tool_chat_template(tokenizer, chat_template),
                   max_tool_calling_iterations=max_tool_calling_iterations)
    if world > 1 and synced and llm is None:
        from accelerate.utils import gather_object

        options["keep_going"] = lambda mine: any(gather_object([mine]))  # every rank makes the same generate calls
    return options


def _generate_and_score(model, tokenizer, rows, success_fn, format_fn, ks, *, accelerator, batch_size, n,
                        success_threshold, format_threshold, keep_samples, progress, sampling, llm=None,
                        environment_factory=None, chat_template=None, max_tool_calling_iterations=None,
                        keep_completions=False):
    """Every process generates for its share of ``rows`` (every ``world``-th question, the same number of ``generate``
    calls on every rank) and scores it; the per-question records, gathered on every rank, in question order.
    With an ``environment_factory`` the samples are multi-turn tool rollouts (:mod:`.tool_rollouts`).
    ``keep_completions``: every record keeps its samples as the rewards scored them (``completions``)."""
    from accelerate.utils import gather_object

    world, rank, unwrap, synced = _distributed(accelerator)
    tool_rollouts = _tool_rollout_options(tokenizer, environment_factory, chat_template, max_tool_calling_iterations,
                                          world, synced, llm)
    if tool_rollouts is not None:
        tool_rollouts["rows"] = [rows[i] for i in range(rank, len(rows), world)]
    mine = list(range(rank, len(rows), world))
    n_batches = math.ceil(math.ceil(len(rows) / world) / max(1, batch_size // n))
    bar = None
    if progress and rank == 0:
        from trl_rlvr.evaluation.progress import progress_bar

        bar = progress_bar(len(rows), f"sampling n={n}", unit="question")  # plain lines when not on a terminal
    groups = _generate(model, tokenizer, [rows[i]["prompt"] for i in mine], mine, n, llm=llm, unwrap=unwrap,
                       batch_size=batch_size, n_batches=n_batches, synced=synced,
                       on_batch=(lambda d: bar.update(d * world)) if bar else None, tool_rollouts=tool_rollouts,
                       sampling=sampling)
    if bar is not None:
        bar.close()
    release_memory()  # the generation's KV caches and activations, before scoring, training or the next phase
    records = score_questions([rows[i] for i in mine], groups, success_fn, format_fn, ks,
                              success_threshold=success_threshold, format_threshold=format_threshold)
    local = []
    for i, group, rec in zip(mine, groups, records):
        rec = {"index": i, "question": rows[i].get("question"), "answer": rows[i].get("answer"), **rec}
        if i < keep_samples:
            rec["samples"] = [s[0] for s in group]
        if keep_completions:
            rec["completions"] = _as_completions(group, rows[i]["prompt"])
        local.append(rec)
    return sorted(gather_object(local) if world > 1 else local, key=lambda r: r["index"])


def evaluate(model, tokenizer, dataset, success_fn, format_fn=None, *, accelerator=None,
             max_new_tokens: int = 96, batch_size: int = 32, success_threshold: float = 1.0,
             format_threshold: float = 1.0, llm=None, environment_factory=None, chat_template: str | None = None,
             max_tool_calling_iterations: int | None = None) -> dict:
    """Greedy held-out evaluation of ``model`` on ``dataset`` (rows with ``prompt`` and reference columns).

    ``model`` may be a wrapped training model (DDP, DeepSpeed, FSDP) when ``accelerator`` is given: it is
    unwrapped for generation (ZeRO-3 parameters gathered) and every process evaluates a share. Returns
    ``accuracy`` (share of answers ``success_fn`` scores >= ``success_threshold``), ``format_rate``,
    ``mean_length`` / ``length_right`` / ``length_wrong`` (tokens), ``truncated_frac`` and five ``samples``.
    ``llm``: a ``vllm.LLM`` to generate with instead of ``model``'s HF ``generate`` (as in :func:`evaluate_sampled`).
    ``environment_factory``, ``chat_template``, ``max_tool_calling_iterations``: tool rollouts, as in
    :func:`evaluate_sampled` (then ``tools`` holds the tool metrics).
    """
    rows = [dict(r) for r in dataset]
    t0 = time.time()
    per_question = _generate_and_score(
        model, tokenizer, rows, success_fn, format_fn, [1], accelerator=accelerator, batch_size=batch_size, n=1,
        success_threshold=success_threshold, format_threshold=format_threshold, keep_samples=5, progress=False,
        llm=llm, sampling=SamplingSettings(greedy=True, max_new_tokens=max_new_tokens),
        environment_factory=environment_factory,
        chat_template=chat_template, max_tool_calling_iterations=max_tool_calling_iterations,
    )
    summary = summarize_sampled(per_question, 1, [1], max_new_tokens=max_new_tokens)
    return {
        "n": len(per_question),
        "accuracy": summary["mean@n"] or 0.0,
        "format_rate": summary["format_rate"],
        "mean_length": summary["mean_length"],
        "length_right": summary["length_right"],
        "length_wrong": summary["length_wrong"],
        "truncated_frac": summary["truncated_frac"],
        "tools": summary["tools"],
        "samples": [
            {"question": q["question"], "answer": q["answer"], "completion": q["samples"][0], "right": q["right"] == 1,
             "format": bool(q["formatted"])}
            for q in per_question[:5]
        ],
        "seconds": round(time.time() - t0, 1),
    }


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
    from trl_rlvr.evaluation.passk import check_k

    ks = sorted(set(ks)) if ks else default_ks(n)
    for k in ks:
        check_k(n, k)
    return ks


def _as_completions(samples, prompt):
    """Completions as the reward receives them: a tool rollout's messages (assistant turns and tool replies, as
    TRL passes them), messages for a conversational prompt, else text."""
    if isinstance(prompt, str):
        return [s[0] for s in samples]
    return [s[3]["messages"] if len(s) > 3 else [{"role": "assistant", "content": s[0]}] for s in samples]


def _model_tokens(sample) -> int:
    """A completion's length in tokens the model wrote (a tool rollout's replies excluded, as TRL counts it)."""
    return sample[3]["model_tokens"] if len(sample) > 3 else len(sample[1])


def score_questions(rows: list[dict], groups, success_fn, format_fn, ks, *, success_threshold: float,
                    format_threshold: float) -> list[dict]:
    """The one scorer: each question's samples scored with the rewards (one call of each reward over all the
    samples), then per question its right count, pass@k, maj@k (grouped by the reward's own equivalence) and
    per-sample flags. ``groups[q]``: question ``q``'s samples ``(text, token ids, finished)``."""
    from trl_rlvr.evaluation.passk import maj_at_k, pass_at_k
    from trl_rlvr.rewards.voting import answer_classes, supports_voting

    if not rows:
        return []
    completions = [_as_completions(g, row["prompt"]) for row, g in zip(rows, groups)]
    columns = {k: [row.get(k) for row, g in zip(rows, groups) for _ in g] for k in rows[0] if k != "prompt"}
    kwargs = dict(
        prompts=[row["prompt"] for row, g in zip(rows, groups) for _ in g],
        completions=[c for comp in completions for c in comp],
        completion_ids=[s[1] for g in groups for s in g],
        **columns,
    )
    success = list(success_fn(**kwargs))
    formats = list(format_fn(**kwargs)) if format_fn is not None else None
    voting = supports_voting(success_fn)
    answers, classes = answer_classes(success_fn, completions) if voting else (None, None)
    out, start = [], 0
    for q, group in enumerate(groups):
        n = len(group)
        scores = success[start:start + n]
        right = [s is not None and s >= success_threshold for s in scores]
        formatted = None if formats is None else [f is not None and f >= format_threshold for f in formats[start:start + n]]
        start += n
        c = sum(right)
        rec = {
            "right": c,
            "unscored": sum(s is None for s in scores),
            "formatted": sum(formatted) if formatted is not None else None,
            "pass@k": {k: pass_at_k(n, c, k) for k in ks},
            "maj@k": None,
            "lengths": [_model_tokens(s) for s in group],
            "right_flags": right,
            "finished": [s[2] for s in group],
        }
        if group and len(group[0]) > 3:  # tool rollouts: each sample's metrics (tool_rollouts.TOOL_COUNTS)
            from trl_rlvr.evaluation.tool_rollouts import TOOL_COUNTS

            rec["tool"] = {key: [s[3][key] for s in group] for key in TOOL_COUNTS}
        if voting:
            cls_right: dict[int, bool] = {}
            for cls, r in zip(classes[q], right):
                if cls is not None:
                    cls_right[cls] = cls_right.get(cls, False) or r  # an answer is right if the reward scored it so
            rec["maj@k"] = {k: maj_at_k(classes[q], cls_right, k) for k in ks}
            rec["no_answer"] = sum(a is None for a in answers[q])
            votes: dict[int, list] = {}
            for a, cls in zip(answers[q], classes[q]):
                if cls is not None:
                    votes.setdefault(cls, [a, 0, cls_right[cls]])[1] += 1
            rec["answers"] = sorted(votes.values(), key=lambda v: -v[1])  # [first text, votes, right]
        out.append(rec)
    return out


def score_question(samples, row: dict, prompt, success_fn, format_fn, ks, *, success_threshold: float,
                   format_threshold: float) -> dict:
    """:func:`score_questions` for one question's ``samples`` (``row``'s columns, ``prompt``)."""
    return score_questions([{**row, "prompt": prompt}], [samples], success_fn, format_fn, ks,
                           success_threshold=success_threshold, format_threshold=format_threshold)[0]


def evaluate_sampled(model, tokenizer, dataset, success_fn, format_fn=None, *, n: int = 8,
                     ks: list[int] | None = None, accelerator=None, temperature: float = 1.0, top_p: float = 1.0,
                     top_k: int = 0, max_new_tokens: int = 256, batch_size: int = 64, seed: int = 0,
                     success_threshold: float = 1.0, format_threshold: float = 1.0, progress: bool = False,
                     keep_samples: int = 2, llm=None, environment_factory=None, chat_template: str | None = None,
                     max_tool_calling_iterations: int | None = None, keep_completions: bool = False) -> dict:
    """Sampled evaluation: ``n`` completions per question, scored by the training rewards.

    Returns overall metrics -- ``pass@k`` (Chen et al.'s unbiased estimator, averaged over questions) for each
    ``k`` in ``ks`` (default 1, 2, 4, ... n), ``mean@n`` (mean accuracy of all samples, = pass@1), ``maj@k``
    (majority vote over answers grouped by the reward's own equivalence; ``None`` with ``maj_note`` when the
    reward cannot extract answers), ``format_rate`` (share of samples ``format_fn`` scores >= ``format_threshold``),
    ``length_right`` / ``length_wrong`` (mean tokens of right / wrong samples), ``truncated_frac`` (share that
    hit ``max_new_tokens`` without EOS), ``no_answer_frac`` -- and ``per_question`` (right count, pass@k, maj@k,
    answer votes). Definitions: :mod:`trl_rlvr.evaluation.passk`, :mod:`trl_rlvr.rewards.voting`, docs/evaluation.md.

    ``model``: a model (possibly wrapped by ``accelerator``, an ``Accelerator`` or a ``PartialState``). With
    several processes each evaluates every ``world``-th question (the same number of ``generate`` calls on every
    rank) and the results are gathered on every rank. A sample's tokens depend only on ``(seed, question index,
    sample index)``, so the numbers do not depend on the number of processes or the batch size.

    ``llm``: a ``vllm.LLM`` (e.g. the trainer's colocated engine, :class:`SampledEvalCallback` with
    ``generator="vllm"``) to generate with instead of HF ``generate``; ``model`` then only lends its generation
    config's end-of-sequence tokens (or is None). Each sample is a request seeded from the same triple, so its random
    stream is fixed whatever the batching; what vLLM does and does not guarantee beyond that:
    :mod:`trl_rlvr.evaluation.vllm_generation`.

    ``environment_factory``: a callable returning an environment (TRL's ``environment_factory``, e.g.
    ``reward_plugins.code_sandbox.PythonEnvironment``): each sample is then a multi-turn tool rollout, run as TRL's
    trainer runs it (:mod:`trl_rlvr.evaluation.tool_rollouts`; with HF ``generate``, or with ``llm``, every turn a
    request of its own), scored on its messages as the reward sees them in training, each turn seeded from the
    sample's triple and the turn's number. ``prompt`` must be a conversation;
    the environment's ``reset`` gets the row. ``chat_template``: template text to render with (the tokenizer's own
    must render tools otherwise); ``max_tool_calling_iterations``: TRL's cap on tool turns (None: the budget
    alone). ``max_new_tokens`` is then the whole completion's budget, tool replies included (TRL's
    ``max_completion_length``). The result's ``tools`` holds the tool metrics
    (:func:`trl_rlvr.evaluation.tool_rollouts.summarize_tool_rollouts`): tool-call rate, calls per answer, parse
    rate and failures, errors, timeouts, the share of the budget the replies took.

    ``keep_completions``: each ``per_question`` record also holds ``completions``, every sample as the rewards
    scored it (text, or messages: a tool rollout's assistant turns and tool replies), for rejection sampling
    (:mod:`trl_rlvr.supervised.rejection_sampling`).
    """
    rows = [dict(r) for r in dataset]
    if not rows:
        raise ValueError("evaluate_sampled: the dataset is empty")
    ks = resolve_ks(n, ks)
    t0 = time.time()
    per_question = _generate_and_score(
        model, tokenizer, rows, success_fn, format_fn, ks, accelerator=accelerator, batch_size=batch_size, n=n,
        success_threshold=success_threshold, format_threshold=format_threshold, keep_samples=keep_samples,
        progress=progress, llm=llm, environment_factory=environment_factory,
        sampling=SamplingSettings(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                                  seed=seed),
        chat_template=chat_template, max_tool_calling_iterations=max_tool_calling_iterations,
        keep_completions=keep_completions,
    )
    result = summarize_sampled(per_question, n, ks, temperature=temperature, top_p=top_p, top_k=top_k,
                               max_new_tokens=max_new_tokens, seed=seed)
    result.update(_voting_note(success_fn))
    result["seconds"] = round(time.time() - t0, 1)
    return result


def _voting_note(success_fn) -> dict:
    """``{"maj_note": why}`` when ``success_fn`` cannot extract answers (maj@k then undefined), else ``{}``."""
    from trl_rlvr.rewards.voting import supports_voting

    if supports_voting(success_fn):
        return {}
    name = getattr(success_fn, "__name__", type(success_fn).__name__)
    return {"maj_note": f"maj@k not defined: reward {name!r} has no extract_answer (trl_rlvr.rewards.voting)"}


def summarize_sampled(per_question: list[dict], n: int, ks: list[int], **settings) -> dict:
    """Overall metrics from :func:`score_question` records, one per entry of
    :data:`trl_rlvr.evaluation.metric_table.EVAL_METRICS` (means over questions, or over all samples); ``tools``: the tool
    metrics of tool rollouts (:func:`trl_rlvr.evaluation.tool_rollouts.summarize_tool_rollouts`), else None."""
    from trl_rlvr.evaluation.metric_table import EVAL_METRICS
    from trl_rlvr.evaluation.tool_rollouts import summarize_tool_rollouts

    return {
        "questions": len(per_question),
        "n": n,
        "ks": ks,
        **settings,
        **{metric.name: metric.summarize(per_question, ks) for metric in EVAL_METRICS},
        "tools": summarize_tool_rollouts(per_question, settings.get("max_new_tokens")),
        "per_question": per_question,
    }
