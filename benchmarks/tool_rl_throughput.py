"""Throughput of the tool job's RL step, against this CPU's limit for its model; then options to generate faster.

    python -m benchmarks.tool_rl_throughput [--part step|generation|both|evaluation] [--model PATH] [--steps 1]
                                            [--batches 16,64] [--new_tokens 48] [--repeat 2] [--save FILE] [--smoke]

``step``: ``examples/tool_r1.py``'s RL trainer (its defaults: 2 questions x 8 rollouts, the sandboxed Python tool,
dynamic sampling with up to 2 rounds) from a cold start (the example's own SFT on its traces, made once under
``--cache_dir``; or ``--model``), trained ``--steps`` steps, every step timed in its parts by wrapping, on the
instances only, the model's ``generate``, the environment's tool calls, the trainer's ``compute_loss`` and the
accelerator's ``backward``. Reported per step: generated tokens/s (model tokens up to each row's first EOS),
tool calls/s, training tokens/s (prompt + completion tokens through forward and backward), and the share of the
step in generation, in the tool, in forward+backward and in the rest (scoring, the tool loop's tokenising,
the optimizer).

The limit: this CPU's matmul FLOP/s and memory bandwidth, measured with torch on the threads the run uses (a
2048^3 fp32 matmul; a 256 MiB copy), and the model's parameter count N and weight bytes: decoding B rows at once
reads every weight once per step, so generation is bounded by min(B x bandwidth / weight bytes, FLOP/s / 2N)
tokens/s; training by FLOP/s / 6N (8N with activation checkpointing, which recomputes the forward).

``generation``: the same prompts (the job's first turns, rendered with its chat template and tools), generated
with the job's sampling settings (temperature 1) for exactly ``--new_tokens`` tokens (EOS ignored, so that every
option decodes the same number of steps), for each option, round-robin ``--repeat`` times (paired, back to back;
the median is kept): dynamic KV cache (what TRL uses; fp32), ``cache_implementation="static"``, bf16 weights,
``torch.compile`` of the forward over a static cache, and each ``--batches`` size (all rollouts of one or more steps
in one ``generate``), and, where vLLM imports (its CPU build's own venv: docs/engines.md), vLLM's engine in this
process at bf16 and fp32 for each batch size. The load average is printed before and after: the machine may be
shared.

``evaluation`` (not part of ``both``): the job's held-out evaluation (every held-out question, ``eval_num_samples``
tool rollouts each, its batch size, seeds and budget) of the model, each turn re-encoding the whole conversation (as
TRL's loop does) and continuing the batch's KV cache (``trl_rlvr.evaluation.cached_turns``, the evaluation's
default), round-robin ``--repeat`` times: seconds (median), tokens the model was fed (forward inputs, padding
included) and generated, and how many rollouts are token for token the same both ways.

With ``-- --use_vllm true --vllm_mode colocate`` the step generates on the trainer's colocated vLLM engine; its
generate calls and its weight sync are timed instead of the model's ``generate`` ("rest" then holds the policy's
log-probability pass TRL makes for its importance-sampling correction).

``--smoke``: a tiny random model with ChatML tokens (``trl_rlvr.testing.build_tiny_chatml_model``), one step, two
options and a small evaluation both ways, seconds. Numbers quoted in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks._status import finish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def tool_job():
    """The tool job's public pieces (:mod:`trl_rlvr.tasks.tool_arithmetic`, what examples/tool_r1.py composes)."""
    from trl_rlvr.tasks import tool_arithmetic

    return tool_arithmetic


# ------------------------------------------------------------------------------------------------ the machine
def machine_limits(threads: int, seconds: float = 1.0) -> dict:
    """Measured matmul FLOP/s (fp32, 2048^3, best of a few) and copy bandwidth (256 MiB, bytes read + written)."""
    import torch

    torch.set_num_threads(threads)
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end or best == float("inf"):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    flops = 2 * n**3 / best
    src = torch.ones(64 << 20)  # 256 MiB of fp32
    dst = torch.empty_like(src)
    dst.copy_(src)
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end or best == float("inf"):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    bandwidth = 2 * src.numel() * src.element_size() / best
    return {"threads": threads, "matmul_flops": flops, "copy_bandwidth_bytes": bandwidth}


