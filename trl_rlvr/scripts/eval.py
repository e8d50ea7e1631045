"""``trl-rlvr eval``: sampled evaluation of one or more models with the training verifiers: n answers per question,
scored by the training rewards; pass@k (Chen et al. 2021's unbiased estimator), maj@k, mean@n, format rate,
truncation, and with ``--environment`` the tool metrics of TRL's multi-turn tool loop.

    trl-rlvr eval BASE_DIR TRAINED_DIR --label base --label trained --dataset arithmetic --n 8 --k 1 2 4 8

prints a table, writes ``eval.json`` and ``passk.png`` (pass@k and maj@k against k, one curve per model) to
``--output_dir``. Several processes: ``accelerate launch -m trl_rlvr.scripts.cli eval ...`` (each process samples a share
of the questions; the numbers equal a one-process run's). ``--vllm`` generates with a vLLM engine instead of HF
``generate`` (one process; each sample seeded as on the HF path, the samples themselves differ); ``--vllm_server
URL`` with a running vLLM server (TRL's client; the same seeded requests). Definitions: docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("eval", help="sampled evaluation: pass@k, maj@k, mean@n with the training rewards",
                       usage="%(prog)s MODEL [MODEL ...] [--label NAME ...] [--OPTION VALUE ...]",
                       description=__doc__.replace("``", "`"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="model directories or hub ids (a directory with adapter_config.json "
                   "is a PEFT adapter on its base model); several models are compared in one table and plot")
    p.add_argument("--label", action="append", default=None, help="a name per model, in order (default: directory name)")
    _add_data_arguments(p)
    _add_reward_arguments(p)
    _add_sampling_arguments(p)
    _add_vllm_arguments(p)
    _add_tool_arguments(p)
    o = p.add_argument_group("output")
    o.add_argument("--output_dir", default="eval_results", help="where eval.json and passk.png go")
    o.add_argument("--no_plot", action="store_true")
    o.add_argument("--no_progress", action="store_true")
    p.set_defaults(func=run)
    return p


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The questions: the built-in arithmetic set, a local file or a hub dataset, and how prompts are made."""
    d = parser.add_argument_group("data")
    d.add_argument("--dataset", default="arithmetic", help="'arithmetic' (built-in, offline), a local .json/.jsonl "
                   "file, or a hub dataset name")
    d.add_argument("--dataset_config", default=None, help="hub dataset configuration (e.g. 'main' for gsm8k)")
    d.add_argument("--split", default="test", help="hub dataset split")
    d.add_argument("--question_column", default="question")
    d.add_argument("--answer_column", default="answer", help="reference answer (GSM8K's '... #### 42' becomes 42)")
    d.add_argument("--prompt_column", default=None, help="use this column as the prompt as is (no template; with "
                   "--environment, conversations, e.g. with a system turn)")
    d.add_argument("--prompt_style", default=None, choices=["chat_prefill", "r1zero", "chat"],
                   help="default: chat_prefill; chat (conversational) with --environment")
    d.add_argument("--num_questions", type=int, default=None, help="first N questions (arithmetic: default 100)")
    d.add_argument("--dataset_seed", type=int, default=0, help="built-in arithmetic: the seed of the held-out set")
    d.add_argument("--max_operand", type=int, default=20, help="built-in arithmetic: operands from 1..max_operand")


def _add_reward_arguments(parser: argparse.ArgumentParser) -> None:
    """The rewards that decide right / wrong and formatted, and their options."""
    r = parser.add_argument_group("rewards")
    r.add_argument("--reward", default="boxed_math", help="the reward that decides right/wrong: a registered name "
                   "(`trl-rlvr rewards list`) or module:function / module.function of a reward function")
    r.add_argument("--format_reward", default="think_format", help="reward whose score >= 1 counts as formatted "
                   "('none': no format rate)")
    r.add_argument("--reward_option", action="append", default=[], metavar="NAME.OPTION=VALUE",
                   help="an option of a registered reward (VALUE read as JSON, else a string), e.g. "
                   "boxed_math.timeout=10; boxed_math/think_format get prefilled=true with a <think>-prefilled prompt")
    r.add_argument("--success_threshold", type=float, default=1.0)


def _add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """The sampling: samples per question, k values, the sampler's settings, the seed, the batch, the dtype."""
    s = parser.add_argument_group("sampling")
    s.add_argument("--n", type=int, default=8, help="samples per question")
    s.add_argument("--k", type=int, nargs="+", default=None, help="k values (default 1 2 4 ... n); each <= n")
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--top_p", type=float, default=1.0)
    s.add_argument("--top_k", type=int, default=0, help="0: off")
    s.add_argument("--max_new_tokens", type=int, default=256)
    s.add_argument("--seed", type=int, default=0, help="a sample's tokens depend only on (seed, question, sample)")
    s.add_argument("--batch_size", type=int, default=64, help="sequences per generate() call")
    s.add_argument("--dtype", default="float32", help="model weights dtype (float32, bfloat16, float16, auto)")


