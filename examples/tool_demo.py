"""Does SmolLM2-135M-Instruct use a Python tool when shown how? Accuracy with and without the tool, offline on a CPU.

``python examples/tool_demo.py`` asks large-number multiplications ("What is 48213 * 77?") twice, with the same
one-shot example in the conversation:

* **without the tool**: the example answers directly (``\\boxed{848205}``);
* **with the tool**: the example calls ``python`` (``print(31415 * 27)``), reads the tool's reply and boxes it; the
  tool's schema is in the prompt, rendered as TRL renders tools (``apply_chat_template(..., tools=[...])``).

Samples come from the evaluation's seeded generation loop (:func:`trl_rlvr.evaluation.generate_completions`) and are
scored by the training reward (``boxed_math``) with the evaluation's scorer (:func:`score_questions`: mean@n,
pass@k), and again counting only integer answers (``boxed_math`` accepted the question itself boxed,
``\\boxed{72468 * 55}``, before its integer-gold rule; the second count is kept as a check). With the tool, each sample runs TRL's tool loop by hand: the completion is parsed with TRL's
``parse_response``, each call runs in a fresh sandboxed ``PythonEnvironment`` (``reset()`` per sample), and generation
goes on from prompt + completion + the tool's reply rendered as TRL renders it (``_get_tool_suffix_ids``), for at
most ``--max_tool_calls`` rounds. The reward reads the last assistant turn, as it does on TRL's tool rollouts.

SmolLM2's own chat template drops ``tools`` and tool calls (TRL's ``supports_tool_calling`` is False for it, and
``add_response_schema`` does not know it), so the tool run uses TRL's Qwen2.5 template, which speaks the same ChatML
tokens (``<|im_start|>``, ``<|im_end|>``) and which TRL parses (``<tool_call>{json}</tool_call>``). The run without
the tool uses the same template without tools, so the two differ only in the tool.

Results, time and the command: docs/python_tool.md. ``--questions 2 --samples 2`` is a quick check.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from functools import partial
from pathlib import Path

SYSTEM_TOOL = "You are a helpful assistant. Use the python tool to compute, then give the final answer as \\boxed{number}."
SYSTEM_PLAIN = "You are a helpful assistant. Give the final answer as \\boxed{number}."
EXAMPLE_QUESTION, EXAMPLE_CODE, EXAMPLE_ANSWER = "What is 31415 * 27?", "print(31415 * 27)", str(31415 * 27)


def multiplication_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` questions "What is a * b?" (a: 5 digits, b: 2 digits) with their products as ``answer``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10_000, 99_999), rng.randint(10, 99)
        rows.append({"question": f"What is {a} * {b}?", "answer": str(a * b), "solution": str(a * b)})
    return rows


def tool_call_message(code: str) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"code": code}}}]}


#: The one-shot example written out in the user's turn (``--shot instruction``), in the syntax TRL parses.
TOOL_INSTRUCTION = (
    "Call the python tool to compute, then write the result inside \\boxed{{}}.\n"
    "Example:\nQuestion: " + EXAMPLE_QUESTION + "\nAnswer: <tool_call>\n"
    '{{"name": "python", "arguments": {{"code": "' + EXAMPLE_CODE + '"}}}}\n</tool_call>\n\n'
    "Question: {question}"
)


def conversation(question: str, with_tool: bool, shot: str = "history") -> list[dict]:
    """System turn, the one-shot example (with or without a tool call), then ``question``. ``shot="history"``: the
    example as earlier turns of the conversation; ``"instruction"``: the tool call written out in the user's turn."""
    if with_tool and shot == "instruction":
        return [{"role": "system", "content": SYSTEM_TOOL},
                {"role": "user", "content": TOOL_INSTRUCTION.format(question=question)}]
    if with_tool:
        example = [{"role": "user", "content": EXAMPLE_QUESTION}, tool_call_message(EXAMPLE_CODE),
                   {"role": "tool", "name": "python", "content": EXAMPLE_ANSWER},
                   {"role": "assistant", "content": f"\\boxed{{{EXAMPLE_ANSWER}}}"}]
    else:
        example = [{"role": "user", "content": EXAMPLE_QUESTION},
                   {"role": "assistant", "content": f"\\boxed{{{EXAMPLE_ANSWER}}}"}]
    system = {"role": "system", "content": SYSTEM_TOOL if with_tool else SYSTEM_PLAIN}
    return [system, *example, {"role": "user", "content": question}]


def tool_tokenizer(path: str):
    """The model's tokenizer with TRL's Qwen2.5 chat template (ChatML with tools) and the response template TRL sets
    for it, after checking that the model's own template cannot carry tools (TRL would refuse it)."""
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template, supports_tool_calling

    from trl_rlvr.scripts.models import load_tokenizer

    tokenizer = load_tokenizer(path)
    own = supports_tool_calling(tokenizer)
    if {"<|im_start|>", "<|im_end|>"} - set(tokenizer.get_vocab()):
        raise ValueError(f"{path}: the tokenizer has no ChatML tokens; TRL's Qwen2.5 template would not fit it")
    tokenizer.chat_template = qwen2_5_chat_template
    add_response_schema(tokenizer)
    return tokenizer, own