def model_limits(model, machine: dict, batch: int, activation_checkpointing: bool) -> dict:
    """Generation and training tokens/s bounds for ``model`` on ``machine`` (module docstring)."""
    n = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    per_token_gen = 2 * n
    per_token_train = (8 if activation_checkpointing else 6) * n
    memory_bound = batch * machine["copy_bandwidth_bytes"] / weight_bytes
    compute_bound = machine["matmul_flops"] / per_token_gen
    return {"params": n, "weight_bytes": weight_bytes, "batch": batch,
            "gen_tokens_s_memory_bound": memory_bound, "gen_tokens_s_compute_bound": compute_bound,
            "gen_tokens_s_limit": min(memory_bound, compute_bound),
            "train_tokens_s_limit": machine["matmul_flops"] / per_token_train}


# ------------------------------------------------------------------------------------------------ the step
class Parts:
    """Seconds and counts of the parts of a step, filled by the wrappers."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.seconds = {"generation": 0.0, "tool": 0.0, "forward_backward": 0.0, "weight_sync": 0.0}
        self.counts = {"generated_tokens": 0, "generate_calls": 0, "tool_calls": 0, "training_tokens": 0,
                       "loss_tokens": 0}

    @contextlib.contextmanager
    def timing(self, part):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[part] += time.perf_counter() - t


def new_tokens(out, prompt_len: int, eos_ids: set[int]) -> int:
    """Tokens each row generated, up to and including its first EOS."""
    total = 0
    for row in out[:, prompt_len:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        total += cut
    return total


def instrument(trainer, parts: Parts, environment_class):
    """Wrap, on these instances (and the environment class), the calls whose time is a part of the step. -> a
    function that puts the environment class's own methods back."""
    import functools

    model = trainer.model
    eos = trainer.eos_token_ids if hasattr(trainer, "eos_token_ids") else trainer.processing_class.eos_token_id
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos])
    engine = getattr(trainer, "vllm_generation", None) if trainer.args.use_vllm else None
    undo = []  # puts module functions wrapped here back
    if engine is None:
        generate = model.generate

        def timed_generate(*args, **kwargs):
            with parts.timing("generation"):
                out = generate(*args, **kwargs)
            parts.counts["generate_calls"] += 1
            parts.counts["generated_tokens"] += new_tokens(out, kwargs["input_ids"].shape[1], eos_ids)
            return out

        model.generate = timed_generate
    else:  # vLLM's engine generates (the model's own generate is never called); it stops at EOS, as counted above
        engine_generate = engine.generate

        def timed_engine_generate(*args, **kwargs):
            with parts.timing("generation"):
                out = engine_generate(*args, **kwargs)
            parts.counts["generate_calls"] += 1
            parts.counts["generated_tokens"] += sum(len(ids) for ids in out[1])
            return out

        engine.generate = timed_engine_generate
        sync_weights = engine.sync_weights  # the policy's weights pushed into the engine once per step

        def timed_sync(*args, **kwargs):
            with parts.timing("weight_sync"):
                return sync_weights(*args, **kwargs)

        engine.sync_weights = timed_sync
        from trl_rlvr._compat import grpo_adapter  # an engine on a CPU is synced through vLLM's reload path instead

        sync_on_cpu = grpo_adapter.sync_weights_on_cpu

        def timed_sync_on_cpu(*args, **kwargs):
            with parts.timing("weight_sync"):
                return sync_on_cpu(*args, **kwargs)

        grpo_adapter.sync_weights_on_cpu = timed_sync_on_cpu
        undo.append(lambda: setattr(grpo_adapter, "sync_weights_on_cpu", sync_on_cpu))

    compute_loss = trainer.compute_loss

    def timed_loss(model, inputs, *args, **kwargs):
        with parts.timing("forward_backward"):
            loss = compute_loss(model, inputs, *args, **kwargs)
        parts.counts["training_tokens"] += int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
        parts.counts["loss_tokens"] += int((inputs["completion_mask"] * inputs.get("tool_mask", 1)).sum())
        return loss

    trainer.compute_loss = timed_loss
    backward = trainer.accelerator.backward

    def timed_backward(loss, **kwargs):
        with parts.timing("forward_backward"):
            return backward(loss, **kwargs)

    trainer.accelerator.backward = timed_backward

    # a turn's first python call sends the turn's cells ahead (_dispatch_call) within its own time
    originals = {name: getattr(environment_class, name) for name in ("python",)}
    for name, original in originals.items():

        @functools.wraps(original)
        def wrapped(self, *args, _original=original, _name=name, **kwargs):
            with parts.timing("tool"):
                result = _original(self, *args, **kwargs)
            if _name == "python":
                parts.counts["tool_calls"] += 1
            return result

        setattr(environment_class, name, wrapped)

    def restore():
        for name, original in originals.items():
            setattr(environment_class, name, original)
        for undo_one in undo:
            undo_one()

    return restore