def _add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM instead of HF ``generate`` (optional)."""
    v = parser.add_argument_group("vLLM (optional: pip install vllm)")
    v.add_argument("--vllm", action="store_true", help="generate with a vLLM engine instead of HF generate (each "
                   "sample still seeded from seed, question and sample; the samples differ from HF's)")
    v.add_argument("--vllm_gpu_memory_utilization", type=float, default=0.9)
    v.add_argument("--vllm_max_model_length", type=int, default=None, help="default: the model's")
    v.add_argument("--vllm_enforce_eager", action="store_true", help="no CUDA graphs / torch.compile (starts faster)")
    v.add_argument("--vllm_server", "--vllm-server", metavar="URL", default=None,
                   help="generate on a running vLLM server at URL (TRL's VLLMClient; e.g. one started by `python -m "
                   "trl_rlvr.scripts.vllm_serve --model MODEL`), each sample a request with its own seed as with "
                   "--vllm; MODEL (one) is then the model the server serves: it lends the tokenizer and the label")


def _add_tool_arguments(parser: argparse.ArgumentParser) -> None:
    """Multi-turn tool rollouts, as TRL's trainer runs them."""
    t = parser.add_argument_group("tools (multi-turn tool rollouts, as TRL's trainer runs them; on HF generate or --vllm)")
    t.add_argument("--environment", default=None, metavar="MODULE:CLASS", help="an environment class (TRL's "
                   "environment_factory), e.g. reward_plugins.code_sandbox:PythonEnvironment: every sample is a tool "
                   "rollout, and the tool metrics are reported")
    t.add_argument("--environment_options", default=None, help="keyword arguments of the environment, as JSON, "
                   "e.g. '{\"timeout\": 5}'")
    t.add_argument("--chat_template", default=None, help="the chat template to render with: a .jinja file or a "
                   "template TRL ships (e.g. qwen2_5); needed when the model's own does not render tools")
    t.add_argument("--max_tool_calling_iterations", type=int, default=None, help="TRL's cap on tool turns per "
                   "sample (default: the budget alone)")


# ------------------------------------------------------------------------------------------------ pieces
def parse_reward_options(items: list[str]) -> dict[str, dict]:
    """``["boxed_math.timeout=10"]`` -> ``{"boxed_math": {"timeout": 10}}`` (values read as JSON, else strings)."""
    out: dict[str, dict] = {}
    for item in items:
        key, eq, value = item.partition("=")
        name, dot, option = key.partition(".")
        if not eq or not dot or not name or not option:
            raise ValueError(f"--reward_option {item!r}: expected NAME.OPTION=VALUE (e.g. boxed_math.timeout=10)")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        out.setdefault(name, {})[option] = parsed
    return out


def tool_options(args) -> dict:
    """``evaluate_sampled``'s tool-rollout arguments from ``--environment`` and friends ({} without one);
    ``ValueError`` naming the option."""
    if args.environment is None:
        for name in ("environment_options", "chat_template", "max_tool_calling_iterations"):
            if getattr(args, name) is not None:
                raise ValueError(f"--{name} is set but --environment is not: name the environment class")
        return {}
    if args.prompt_style != "chat":
        raise ValueError(f"--environment needs conversational prompts: --prompt_style chat (not {args.prompt_style}), "
                         "or a --prompt_column of conversations")
    from types import SimpleNamespace

    from trl_rlvr.scripts.chat_templates import resolve_chat_template
    from trl_rlvr.scripts.train import build_environment_factory

    options = args.environment_options
    if options is not None:
        try:
            options = json.loads(options)
        except json.JSONDecodeError as e:
            raise ValueError(f"--environment_options must be a JSON object of keyword arguments: {e}") from None
        if not isinstance(options, dict):
            raise ValueError(f"--environment_options must be a JSON object, not {options!r}")
    factory = build_environment_factory(SimpleNamespace(environment_factory=args.environment,
                                                        environment_options=options))
    if args.max_tool_calling_iterations is not None and args.max_tool_calling_iterations < 1:
        raise ValueError(f"--max_tool_calling_iterations must be >= 1, got {args.max_tool_calling_iterations}")
    template = None if args.chat_template is None else resolve_chat_template(args.chat_template, "--chat_template")
    return dict(environment_factory=factory, chat_template=template,
                max_tool_calling_iterations=args.max_tool_calling_iterations)


