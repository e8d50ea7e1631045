"""Rejection-sampling fine-tuning (RFT): sample ``n`` answers per prompt, keep those the verifier accepts, fine-tune on
them; with ``iterations > 1``, expert iteration.

The method: STaR (Zelikman et al. 2022, "STaR: Bootstrapping Reasoning With Reasoning", without rationalization),
RFT (Yuan et al. 2023, "Scaling Relationship on Learning Mathematical Reasoning with Large Language Models": distinct
accepted paths per question), expert iteration / ReST-EM (Anthony et al. 2017; Singh et al. 2023, "Beyond Human
Data": each iteration samples from the last model and fine-tunes the *base* model on what it accepted). One round:

1. **sample** ``num_samples`` answers per prompt with the run's generation settings, through the evaluation's
   back-ends (:func:`trl_rlvr.evaluation.evaluate_sampled`: HF ``generate`` or a vLLM engine, and with an
   ``environment_factory`` TRL's multi-turn tool loop, each sample seeded from ``(seed, question, sample)``);
2. **accept** a sample when the success reward scores it ``>= threshold`` (and, with a format reward, that one
   ``>= format_threshold``) (:func:`acceptance_reward`); by default also only when it ended with an end-of-sequence
   token and every tool call it made parsed and ran (a rollout that reached the right number through a malformed
   call would teach the malformed call); duplicates of a prompt's accepted answers are dropped and at most
   ``max_per_prompt`` are kept (:func:`split_samples`);
3. **write** the accepted conversations as a ``datasets`` dataset (``save_to_disk``): ``messages`` (the prompt and
   the answer: assistant turns and tool replies, as the rewards scored them) or ``prompt`` / ``completion`` for text
   prompts, with ``tools`` (JSON schemas), ``question_index``, ``sample_index``, ``iteration``, ``reference``;
4. **fine-tune** with TRL's ``SFTTrainer``, assistant-only loss (:func:`.fine_tune.supervised_fine_tune`, the tool
   job's cold start): tool replies and prompts carry no loss.

Every output of a run (:func:`rejection_sampling_fine_tune`) is under ``output_dir``: ``iteration_<i>/accepted``
(the dataset), ``iteration_<i>/model`` and ``rft_metrics.json`` (per iteration: samples, accepted, why the others
were rejected, generated tokens, SFT losses).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

#: Why a sample was not kept, in the order the rules are checked.
REJECTIONS = ("reward", "unfinished", "tool_calls", "duplicate", "over_cap")


@dataclass
class RFTSettings:
    """One RFT run's settings: sampling (the run's generation settings), acceptance, iterations."""

    num_samples: int = 8  # answers sampled per prompt
    threshold: float = 1.0  # the success reward's acceptance threshold
    format_threshold: float = 1.0  # the format reward's, when one is given
    require_finished: bool = True  # drop answers cut by the token budget
    require_clean_tool_calls: bool = True  # drop tool rollouts with a call that did not parse or failed to run
    unique: bool = True  # drop an answer equal to one already kept for its prompt
    max_per_prompt: int | None = None  # keep at most this many accepted answers per prompt (None: all)
    iterations: int = 1  # rounds of sample -> accept -> fine-tune (expert iteration when > 1)
    restart_from_base: bool = True  # each round fine-tunes the base model (ReST-EM); False: the last round's model
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256  # the completion budget, tool replies included (TRL's max_completion_length)
    max_tool_calling_iterations: int | None = None
    seed: int = 0  # round i samples with seed + i
    batch_size: int = 64  # rollouts per generate() call

    def __post_init__(self):
        for name in ("num_samples", "iterations", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"RFT {name} must be a positive integer, got {value!r}")
        for name in ("threshold", "format_threshold"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"RFT {name} must be a finite number, got {getattr(self, name)!r}")
        if self.max_per_prompt is not None and (not isinstance(self.max_per_prompt, int) or self.max_per_prompt < 1):
            raise ValueError(f"RFT max_per_prompt must be a positive integer or None, got {self.max_per_prompt!r}")

    @classmethod
    def from_training_args(cls, args, **overrides) -> RFTSettings:
        """The generation settings of an ``RLVRConfig`` / ``GRPOConfig`` (temperature, top-p, top-k, the completion
        budget, the tool-call cap, the seed), then ``overrides``."""
        run = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k or 0,
                   max_new_tokens=args.max_completion_length, seed=args.seed,
                   max_tool_calling_iterations=getattr(args, "max_tool_calling_iterations", None))
        return cls(**{**run, **overrides})


def acceptance_reward(success_fn, threshold: float, format_fn=None, format_threshold: float = 1.0):
    """A reward function (TRL's signature) that scores 1.0 where ``success_fn`` scored ``>= threshold`` and, with
    ``format_fn``, ``format_fn`` scored ``>= format_threshold``; 0.0 elsewhere; None where ``success_fn`` returned
    None (unscored: never accepted). The evaluation's "right" with threshold 1.0 is then "accepted"."""

    def accepted(**kwargs):
        success = list(success_fn(**kwargs))
        formats = list(format_fn(**kwargs)) if format_fn is not None else [format_threshold] * len(success)
        return [None if s is None else float(s >= threshold and f is not None and f >= format_threshold)
                for s, f in zip(success, formats, strict=True)]

    accepted.__name__ = f"accepted({getattr(success_fn, '__name__', 'success')})"
    return accepted


def conversation(prompt, completion) -> dict:
    """The SFT row of one sample: ``messages`` (a conversational prompt, then the answer's messages) or ``prompt``
    and ``completion`` (text)."""
    if isinstance(prompt, str):
        if not isinstance(completion, str):
            raise ValueError("RFT: a text prompt's completion must be text")
        return {"prompt": prompt, "completion": completion}
    answer = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
    return {"messages": [dict(m) for m in prompt] + [dict(m) for m in answer]}


def _rejection(record: dict, j: int, settings: RFTSettings) -> str | None:
    """Why sample ``j`` of a question's record is rejected by the reward, the budget or its tool calls (None: not)."""
    if not record["right_flags"][j]:
        return "reward"
    if settings.require_finished and not record["finished"][j]:
        return "unfinished"
    tool = record.get("tool")
    if settings.require_clean_tool_calls and tool and (tool["parse_failures"][j] or tool["call_failures"][j]):
        return "tool_calls"
    return None


def split_samples(rows: list[dict], per_question: list[dict], settings: RFTSettings, *, iteration: int = 0,
                  tools: list | None = None) -> tuple[list[dict], list[dict]]:
    """The accepted and the rejected samples of an evaluation's ``per_question`` records (``keep_completions``,
    scored by :func:`acceptance_reward` at threshold 1) of ``rows`` -> (accepted rows, rejected rows). A row: the SFT
    columns (:func:`conversation`), ``tools`` (JSON, when given), ``question_index``, ``sample_index``,
    ``iteration``, ``reference`` (the row's ``solution`` or ``answer``) and ``tokens`` (the model's tokens); a
    rejected row has ``rejected``: one of :data:`REJECTIONS`."""
    accepted, rejected = [], []
    for record in per_question:
        row = rows[record["index"]]
        reference = row.get("solution", row.get("answer"))
        kept: set[str] = set()
        for j, completion in enumerate(record["completions"]):
            out = {**conversation(row["prompt"], completion), **({"tools": json.dumps(tools)} if tools else {}),
                   "question_index": record["index"], "sample_index": j, "iteration": iteration,
                   "reference": None if reference is None else str(reference), "tokens": record["lengths"][j]}
            reason = _rejection(record, j, settings)
            key = json.dumps(completion, sort_keys=True, default=str)
            if reason is None and settings.unique and key in kept:
                reason = "duplicate"
            if reason is None and settings.max_per_prompt is not None and len(kept) >= settings.max_per_prompt:
                reason = "over_cap"
            if reason is None:
                kept.add(key)
                accepted.append(out)
            else:
                rejected.append({**out, "rejected": reason})
    return accepted, rejected


def round_metrics(accepted: list[dict], rejected: list[dict], questions: int) -> dict:
    """One round's counts: samples, accepted (and their share), prompts with at least one accepted answer, each
    rejection reason, and the tokens the model generated (all samples; the accepted ones)."""
    samples = len(accepted) + len(rejected)
    return {
        "questions": questions, "samples": samples, "accepted": len(accepted),
        "accept_rate": len(accepted) / samples if samples else 0.0,
        "questions_with_accepted": len({r["question_index"] for r in accepted}),
        "rejected": {reason: sum(r["rejected"] == reason for r in rejected) for reason in REJECTIONS},
        "generated_tokens": sum(r["tokens"] for r in accepted + rejected),
        "accepted_tokens": sum(r["tokens"] for r in accepted),
    }


def rejection_sample(model, tokenizer, dataset, success_fn, settings: RFTSettings, *, format_fn=None, llm=None,
                     accelerator=None, environment_factory=None, chat_template: str | None = None,
                     tools: list | None = None, iteration: int = 0) -> tuple[list[dict], list[dict], dict]:
    """Sample ``settings.num_samples`` answers per row of ``dataset`` (rows with ``prompt``; with an
    ``environment_factory``, conversations) from ``model`` (or the vLLM engine ``llm``), seed ``settings.seed +
    iteration``, and split them (:func:`split_samples`) -> (accepted, rejected, :func:`round_metrics`). ``tools``:
    the JSON schemas the rows carry (default: the environment's, :func:`environment_tool_schemas`)."""
    from trl_rlvr.evaluation import evaluate_sampled

    rows = [dict(r) for r in dataset]
    missing = [i for i, r in enumerate(rows) if "prompt" not in r]
    if missing:
        raise ValueError(f"RFT: the dataset has no 'prompt' column (row {missing[0]}; columns: {sorted(rows[0])})")
    if tools is None and environment_factory is not None:
        tools = environment_tool_schemas(environment_factory)
    t0 = time.time()
    result = evaluate_sampled(
        model, tokenizer, rows, acceptance_reward(success_fn, settings.threshold, format_fn, settings.format_threshold),
        n=settings.num_samples, ks=[1], accelerator=accelerator, temperature=settings.temperature,
        top_p=settings.top_p, top_k=settings.top_k, max_new_tokens=settings.max_new_tokens,
        batch_size=settings.batch_size, seed=settings.seed + iteration, keep_samples=0, llm=llm,
        environment_factory=environment_factory, chat_template=chat_template,
        max_tool_calling_iterations=settings.max_tool_calling_iterations, keep_completions=True,
    )
    accepted, rejected = split_samples(rows, result["per_question"], settings, iteration=iteration, tools=tools)
    metrics = {**round_metrics(accepted, rejected, len(rows)), "sampling_seconds": round(time.time() - t0, 1)}
    return accepted, rejected, metrics


def save_accepted(rows: list[dict], path) -> None:
    """The accepted rows as a ``datasets`` dataset at ``path`` (``save_to_disk``); an empty round writes an empty
    dataset with the columns. Tool-call arguments are stored as Arrow structs: the calls of one tool share their
    fields (a tool whose calls take different arguments gets the union, the missing ones null)."""
    from datasets import Dataset

    columns = ("messages", "prompt", "completion", "tools", "question_index", "sample_index", "iteration",
               "reference", "tokens")
    data = Dataset.from_list(rows) if rows else Dataset.from_dict({c: [] for c in ("messages",) + columns[4:]})
    data.save_to_disk(str(path), num_shards=1)  # one shard: an empty dataset too (zero shards do not load back)


def load_accepted(path):
    """An RFT dataset written by :func:`save_accepted` (``load_from_disk``); ``ValueError`` naming the path when it
    is not one, or the column an SFT row needs when it is missing."""
    from datasets import Dataset, load_from_disk

    path = Path(path)
    if not (path / "dataset_info.json").is_file():
        raise ValueError(f"RFT dataset {path}: not a dataset written by save_to_disk (no dataset_info.json)")
    data = load_from_disk(str(path))
    if not isinstance(data, Dataset):
        raise ValueError(f"RFT dataset {path}: a DatasetDict, not one dataset")
    if "messages" not in data.column_names and not {"prompt", "completion"} <= set(data.column_names):
        raise ValueError(f"RFT dataset {path}: no 'messages' column (nor 'prompt' and 'completion'); columns: "
                         f"{data.column_names}")
    return data


def environment_tool_schemas(environment_factory) -> list[dict]:
    """The JSON schemas of the tools an environment offers (its public methods, as TRL's loop offers them), to
    render the SFT rows as the rollouts were rendered."""
    from transformers.utils import get_json_schema

    from trl_rlvr.evaluation.tool_rollouts import environment_tools

    environment = environment_factory()
    try:
        return [get_json_schema(tool) for tool in environment_tools(environment)]
    finally:
        close = getattr(environment, "__exit__", None)
        if callable(close):
            close(None, None, None)


def rejection_sampling_fine_tune(model_path, tokenizer, dataset, success_fn, output_dir, settings: RFTSettings,
                                 sft, *, format_fn=None, environment_factory=None, tools: list | None = None,
                                 make_llm=None, load_model=None, train: bool = True, dtype: str = "float32") -> dict:
    """RFT of the model at ``model_path`` (the module's docstring): ``settings.iterations`` rounds of
    :func:`rejection_sample` (HF ``generate`` on ``load_model(path)``, default ``AutoModelForCausalLM`` on the GPU
    when there is one; ``make_llm(path)`` -> a vLLM engine of a round's model instead) ->
    :func:`save_accepted` -> :func:`.fine_tune.supervised_fine_tune` with ``sft`` (an
    :class:`~trl_rlvr.supervised.fine_tune.SFTSettings`), each round sampling from the last round's model. ``tools``:
    the JSON schemas the rows are rendered with (default: the environment's, :func:`environment_tool_schemas`). ``train``:
    False writes the datasets only. Returns the metrics (also ``output_dir/rft_metrics.json``); ``model``: the
    last model's path."""
    out = Path(output_dir)
    if (out / "rft_metrics.json").exists():
        raise ValueError(f"RFT output_dir {out} holds a finished run (rft_metrics.json): give a new output_dir")
    out.mkdir(parents=True, exist_ok=True)
    if tools is None and environment_factory is not None:
        tools = environment_tool_schemas(environment_factory)  # once, for every round
    current, rounds = str(model_path), []
    for iteration in range(settings.iterations):
        where = out / f"iteration_{iteration}"
        accepted, _, metrics = _sample_round(current, tokenizer, dataset, success_fn, settings, format_fn=format_fn,
                                             environment_factory=environment_factory, tools=tools,
                                             iteration=iteration, make_llm=make_llm, load_model=load_model,
                                             dtype=dtype)
        save_accepted(accepted, where / "accepted")
        metrics["dataset"] = str(where / "accepted")
        if train and accepted:
            from trl_rlvr.supervised.fine_tune import supervised_fine_tune

            start = str(model_path) if settings.restart_from_base else current
            t0 = time.time()
            history = supervised_fine_tune(start, tokenizer, accepted, where / "model", sft, tools,
                                           label=f"RFT iteration {iteration}")
            current = str(where / "model")
            metrics.update(sft_steps=len(history), sft_loss=[h["loss"] for h in history],
                           sft_seconds=round(time.time() - t0, 1), model=current)
        rounds.append(metrics)
        print(f"RFT iteration {iteration}: {metrics['accepted']}/{metrics['samples']} accepted "
              f"({metrics['questions_with_accepted']}/{metrics['questions']} prompts), rejected {metrics['rejected']}",
              flush=True)
    report = {"model": current, "iterations": rounds, "settings": asdict(settings), "sft": asdict(sft)}
    (out / "rft_metrics.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def _sample_round(path: str, tokenizer, dataset, success_fn, settings: RFTSettings, *, make_llm, load_model, dtype,
                  **kwargs):
    """:func:`rejection_sample` from the model at ``path`` (``load_model(path)``, by default HF on the GPU when there
    is one; or ``make_llm(path)``), its memory released after."""
    import torch

    from trl_rlvr.evaluation import release_memory

    llm = model = None
    if make_llm is not None:
        llm = make_llm(path)
    elif load_model is not None:
        model = load_model(path)
    else:
        from transformers import AutoModelForCausalLM

        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype if dtype == "auto" else getattr(torch, dtype))
        model = model.to(device).eval()
    try:
        return rejection_sample(model, tokenizer, dataset, success_fn, settings, llm=llm, **kwargs)
    finally:
        del model, llm
        release_memory()