def cold_start_checkpoint(example, script_args, training_args, base_path, cache_dir: Path) -> Path:
    """The example's cold start (its SFT on its traces), made once under ``cache_dir``."""
    out = cache_dir / f"cold_start_seed{training_args.seed}_traces{script_args.sft_traces}"
    if (out / "config.json").is_file():
        print(f"cold start: reusing {out}", flush=True)
        return out
    from transformers.utils import get_json_schema

    from reward_plugins.code_sandbox import PythonEnvironment

    tokenizer = example.tool_tokenizer(base_path, script_args.chat_template)
    t = time.perf_counter()
    example.cold_start(base_path, tokenizer, script_args, training_args, out, [get_json_schema(PythonEnvironment.python)])
    print(f"cold start: {time.perf_counter() - t:.0f} s -> {out}", flush=True)
    return out


def measure_step(args, example, job_args: list[str]) -> tuple[dict, object]:
    import torch
    from transformers import TrainerCallback

    from reward_plugins.code_sandbox import PythonEnvironment
    from trl_rlvr.scripts.models import resolve_model_path

    script_args, training_args, _ = example.parse_args(job_args)
    training_args.model_init_kwargs = {"dtype": "float32"}
    example.vllm_cpu_defaults(training_args)
    base_path = resolve_model_path(args.model if args.smoke else None)
    start_path = Path(args.model) if (args.model and not args.smoke) else (
        cold_start_checkpoint(example, script_args, training_args, base_path, Path(args.cache_dir))
        if script_args.sft_traces else Path(base_path))
    tokenizer = example.tool_tokenizer(start_path, script_args.chat_template)
    tokenizer.truncation_side = "left"
    rows = example.tool_rows(example.question_rows(script_args)[0], script_args.system_prompt)
    trainer = example.build_rl_trainer(start_path, tokenizer, script_args, training_args, rows, tool=True)
    parts = Parts()
    restore = instrument(trainer, parts, PythonEnvironment)
    steps = []

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            parts.reset()
            self.t = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            steps.append({"wall_s": time.perf_counter() - self.t, **{f"{k}_s": v for k, v in parts.seconds.items()},
                          **parts.counts})

    trainer.add_callback(Clock())
    try:
        trainer.train()
    finally:
        restore()
    activation_checkpointing = bool(getattr(training_args, "activation_checkpointing", False))
    machine = machine_limits(torch.get_num_threads(), 0.3 if args.smoke else 1.5)
    rollouts = training_args.per_device_train_batch_size * training_args.steps_per_generation
    limits = model_limits(trainer.model, machine, rollouts, activation_checkpointing)
    for step in steps:
        wall = step["wall_s"]
        step["generated_tokens_per_s"] = step["generated_tokens"] / step["generation_s"] if step["generation_s"] else 0.0
        step["tool_calls_per_s"] = step["tool_calls"] / step["tool_s"] if step["tool_s"] else 0.0
        step["training_tokens_per_s"] = (step["training_tokens"] / step["forward_backward_s"]
                                         if step["forward_backward_s"] else 0.0)
        rest = wall - step["generation_s"] - step["tool_s"] - step["forward_backward_s"] - step["weight_sync_s"]
        step["share"] = {"generation": step["generation_s"] / wall, "tool": step["tool_s"] / wall,
                         "weight_sync": step["weight_sync_s"] / wall,
                         "forward_backward": step["forward_backward_s"] / wall, "rest": rest / wall}
    return {"model": str(start_path), "steps": steps, "machine": machine, "limits": limits,
            "rollouts_per_generation": rollouts, "activation_checkpointing": activation_checkpointing}, trainer


