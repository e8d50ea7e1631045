"""One-GPU check of the engines the README advertises, in one table (about 3-5 minutes on one GPU).

    bash benchmarks/gpu_check.sh --model MODEL_DIR [--vllm-python PY]   # a machine with one GPU
    bash benchmarks/gpu_check.sh --cpu-smoke [--vllm-python PY]         # dry run on a CPU, tiny random model
    bash benchmarks/gpu_check.sh --tiny --only qlora zero2              # a GPU without the model: tiny random model

MODEL_DIR is a local SmolLM2-135M(-Instruct) checkpoint, e.g. the directory `trl_rlvr.scripts.models.smollm2_checkpoint()`
writes (the GPU machine may have no internet). `--vllm-python` is the interpreter of an environment with vLLM
(vLLM pins its own torch, so it often lives in a venv of its own); default: this one.

Checks, each in its own process with a time bound:
- qlora: the model in bitsandbytes nf4 4-bit + LoRA r16 on all linear layers, RLVRTrainer, 16 answers x 64 tokens
  per step, 3 steps: median time of steps 2-3 and peak memory (GPU: max allocated; CPU: max RSS).
- vllm: RLVRTrainer with `use_vllm=True, vllm_mode="colocate"`, 2 steps of 64 answers x 128 tokens: generated
  tokens per second inside vLLM's generate (first call left out as warm-up), engine start time; fails unless
  every batch came from vLLM.
- zero2: `accelerate launch --config_file examples/accelerate/deepspeed_zero2.yaml --num_processes 1`, 2 steps
  with dynamic sampling: step time; fails unless the DeepSpeed engine reports ZeRO stage 2.
`--tiny` runs the checks on the GPU with a tiny random model (a GPU machine that cannot fetch SmolLM2): it proves
the engines run and train on CUDA, its times are not SmolLM2's. Before anything runs, every precondition of the
checks asked for (`--only`) is checked (GPU, model directory, bitsandbytes, peft, deepspeed, vLLM in the vLLM
interpreter); when one is missing the script lists all of them and exits with status 2. A check that fails
is marked FAILED in the table with its error, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from transformers import TrainerCallback

REPO = Path(__file__).resolve().parent.parent
ZERO2_CONFIG = REPO / "examples" / "accelerate" / "deepspeed_zero2.yaml"
TIME_LIMITS = {"qlora": 180, "vllm": 300, "zero2": 180}  # seconds on a GPU; x4 for --cpu-smoke
SMOKE_SLOWDOWN = 4


# ------------------------------------------------------------------------------------------------ the checks
def shapes(smoke: bool) -> dict:
    """Batch shapes per check: real ones on a GPU, small ones for the CPU dry run."""
    if smoke:
        return {"qlora": (8, 4, 16), "vllm": (8, 4, 16), "zero2": (8, 4, 16)}  # answers, group size, tokens
    return {"qlora": (16, 8, 64), "vllm": (64, 8, 128), "zero2": (16, 8, 64)}


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step (generation included)."""

    def __init__(self):
        self.times, self._last = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self._last = self._last or time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.times.append(now - self._last)
        self._last = now


def build_trainer(model, tokenizer, smoke: bool, shape: tuple[int, int, int], peft_config=None, **overrides):
    """RLVRTrainer on arithmetic problems with `boxed_math`; `shape` = (answers per step, group size, tokens)."""
    from trl_rlvr import RLVRConfig, RLVRTrainer
    from trl_rlvr.scripts.data import arithmetic_dataset

    answers, group, tokens = shape
    settings = dict(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=answers, num_generations=group,
        max_completion_length=tokens, learning_rate=1e-5, max_steps=2, bf16=not smoke, use_cpu=smoke,
        gradient_checkpointing=False, loss_normalization="per_batch_token", report_to="none", logging_steps=1,
        save_strategy="no", disable_tqdm=True, seed=0,
    )
    settings.update(overrides)
    return RLVRTrainer(model=model, reward_funcs=["boxed_math"], args=RLVRConfig(**settings),
                       train_dataset=arithmetic_dataset(tokenizer, n_train=64, n_eval=1)["train"],
                       processing_class=tokenizer, peft_config=peft_config)