def eval_rewards(args) -> tuple:
    from trl_rlvr.rewards.registry import resolve_reward_spec
    from trl_rlvr.scripts.data import with_prefilled_options

    options = parse_reward_options(args.reward_option)
    names = [args.reward] + ([args.format_reward] if args.format_reward and args.format_reward != "none" else [])
    stray = [n for n in options if n not in names]
    if stray:
        raise ValueError(f"--reward_option for {stray}, which is not --reward or --format_reward ({names})")
    if args.prompt_column is None:  # the prompt is ours: it may end with <think>
        with_prefilled_options(options, names, args.prompt_style)
    success = resolve_reward_spec(args.reward, options.get(args.reward))
    fmt = resolve_reward_spec(names[1], options.get(names[1])) if len(names) > 1 else None
    return success, fmt


def load_rows(args) -> list[dict]:
    """Question/answer rows (``question``, ``answer``, optionally ``prompt``) from the chosen source."""
    from trl_rlvr.scripts.data import extract_reference, heldout_arithmetic

    if args.dataset == "arithmetic":  # the test split of arithmetic_dataset(seed=dataset_seed), as the main job's
        n = args.num_questions or 100
        return [{"question": r["question"], "answer": r["answer"]}
                for r in heldout_arithmetic(n, args.dataset_seed, args.max_operand)]
    from datasets import load_dataset

    path = Path(args.dataset)
    if path.suffix in (".json", ".jsonl"):
        if not path.is_file():
            raise ValueError(f"--dataset {args.dataset}: no such file")
        ds, where = load_dataset("json", data_files=str(path), split="train"), str(path)
    else:
        ds, where = load_dataset(args.dataset, args.dataset_config, split=args.split), f"{args.dataset}[{args.split}]"
    needed = [args.answer_column, args.prompt_column or args.question_column]
    missing = [c for c in needed if c not in ds.column_names]
    if missing:
        raise ValueError(f"{where}: no column {missing} (columns: {ds.column_names}); set --question_column / "
                         "--answer_column / --prompt_column")
    if args.num_questions is not None:
        ds = ds.select(range(min(args.num_questions, len(ds))))
    rows = []
    for r in ds:
        row = {"question": str(r[args.question_column]) if args.question_column in r else None,
               "answer": extract_reference(r[args.answer_column])}
        if args.prompt_column:
            row["prompt"] = r[args.prompt_column]
            if args.environment and not is_conversation(row["prompt"]):
                raise ValueError(f"{where}: --prompt_column {args.prompt_column} with --environment: row {len(rows)}'s "
                                 "prompt is not a conversation (a list of {'role': ..., 'content': ...} messages), "
                                 "which a tool loop needs")
        rows.append(row)
    return rows


def is_conversation(prompt) -> bool:
    """A list of chat messages (dicts with a string ``role``), as TRL's conversational prompts are."""
    return isinstance(prompt, list) and bool(prompt) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in prompt)


def default_prompt_style(args) -> str:
    """``--prompt_style``, else ``chat`` with an ``--environment`` (a tool loop needs conversational prompts), else
    ``chat_prefill``."""
    return args.prompt_style or ("chat" if args.environment else "chat_prefill")


def with_prompts(rows: list[dict], tokenizer, prompt_style: str):
    """The rows as a dataset with the model's prompt (its own chat template) and ``solution`` = ``answer``."""
    from datasets import Dataset

    from trl_rlvr.scripts.data import format_prompt

    return Dataset.from_list([
        {**r, "prompt": r.get("prompt") or format_prompt(r["question"], tokenizer, prompt_style), "solution": r["answer"]}
        for r in rows
    ])