def print_step(result: dict) -> None:
    m, lim = result["machine"], result["limits"]
    print(f"\nmachine: {m['threads']} torch threads, matmul {m['matmul_flops'] / 1e9:.1f} GFLOP/s fp32, copy "
          f"{m['copy_bandwidth_bytes'] / 1e9:.1f} GB/s (read + write)")
    print(f"model: {lim['params'] / 1e6:.1f} M parameters, {lim['weight_bytes'] / 2**20:.0f} MiB of weights; "
          f"{lim['batch']} rollouts decoded together")
    print(f"limit, generation: {lim['gen_tokens_s_limit']:.0f} tokens/s (memory bound "
          f"{lim['gen_tokens_s_memory_bound']:.0f} = {lim['batch']} rows x bandwidth / weight bytes; compute bound "
          f"{lim['gen_tokens_s_compute_bound']:.0f} = FLOP/s / 2N)")
    print(f"limit, training: {lim['train_tokens_s_limit']:.0f} tokens/s (FLOP/s / "
          f"{8 if result['activation_checkpointing'] else 6}N)")
    for i, s in enumerate(result["steps"], 1):
        share = s["share"]
        print(f"step {i}: {s['wall_s']:.1f} s | generation {s['generation_s']:.1f} s ({share['generation']:.0%}), "
              f"{s['generated_tokens']} tokens in {s['generate_calls']} generate calls: "
              f"{s['generated_tokens_per_s']:.1f} tokens/s "
              f"({s['generated_tokens_per_s'] / lim['gen_tokens_s_limit']:.1%} of the limit) | tool "
              f"{s['tool_s']:.2f} s ({share['tool']:.1%}), {s['tool_calls']} calls: {s['tool_calls_per_s']:.1f} calls/s | "
              f"forward+backward {s['forward_backward_s']:.1f} s ({share['forward_backward']:.0%}), "
              f"{s['training_tokens']} tokens: {s['training_tokens_per_s']:.0f} tokens/s "
              f"({s['training_tokens_per_s'] / lim['train_tokens_s_limit']:.1%} of the limit) | weight sync "
              f"{s['weight_sync_s']:.1f} s ({share['weight_sync']:.0%}) | rest {share['rest']:.0%}")