def peak_memory_gib() -> float:
    import resource

    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def check_qlora(model_dir: str, smoke: bool) -> dict:
    import bitsandbytes as bnb
    from peft import LoraConfig

    from trl_rlvr.scripts.models import load_model_and_tokenizer

    shape = shapes(smoke)["qlora"]
    model, tokenizer, _ = load_model_and_tokenizer(model_dir, dtype="float32" if smoke else "bfloat16",
                                                   load_in_4bit=True, quiet=True)
    four_bit = sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    if four_bit == 0:
        raise RuntimeError("no bitsandbytes Linear4bit layer in the loaded model: it is not 4-bit")
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = build_trainer(model, tokenizer, smoke, shape, peft_config=lora, learning_rate=1e-4, max_steps=3)
    timer = StepTimer()
    trainer.add_callback(timer)
    trainer.train()
    return {"step_s": statistics.median(timer.times[1:]), "peak_gib": peak_memory_gib(), "linear4bit": four_bit,
            "answers_x_tokens": "{}x{}".format(shape[0], shape[2])}


def check_vllm(model_dir: str, smoke: bool) -> dict:
    from trl_rlvr._compat.vllm_cpu import runs_on_cpu
    from trl_rlvr.scripts.models import load_model_and_tokenizer

    answers, group, tokens = shape = shapes(smoke)["vllm"]
    model, tokenizer, _ = load_model_and_tokenizer(model_dir, dtype="float32" if smoke else "bfloat16", quiet=True)
    start = time.perf_counter()
    trainer = build_trainer(model, tokenizer, smoke, shape, use_vllm=True, vllm_mode="colocate",
                            vllm_gpu_memory_utilization=0.3, vllm_max_model_length=512)
    engine_start = time.perf_counter() - start
    generation = trainer.vllm_generation
    calls = []  # (generated tokens, seconds) per vLLM generate call
    generate = generation.generate

    def timed_generate(*args, **kwargs):
        t0 = time.perf_counter()
        out = generate(*args, **kwargs)
        calls.append((sum(len(ids) for ids in out[1]), time.perf_counter() - t0))
        return out

    def no_hf_generate(*args, **kwargs):
        raise RuntimeError("the training model's generate was called: vLLM was not used")

    generation.generate = timed_generate
    trainer.model.generate = no_hf_generate
    timer = StepTimer()
    trainer.add_callback(timer)
    trainer.train()
    if len(calls) < 2:
        raise RuntimeError(f"vLLM generated {len(calls)} times in 2 steps")
    timed = calls[1:]  # the first call warms up
    return {"tokens_per_s": sum(n for n, _ in timed) / sum(t for _, t in timed), "engine_start_s": engine_start,
            "step_s": statistics.median(timer.times), "engine_on_cpu": runs_on_cpu(generation),
            "answers_x_tokens": f"{answers}x{tokens}"}


def check_zero2(model_dir: str, smoke: bool) -> dict:
    from trl_rlvr.scripts.models import load_model_and_tokenizer

    if smoke:  # accelerate only applies a DeepSpeed config to processes on an accelerator (tests/harness/engine_launch.py)
        from tests.harness.engine_launch import allow_engines_on_cpu

        allow_engines_on_cpu()
    answers, group, tokens = shape = shapes(smoke)["zero2"]
    model, tokenizer, _ = load_model_and_tokenizer(model_dir, dtype="float32" if smoke else "bfloat16", quiet=True)
    trainer = build_trainer(model, tokenizer, smoke, shape, dynamic_sampling=True, use_cpu=False)
    timer = StepTimer()
    trainer.add_callback(timer)
    trainer.train()
    engine = trainer.model_wrapped
    stage = engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else None
    if stage != 2:
        raise RuntimeError(f"not ZeRO-2: distributed type {trainer.accelerator.distributed_type}, "
                           f"model {type(engine).__name__}, stage {stage}")
    rounds = [h["rlvr/sampling_rounds"] for h in trainer.state.log_history if "rlvr/sampling_rounds" in h]
    return {"step_s": statistics.median(timer.times), "zero_stage": stage, "sampling_rounds": rounds,
            "peak_gib": peak_memory_gib(), "answers_x_tokens": f"{answers}x{tokens}"}