def load_model(path: str, dtype: str, device):
    """A causal LM (or a PEFT adapter on its base) and its tokenizer, in eval mode on ``device``."""
    from trl_rlvr.scripts.models import load_model_and_tokenizer, load_tokenizer, resolve_model_path

    path = resolve_model_path(path)
    adapter = Path(path) / "adapter_config.json"
    if not adapter.is_file():
        model, tokenizer, _ = load_model_and_tokenizer(path, dtype=dtype)
        return model.to(device).eval(), tokenizer
    import torch
    from peft import AutoPeftModelForCausalLM

    model = AutoPeftModelForCausalLM.from_pretrained(path, dtype="auto" if dtype == "auto" else getattr(torch, dtype))
    has_tokenizer = any((Path(path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    base = json.loads(adapter.read_text()).get("base_model_name_or_path")
    tokenizer = load_tokenizer(path if has_tokenizer or not base else base)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval(), tokenizer


def load_vllm_engine(path: str, args):
    """A ``vllm.LLM`` for ``path`` and the model's tokenizer (the one that renders prompts and decodes answers)."""
    from trl_rlvr.scripts.models import load_tokenizer, resolve_model_path

    path = resolve_model_path(path)
    if (Path(path) / "adapter_config.json").is_file():
        raise ValueError(f"--vllm: {path} is a PEFT adapter; merge it into its base model first "
                         "(peft's merge_and_unload, then save_pretrained), or evaluate it without --vllm")
    from vllm import LLM

    llm = LLM(model=path, dtype=args.dtype, seed=args.seed, gpu_memory_utilization=args.vllm_gpu_memory_utilization,
              max_model_len=args.vllm_max_model_length, enforce_eager=args.vllm_enforce_eager)
    return llm, load_tokenizer(path)


def load_served_engine(path: str, url: str):
    """The vLLM server at ``url`` as the evaluation's engine
    (:class:`trl_rlvr.evaluation.vllm_served.ServedEngine`) and the tokenizer of ``path``, the model it serves."""
    from trl_rlvr.evaluation.vllm_served import ServedEngine
    from trl_rlvr.scripts.models import load_tokenizer, resolve_model_path

    return ServedEngine(url), load_tokenizer(resolve_model_path(path))


# ------------------------------------------------------------------------------------------------ main
def checked_inputs(args) -> tuple:
    """``(labels, ks, tool options, (success reward, format reward), rows)`` from the command line, every option
    checked before a model loads (``ValueError`` naming the option); ``args.prompt_style`` resolved."""
    from trl_rlvr.evaluation.evaluate import resolve_ks

    labels = args.label or [Path(m.rstrip("/")).name or m for m in args.models]
    if len(labels) != len(args.models):
        raise ValueError(f"{len(labels)} --label for {len(args.models)} models: give one per model")
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must differ: {labels} (use --label)")
    ks = resolve_ks(args.n, args.k)
    if args.vllm and args.vllm_server:
        raise ValueError("--vllm (an engine in this process) and --vllm_server (a running server): give one")
    if args.vllm_server and len(args.models) != 1:
        raise ValueError(f"--vllm_server: a server serves one model, got {len(args.models)}: evaluate one at a time")
    for option, given in (("--vllm", args.vllm), ("--vllm_server", args.vllm_server)):
        if given and importlib.util.find_spec("vllm") is None:
            raise ValueError(f"{option}: vLLM is not installed (pip install vllm; TRL's client needs it too), or "
                             f"evaluate without {option}")
    args.prompt_style = default_prompt_style(args)
    tools = tool_options(args)
    return labels, ks, tools, eval_rewards(args), load_rows(args)


def write_results(args, results: dict, num_processes: int) -> None:
    """``eval.json`` (the settings and each model's results) and ``passk.png`` in ``--output_dir``; the table."""
    from trl_rlvr.evaluation.report import format_table, plot_passk

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "func"}
    (out / "eval.json").write_text(json.dumps({"settings": settings, "num_processes": num_processes,
                                               "models": results}, indent=1, default=str))
    print(format_table(results))
    plot = None if args.no_plot else plot_passk(results, out / "passk.png")
    print(f"results: {out / 'eval.json'}" + (f"   plot: {plot}" if plot else ""))


def run(args) -> int:
    from trl_rlvr.evaluation.evaluate import evaluate_sampled
    from trl_rlvr.evaluation.progress import plain_library_bars
    from trl_rlvr.scripts.distributed import distributed_state

    plain_library_bars()  # redirected to a file: the sampling bar is plain lines, the libraries' bars off
    try:
        labels, ks, tools, (success_fn, format_fn), rows = checked_inputs(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    state = distributed_state()
    if (args.vllm or args.vllm_server) and state.num_processes > 1:
        print(f"error: --vllm and --vllm_server run in one process (vLLM batches and places the model itself), not "
              f"{state.num_processes}: launch trl-rlvr eval without accelerate", file=sys.stderr)
        return 2
    results = {}
    for label, model_path in zip(labels, args.models):
        t = time.time()
        llm = None
        if args.vllm or args.vllm_server:
            try:
                llm, tokenizer = (load_served_engine(model_path, args.vllm_server) if args.vllm_server
                                  else load_vllm_engine(model_path, args))
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            model = None
        else:
            model, tokenizer = load_model(model_path, args.dtype, state.device)
        if state.is_main_process:
            print(f"{label}: {model_path} loaded in {time.time() - t:.0f}s; {len(rows)} questions x {args.n} samples",
                  file=sys.stderr)
        results[label] = evaluate_sampled(
            model, tokenizer, with_prompts(rows, tokenizer, args.prompt_style), success_fn, format_fn, n=args.n, ks=ks,
            accelerator=state if state.num_processes > 1 else None, temperature=args.temperature, top_p=args.top_p,
            top_k=args.top_k, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, seed=args.seed,
            success_threshold=args.success_threshold, progress=not args.no_progress, llm=llm, **tools,
        )
        results[label]["model"] = model_path
        results[label]["generator"] = "vllm_server" if args.vllm_server else "vllm" if llm is not None else "hf"
        del model, llm
    if state.is_main_process:
        write_results(args, results, state.num_processes)
    state.wait_for_everyone()
    return 0