# ------------------------------------------------------------------------------------------------ generation options
def first_turn_prompts(example, tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    from transformers.utils import get_json_schema

    from reward_plugins.code_sandbox import PythonEnvironment
    from trl_rlvr.tasks.word_problems import word_problem_rows

    tools = [get_json_schema(PythonEnvironment.python)]
    rows = example.tool_rows(word_problem_rows("train", n, seed=seed), example.SYSTEM_PROMPT)
    return [tokenizer.apply_chat_template(r["prompt"], tools=tools, add_generation_prompt=True, tokenize=True,
                                          return_dict=False) for r in rows]


def generate_once(model, tokenizer, prompts, new_tokens: int, config_kwargs: dict, seed: int) -> tuple[float, int]:
    import torch
    from transformers import GenerationConfig

    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    extra = dict(config_kwargs)
    compile_config = extra.pop("compile_config", None)
    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, temperature=1.0,
                              top_p=1.0, top_k=0, pad_token_id=tokenizer.pad_token_id,
                              disable_compile=compile_config is None, **extra)
    if compile_config is not None:
        config.compile_config = compile_config
    torch.manual_seed(seed)
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    took = time.perf_counter() - t
    return took, int((out.shape[1] - width) * len(prompts))


def vllm_engine(model_path: str, dtype: str, max_model_len: int = 1024):
    """vLLM's engine in this process (as TRL's colocate mode runs it), or None where vLLM does not import."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process, as colocate mode
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    try:
        from vllm import LLM
    except ImportError:
        return None
    return LLM(model=model_path, dtype=dtype, seed=0, max_model_len=max_model_len, max_num_batched_tokens=4096)


def vllm_generate_once(llm, prompts, new_tokens: int, seed: int) -> tuple[float, int]:
    """One batch through vLLM with the job's sampling (temperature 1, no top-p/top-k), exactly `new_tokens` each."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True, temperature=1.0,
                            top_p=1.0, top_k=0, seed=seed, logprobs=0)  # logprobs as TRL asks (its IS correction)
    t = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    took = time.perf_counter() - t
    return took, sum(len(o.outputs[0].token_ids) for o in outs)


def generation_options(model_path, example, tokenizer, batches: list[int], new_tokens: int, repeat: int,
                       smoke: bool) -> list[dict]:
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    fp32 = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    prompts = first_turn_prompts(example, tokenizer, max(batches))

    def hf(model, kw):
        return lambda rows, seed: generate_once(model, tokenizer, rows, new_tokens, kw, seed)

    options = []  # (label, batch, run(rows, seed) -> (seconds, tokens))
    for b in batches:
        options.append((f"dynamic cache, fp32, batch {b} (TRL's default)", b, hf(fp32, {})))
        options.append((f"static cache, fp32, batch {b}", b, hf(fp32, {"cache_implementation": "static"})))
    if not smoke:
        bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
        options.append((f"dynamic cache, bf16, batch {batches[0]}", batches[0], hf(bf16, {})))
        from transformers import CompileConfig

        compile_config = CompileConfig(fullgraph=False, dynamic=False)
        compile_config._compile_all_devices = True  # transformers compiles on GPUs only unless told
        options.append((f"static cache + torch.compile, fp32, batch {batches[0]}", batches[0],
                        hf(fp32, {"cache_implementation": "static", "compile_config": compile_config})))
    threads = torch.get_num_threads()
    for dtype in () if smoke else ("bfloat16", "float32"):  # (vLLM's CPU attention needs a real model's head size)
        llm = vllm_engine(str(model_path), dtype)
        if llm is None:
            print("vLLM does not import here: its options are left out (they run in the vLLM venv, docs/engines.md)")
            break
        for b in batches:
            options.append((f"vLLM CPU engine, {dtype}, batch {b}", b,
                            lambda rows, seed, llm=llm: vllm_generate_once(llm, rows, new_tokens, seed)))
    torch.set_num_threads(threads)  # vLLM's CPU worker binds its own OpenMP threads: the HF options keep theirs
    results = {label: [] for label, *_ in options}
    warm = {}
    for label, b, run in options:  # warm-up (and compilation) outside the timed rounds
        try:
            warm[label] = run(prompts[:b], 0)[0]
        except Exception as e:  # noqa: BLE001 - an option that does not run here is reported, not fatal
            warm[label] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    for r in range(repeat):
        for label, b, run in options if r % 2 == 0 else options[::-1]:
            if isinstance(warm[label], str):
                continue
            took, tokens = run(prompts[:b], r + 1)
            results[label].append(tokens / took)
    out = []
    for label, b, _ in options:
        rates = results[label]
        out.append({"option": label, "batch": b, "warmup_s": warm[label],
                    "tokens_per_s": statistics.median(rates) if rates else None, "runs": rates})
    return out