def tool_suffix(tokenizer, tool_messages: list[dict]) -> str:
    """The text TRL appends after a completion that called tools: the tool turn(s) and the next assistant header
    (what ``GRPOTrainer._get_tool_suffix_ids`` computes, as text)."""
    calls = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    prefix = tokenizer.apply_chat_template(dummy, tokenize=False)
    full = tokenizer.apply_chat_template(dummy + tool_messages, tokenize=False, add_generation_prompt=True)
    prefix = prefix[: prefix.rindex(tokenizer.eos_token) + len(tokenizer.eos_token)]  # cut at EOS, as TRL does
    if not full.startswith(prefix):
        raise ValueError("the chat template is not prefix-preserving: tool replies cannot be appended")
    return full[len(prefix):]


def run_tool_rollouts(model, tokenizer, rows, n, *, seed, temperature, max_new_tokens, batch_size, max_tool_calls,
                      environment_factory, shot="history"):
    """``n`` sampled tool rollouts per row, each with its own environment (``environment_factory()``, reset before
    its first call, as TRL does); per row a list of ``(last assistant text, model-written token ids, finished)``
    and per-sample records (the calls: code, the tool's reply; the environment's ``stats``)."""
    from contextlib import ExitStack

    from transformers.utils import get_json_schema
    from trl.chat_template_utils import parse_response

    from reward_plugins.code_sandbox import PythonEnvironment
    from trl_rlvr.evaluation import generate_completions

    tools = [get_json_schema(PythonEnvironment.python)]  # the schema TRL builds from the environment's tool method
    prompts = [tokenizer.apply_chat_template(conversation(r["question"], True, shot), tools=tools, tokenize=False,
                                             add_generation_prompt=True) for r in rows]
    slots = [{"q": q, "text": prompts[q], "ids": [], "turns": [], "last": "", "finished": False, "calls": [],
              "stats": None}
             for q in range(len(rows)) for _ in range(n)]
    groups = generate_completions(model, tokenizer, prompts, list(range(len(rows))), n, temperature=temperature,
                                  max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed)
    turn = list(zip(slots, (s for group in groups for s in group)))
    with ExitStack() as stack:
        environments = {}
        for round_ in range(max_tool_calls + 1):
            pending = []
            for slot, (_, ids, finished) in turn:
                prefix_ids = tokenizer(slot["text"], add_special_tokens=False).input_ids
                completion_ids = ids + ([tokenizer.eos_token_id] if finished else [])
                parsed = parse_response(tokenizer, completion_ids, prefix=prefix_ids, tools=tools)
                slot["ids"] += ids
                slot["turns"].append(tokenizer.decode(completion_ids))
                slot["last"], slot["finished"] = parsed.get("content") or "", finished
                calls = parsed.get("tool_calls") or []
                if not calls or round_ == max_tool_calls:
                    continue
                if id(slot) not in environments:
                    environments[id(slot)] = env = stack.enter_context(environment_factory())
                    env.reset(**rows[slot["q"]])
                env = environments[id(slot)]
                replies = []
                for call in calls:
                    function = call.get("function") or {}
                    arguments = function.get("arguments")
                    if function.get("name") == "python" and isinstance(arguments, dict) and set(arguments) == {"code"}:
                        reply = env.python(**arguments)
                    else:  # what TRL replies when a call cannot be made
                        reply = str({"error": f"Tool {function.get('name')!r} not found or bad arguments"})
                    slot["calls"].append({"code": (arguments or {}).get("code"), "reply": reply})
                    replies.append({"role": "tool", "name": "python", "content": reply})
                slot["stats"] = dict(env.stats)
                slot["text"] += tokenizer.decode(completion_ids) + tool_suffix(tokenizer, replies)
                pending.append(slot)
            if not pending:
                break
            more = generate_completions(
                model, tokenizer, [s["text"] for s in pending], list(range(len(pending))), 1,
                temperature=temperature, max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed + 1 + round_,
            )
            turn = [(slot, g[0]) for slot, g in zip(pending, more)]
    grouped = [[(s["last"], s["ids"], s["finished"]) for s in slots[q * n:(q + 1) * n]] for q in range(len(rows))]
    return grouped, slots


def call_figures(rows, slots) -> dict:
    """How often the model called the tool, and how often a call's output was the exact product."""
    with_call = [s for s in slots if s["calls"]]
    calls = [c for s in with_call for c in s["calls"]]
    right_calls = [c for s in with_call for c in s["calls"] if c["reply"].strip() == rows[s["q"]]["answer"]]
    return {
        "samples": len(slots), "samples_with_call": len(with_call), "calls": len(calls),
        "calls_printing_the_product": len(right_calls),
        "calls_with_error": sum(s["stats"]["errors"] for s in with_call),
        "calls_timed_out": sum(s["stats"]["timeouts"] for s in with_call),
    }