CHECKS = {"qlora": check_qlora, "vllm": check_vllm, "zero2": check_zero2}


# ------------------------------------------------------------------------------------------------ the driver
def missing_pieces(model_dir: str | None, smoke: bool, vllm_python: str, checks=tuple(CHECKS),
                   tiny: bool = False) -> list[str]:
    """Every precondition of ``checks`` that is not met, in words (empty when all are)."""
    missing = []
    if not smoke:
        import torch

        if not torch.cuda.is_available():
            missing.append("no CUDA GPU visible to torch (use --cpu-smoke for the CPU dry run)")
        if model_dir is None and not tiny:
            missing.append("--model MODEL_DIR is required (a local SmolLM2-135M checkpoint directory; or --tiny)")
        elif model_dir is not None and not (Path(model_dir) / "config.json").is_file():
            missing.append(f"--model {model_dir}: no config.json there (not a checkpoint directory)")
    needs = {"qlora": [("bitsandbytes", "quantization"), ("peft", "")], "zero2": [("deepspeed", "deepspeed")]}
    for module, extra in [need for check in checks for need in needs.get(check, [])]:
        if not _importable(sys.executable, module):
            missing.append(f"{module} is not installed in {sys.executable}"
                           + (f" (pip install -e '.[{extra}]')" if extra else ""))
    if "vllm" in checks:
        missing += _vllm_missing(vllm_python)
    if shutil.which("nvidia-smi") is None and not smoke:
        missing.append("nvidia-smi not found (no NVIDIA driver?)")
    return missing


def _vllm_missing(vllm_python: str) -> list[str]:
    if not _importable(vllm_python, "vllm"):
        return [f"vllm is not importable by {vllm_python} (choose an interpreter with --vllm-python)"]
    imports = "import trl_rlvr.trainer, trl_rlvr._compat.vllm_cpu, reward_plugins.boxed_math"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    failed = subprocess.run([vllm_python, "-c", imports], capture_output=True, text=True, env=env)
    if failed.returncode != 0:
        error = (failed.stderr.strip().splitlines() or ["?"])[-1]
        return [f"{vllm_python} cannot import trl_rlvr ({error}): pip install -e . there"]
    return []


def _importable(python: str, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True).returncode == 0
    except OSError:  # no such interpreter (a mistyped --vllm-python): said as "not importable by PY"
        return False


def _free_port() -> int:
    from tests.harness.launch import free_port  # the launch helper the tests use

    return free_port()


def check_command(name: str, model_dir: str, smoke: bool, vllm_python: str, out: Path) -> tuple[list[str], dict]:
    own = [__file__, "--run-check", name, "--model", model_dir, "--result", str(out)] + (["--cpu-smoke"] * smoke)
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)  # keep the caller's
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path}
    if smoke:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if name == "vllm":
        return [vllm_python, *own], env
    if name == "zero2":
        if smoke:
            env["ACCELERATE_TORCH_DEVICE"] = "cpu"
            env.pop("ACCELERATE_USE_CPU", None)
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ZERO2_CONFIG),
                  "--num_processes", "1", "--mixed_precision", "no" if smoke else "bf16",
                  "--main_process_port", str(_free_port())]
        return [*launch, *own], env
    return [sys.executable, *own], env


def run_check(name: str, model_dir: str, smoke: bool, vllm_python: str, workdir: Path) -> dict:
    out = workdir / f"{name}.json"
    cmd, env = check_command(name, model_dir, smoke, vllm_python, out)
    limit = TIME_LIMITS[name] * (SMOKE_SLOWDOWN if smoke else 1)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {limit} s", "wall_s": limit}
    wall = time.perf_counter() - start
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
        return {"ok": False, "error": "\n".join(tail) or f"exit status {proc.returncode}", "wall_s": wall}
    return {"ok": True, "wall_s": wall, **json.loads(out.read_text())}