def heldout_tool_rollouts(example, model, tokenizer, script_args, training_args, rows, *, reuse_cache: bool = True):
    """The job's held-out tool rollouts of ``rows`` as its evaluation makes them (samples per question, batch size,
    seed, budget, tool calls, the sandboxed tool), with HF ``generate`` on ``model``."""
    from trl_rlvr.evaluation import tool_rollouts

    return tool_rollouts.generate_tool_completions(
        model, tokenizer, [r["prompt"] for r in rows], list(range(len(rows))), script_args.eval_num_samples,
        rows=rows, environment_factory=example.tool_environment(script_args), temperature=training_args.temperature,
        max_new_tokens=training_args.max_completion_length, seed=training_args.seed,
        batch_size=script_args.eval_batch_size, chat_template=tool_rollouts.tool_chat_template(tokenizer),
        max_tool_calling_iterations=training_args.max_tool_calling_iterations, reuse_cache=reuse_cache)


def evaluation_both_ways(model_path, example, job_args: list[str], repeat: int) -> dict:
    """The job's held-out tool rollouts, re-encoding every turn and continuing the cache, paired (``--part
    evaluation``)."""
    import torch
    from transformers import AutoModelForCausalLM

    script_args, training_args, _ = example.parse_args(job_args)
    tokenizer = example.tool_tokenizer(model_path, script_args.chat_template)
    rows = example.tool_rows(example.question_rows(script_args)[1], script_args.system_prompt)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    fed = [0]
    model.register_forward_pre_hook(lambda m, a, kw: fed.__setitem__(0, fed[0] + kw["input_ids"].numel()),
                                    with_kwargs=True)
    ways = {"re-encode every turn": False, "continue the cache": True}
    runs: dict[str, list] = {name: [] for name in ways}
    for _ in range(repeat):
        for name, reuse in ways.items():
            fed[0] = 0
            start = time.perf_counter()
            groups = heldout_tool_rollouts(example, model, tokenizer, script_args, training_args, rows,
                                           reuse_cache=reuse)
            runs[name].append({"seconds": time.perf_counter() - start, "fed_tokens": fed[0],
                               "ids": [s[1] for g in groups for s in g]})
            print(f"  {name}: {runs[name][-1]['seconds']:.1f} s, {fed[0]} tokens fed", flush=True)
    base, cached = (runs[name][0]["ids"] for name in ways)
    return {
        "model": str(model_path), "rollouts": len(base), "same_rollouts": sum(a == b for a, b in zip(base, cached)),
        "generated_tokens": sum(map(len, cached)),
        "ways": {name: {"seconds": statistics.median(r["seconds"] for r in rs), "seconds_all": [r["seconds"] for r in rs],
                        "fed_tokens": rs[0]["fed_tokens"]} for name, rs in runs.items()},
    }


def print_evaluation(result: dict) -> None:
    print(f"evaluation of {result['model']}: {result['rollouts']} tool rollouts, {result['generated_tokens']} "
          f"generated tokens; the same token for token both ways: {result['same_rollouts']} of {result['rollouts']}")
    base = result["ways"]["re-encode every turn"]["seconds"]
    for name, way in result["ways"].items():
        print(f"  {name:<22} {way['seconds']:>7.1f} s  {base / way['seconds']:>5.2f}x  {way['fed_tokens']:>8} tokens fed")