def integer_answers(reward):
    """``reward`` (boxed_math) that also requires the boxed answer to be an integer written out: boxed_math scores
    ``\\boxed{72468 * 55}`` right for gold 3985740 (math-verify evaluates the product), which here restates the
    question."""
    def boxed_integer(completions, **kwargs):
        scores = reward(completions=completions, **kwargs)
        return [s if s is None or re.fullmatch(r"\d+", (reward.extract_answer(c) or "").strip()) else 0.0
                for s, c in zip(scores, completions)]

    return boxed_integer


def score(rows, groups, n, prompts):
    """mean@n and pass@k with the training reward (boxed_math) and with integer answers only."""
    from trl_rlvr.evaluation import score_questions, summarize_sampled
    from trl_rlvr.rewards import load_reward

    ks = sorted({1, n})
    rows = [{**r, "prompt": p} for r, p in zip(rows, prompts)]
    reward = load_reward("boxed_math")
    out = {}
    for name, fn in (("boxed_math", reward), ("boxed_integer", integer_answers(reward))):
        summary = summarize_sampled(score_questions(rows, groups, fn, None, ks, success_threshold=1.0,
                                                    format_threshold=1.0), n, ks)
        out[name] = {"mean@n": summary["mean@n"], **{f"pass@{k}": summary["pass@k"][k] for k in ks}}
    out["truncated_frac"] = summary["truncated_frac"]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model path (default: the offline SmolLM2-135M-Instruct)")
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--samples", type=int, default=4, help="samples per question")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max_new_tokens", type=int, default=48, help="new tokens per model turn")
    parser.add_argument("--max_tool_calls", type=int, default=2, help="tool turns per rollout (TRL's "
                        "max_tool_calling_iterations)")
    parser.add_argument("--shot", choices=("history", "instruction"), default="history",
                        help="the one-shot tool example as earlier turns, or written out in the user's turn")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default="outputs/tool_demo.json")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from reward_plugins.code_sandbox import PythonEnvironment
    from trl_rlvr.evaluation import generate_completions
    from trl_rlvr.scripts.models import resolve_model_path

    torch.set_num_threads(args.threads)
    t0 = time.time()
    path = resolve_model_path(args.model)
    tokenizer, own_template_tools = tool_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = multiplication_rows(args.questions, args.seed)
    n = args.samples
    print(f"model {path}; its own chat template renders tools: {own_template_tools}")

    t = time.time()
    plain_prompts = [tokenizer.apply_chat_template(conversation(r["question"], False), tokenize=False,
                                                   add_generation_prompt=True) for r in rows]
    plain_groups = generate_completions(model, tokenizer, plain_prompts, list(range(len(rows))), n,
                                        temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                                        batch_size=args.batch_size, seed=args.seed)
    without = {**score(rows, plain_groups, n, plain_prompts), "seconds": round(time.time() - t, 1)}
    print("without the tool:", json.dumps(without))

    t = time.time()
    tool_groups, slots = run_tool_rollouts(
        model, tokenizer, rows, n, seed=args.seed, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size, max_tool_calls=args.max_tool_calls,
        environment_factory=partial(PythonEnvironment, timeout=5.0), shot=args.shot,
    )
    with_tool = {**score(rows, tool_groups, n, plain_prompts), **call_figures(rows, slots),
                 "seconds": round(time.time() - t, 1)}
    print("with the tool:   ", json.dumps(with_tool))

    report = {"model": path, "own_template_renders_tools": own_template_tools, "settings": vars(args),
              "without_tool": without, "with_tool": with_tool, "total_seconds": round(time.time() - t0, 1),
              "examples": {"without_tool": [g[0][0] for g in plain_groups[:3]],
                           "with_tool": [{"turns": s["turns"], "calls": s["calls"]} for s in slots[:: n][:3]]},
              "samples_with_tool": [{"question": rows[s["q"]]["question"], "answer": rows[s["q"]]["answer"],
                                     "turns": s["turns"], "calls": s["calls"]} for s in slots]}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"{len(rows)} questions x {n} samples, T={args.temperature}: accuracy (mean@n, boxed_math / integer answers) "
          f"without the tool {without['boxed_math']['mean@n']:.1%} / {without['boxed_integer']['mean@n']:.1%}, with it "
          f"{with_tool['boxed_math']['mean@n']:.1%} / {with_tool['boxed_integer']['mean@n']:.1%}; samples calling the tool "
          f"{with_tool['samples_with_call']}/{with_tool['samples']}, calls printing the product "
          f"{with_tool['calls_printing_the_product']}/{with_tool['calls']}. {out}  ({report['total_seconds']:.0f} s)")
    return report


if __name__ == "__main__":
    main()