def table(results: dict, smoke: bool, model: str, tiny: bool = False) -> str:
    def fmt(r: dict, key: str, spec: str = ".2f") -> str:
        return format(r[key], spec) if key in r else "-"

    def status(r: dict) -> str:
        return "skipped" if r.get("skipped") else "ok" if r["ok"] else "FAILED"

    rows = [("check", "status", "numbers", "wall s")]
    q, v, z = results["qlora"], results["vllm"], results["zero2"]
    rows.append(("QLoRA nf4 + LoRA r16", status(q),
                 f"step {fmt(q, 'step_s')} s, peak {fmt(q, 'peak_gib')} GiB, {q.get('linear4bit', '-')} 4-bit layers, "
                 f"{q.get('answers_x_tokens', '-')}" if status(q) == "ok" else "", f"{q['wall_s']:.0f}"))
    rows.append(("vLLM colocate", status(v),
                 f"{fmt(v, 'tokens_per_s', '.0f')} tokens/s, engine start {fmt(v, 'engine_start_s', '.0f')} s, "
                 f"step {fmt(v, 'step_s')} s, {v.get('answers_x_tokens', '-')}" if status(v) == "ok" else "",
                 f"{v['wall_s']:.0f}"))
    rows.append(("ZeRO-2 + dynamic sampling", status(z),
                 f"stage {z.get('zero_stage')}, step {fmt(z, 'step_s')} s, rounds {z.get('sampling_rounds')}, "
                 f"peak {fmt(z, 'peak_gib')} GiB, {z.get('answers_x_tokens', '-')}" if status(z) == "ok" else "",
                 f"{z['wall_s']:.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    where = "CPU smoke, tiny random model" if smoke else "GPU, tiny random model (not SmolLM2's times)" if tiny else "GPU"
    lines = [f"gpu_check ({where}; model {model})"]
    for i, row in enumerate(rows):
        lines.append(" | ".join(cell.ljust(w) for cell, w in zip(row, widths)))
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths))
    for name, r in results.items():
        if not r["ok"]:
            lines.append(f"\n{name} FAILED:\n{r['error']}")
    return "\n".join(lines)


def tiny_model(workdir: Path) -> str:
    from trl_rlvr.testing import build_tiny_model

    return str(build_tiny_model(workdir / "tiny", hidden_size=256))  # vLLM's CPU attention: head size 64


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="local checkpoint directory (SmolLM2-135M)")
    parser.add_argument("--cpu-smoke", action="store_true", help="dry run on a CPU with a tiny random model")
    parser.add_argument("--tiny", action="store_true", help="on the GPU, a tiny random model instead of --model")
    parser.add_argument("--smoke", action="store_true",
                        help="what .ci/run calls: the checks on a GPU (with --model), else skipped (exit 77), saying why")
    parser.add_argument("--vllm-python", default=sys.executable, help="python of an environment with vLLM")
    parser.add_argument("--only", nargs="+", choices=list(CHECKS), default=list(CHECKS))
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--run-check", choices=list(CHECKS), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.run_check:  # inside one check's own process
        result = CHECKS[args.run_check](args.model, args.cpu_smoke)
        if int(os.environ.get("RANK", "0")) == 0:
            Path(args.result).write_text(json.dumps(result))
        return 0

    if args.smoke:
        import torch

        from benchmarks._status import skip

        if not torch.cuda.is_available():
            return skip("benchmarks.gpu_check", "needs a GPU (CPU dry run, with vLLM installed: bash "
                        "benchmarks/gpu_check.sh --cpu-smoke --vllm-python PY)")
        if not args.model:
            return skip("benchmarks.gpu_check", "on a GPU it needs --model DIR (a local SmolLM2-135M checkpoint)")
    missing = missing_pieces(args.model, args.cpu_smoke, args.vllm_python, args.only, args.tiny)
    if missing:
        print("gpu_check cannot run; missing:\n- " + "\n- ".join(missing), file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    model = args.model or tiny_model(workdir)
    results = {name: {"ok": True, "wall_s": 0.0, "skipped": True} for name in CHECKS}
    for name in args.only:
        print(f"[gpu_check] {name} ...", file=sys.stderr, flush=True)
        results[name] = run_check(name, model, args.cpu_smoke, args.vllm_python, workdir)
    print(table(results, args.cpu_smoke, model, tiny=args.tiny and not args.model))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