def print_options(rows: list[dict], new_tokens: int) -> None:
    base = next((r["tokens_per_s"] for r in rows if r["tokens_per_s"]), None)
    print(f"\ngeneration options ({new_tokens} new tokens per row, EOS ignored; median of the paired runs):")
    for r in rows:
        if r["tokens_per_s"] is None:
            print(f"  {r['option']:55s} {r['warmup_s']}")
            continue
        print(f"  {r['option']:55s} {r['tokens_per_s']:8.1f} tokens/s  x{r['tokens_per_s'] / base:.2f}  "
              f"(first call {r['warmup_s']:.1f} s; runs {', '.join(f'{x:.0f}' for x in r['runs'])})")


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("step", "generation", "both", "evaluation"), default="both")
    parser.add_argument("--model", default=None, help="the RL start (default: the example's cold start, made once)")
    parser.add_argument("--cache_dir", default=str(Path(tempfile.gettempdir()) / "tool_rl_throughput"))
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--new_tokens", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--save", default=None)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("extra", nargs="*", help="more arguments of examples/tool_r1.py (after --)")
    args = parser.parse_args(argv)
    print("$ python -m benchmarks.tool_rl_throughput " + " ".join(sys.argv[1:] if argv is None else argv))
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} on "
          f"{len(os.sched_getaffinity(0))} cores", flush=True)
    example = tool_job()
    out_dir = tempfile.mkdtemp(prefix="tool_rl_throughput_")
    job = ["--output_dir", out_dir, "--max_steps", str(args.steps), "--plot", "false", "--save_model", "false"]
    batches = [int(b) for b in args.batches.split(",")]
    if args.smoke:
        from trl_rlvr.testing import build_tiny_chatml_model

        args.model = str(build_tiny_chatml_model(Path(out_dir) / "tiny_model"))
        job += ["--model_name_or_path", args.model, "--sft_traces", "0", "--num_train_samples", "8",
                "--max_completion_length", "24", "--overlong_buffer_length", "8", "--num_generations", "4",
                "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
                "--max_sampling_rounds", "1", "--num_eval_samples", "3", "--num_eval_training_wordings", "3",
                "--eval_num_samples", "2"]
        batches, args.new_tokens, args.repeat = [4, 8], 8, 1
    job += args.extra
    failures, result = [], {"command": "python -m benchmarks.tool_rl_throughput " + " ".join(argv or sys.argv[1:])}
    model_path = args.model
    if args.part in ("step", "both"):
        step, trainer = measure_step(args, example, job)
        result["step"] = step
        print_step(step)
        model_path = step["model"]
        tokenizer = trainer.processing_class
        del trainer
        if not step["steps"]:
            failures.append("no step was timed")
        elif not args.smoke and not step["steps"][-1]["generated_tokens"]:
            failures.append("the step generated nothing")
    if args.part in ("generation", "both", "evaluation") and model_path is None:
        script_args, training_args, _ = example.parse_args(job)
        from trl_rlvr.scripts.models import resolve_model_path

        model_path = str(cold_start_checkpoint(example, script_args, training_args, resolve_model_path(None),
                                               Path(args.cache_dir)))
    if args.part == "evaluation" or (args.smoke and args.part == "both"):
        evaluation = evaluation_both_ways(model_path, example, job, args.repeat)
        result["evaluation"] = evaluation
        print_evaluation(evaluation)
        if not evaluation["generated_tokens"]:
            failures.append("the evaluation generated nothing")
    if args.part in ("generation", "both"):
        tokenizer = example.tool_tokenizer(model_path, str(example.TEMPLATE))
        rows = generation_options(model_path, example, tokenizer, batches, args.new_tokens, args.repeat, args.smoke)
        result["generation"] = rows
        print_options(rows, args.new_tokens)
        if not any(r["tokens_per_s"] for r in rows):
            failures.append("no generation option ran")
    load_after = os.getloadavg()
    result.update(load_before=load_before, load_after=load_after)
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=1, default=str))
    return finish("tool_rl_throughput", failures)


if __name__ == "__main__":
    sys.exit(main())
