"""Where the memory of an RLVR run goes: peak RSS per phase and per training step, ours against plain TRL.

    python -m benchmarks.memory                      # the main job's phases on SmolLM2 + the growth sweeps
    python -m benchmarks.memory --smoke              # the same on the tiny model (minutes); non-zero on failure
    python -m benchmarks.memory --case main --steps 2 --eval-questions 20 [--model smollm2] [--trl]
    python -m benchmarks.memory --case sweep --model tiny --lengths 64 128 256 512 --groups 4 8 16
    python -m benchmarks.memory --case sweep --lengths 200 --groups 4 --batch 32 --grad-accum 8 --checkpointing \
        --cpu-tile 0                                 # one step of the tool job's shape, TRL's LM-head tile on a CPU

Every case runs in a fresh subprocess (RSS is per process). Peaks come from the kernel's own high-water mark
(``VmHWM`` in /proc/self/status, reset per phase through /proc/self/clear_refs), so no short spike is missed
by sampling; a nested phase folds its peak into every enclosing one. Between phases the heap is trimmed
(glibc ``malloc_trim(0)``) as the main job does, so "end" is what the phase kept, not what the allocator cached.

What is reported for a training step (one optimizer step of TRL's ``training_step`` plus the generation that
feeds it): the peak of the whole step and of its parts -- generation, rewards, the loss forward, TRL's fused
LM head (forward and backward: its ``[4096 tokens x 32768 vocabulary]`` fp32 tiles, never the full
``B x T x V`` logits; on a CPU RLVRTrainer's tiles are 256 tokens, ``--cpu-tile``), the backward, the optimizer
step -- and, counted exactly, the bytes of weights, gradients, AdamW state and of the activations autograd saves
for the backward (``saved_tensors_hooks``). ``--case main`` runs ``examples/r1zero.py``'s own ``main`` (its phases
and settings, the command line after ``--`` forwarded to it); ``--trl`` swaps ``RLVRTrainer`` for a plain
``GRPOTrainer`` with the same ``RLVRConfig`` (TRL's algorithm: no dynamic sampling), so that ours/TRL's is a ratio
of like with like.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
MB = 2**20


# ------------------------------------------------------------------------------------------------ measuring
def _status_kb(field: str, pid: str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    return int(match.group(1)) if match else 0


def rss_mb() -> float:
    return _status_kb("VmRSS") / 1024


def children_rss_mb() -> float:
    """RSS of every descendant (reward worker pools, sandboxes), summed."""
    import psutil

    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:  # it exited while we looked
            pass
    return total / MB


def trim() -> None:
    """gc.collect() and glibc's malloc_trim(0): give freed heap back to the OS, so RSS shows what is live."""
    from trl_rlvr.evaluation import release_memory

    release_memory()


class Peaks:
    """Peak RSS per named phase from the kernel's high-water mark; phases may nest and repeat."""

    def __init__(self):
        self.records: list[dict] = []
        self._open: list[dict] = []

    def _fold(self) -> None:
        hwm = _status_kb("VmHWM") / 1024
        for rec in self._open:
            rec["peak_mb"] = max(rec["peak_mb"], hwm)

    def _reset(self) -> None:
        self._fold()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS

    @contextlib.contextmanager
    def phase(self, name: str, trim_around: bool = False, **info):
        if trim_around:
            trim()
        self._reset()
        rec = {"phase": name, "start_mb": rss_mb(), "peak_mb": rss_mb(), **info}
        self._open.append(rec)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            yield rec
        finally:
            self._fold()
            self._open.remove(rec)
            rec["seconds"] = round(time.perf_counter() - t0, 2)
            rec["cpu_seconds"] = round(time.process_time() - c0, 2)  # all threads; less noisy than wall on a shared box
            if trim_around:
                trim()
            rec["end_mb"] = rss_mb()
            rec["children_mb"] = children_rss_mb()
            self.records.append(rec)
            print(f"[memory] {name}: start {rec['start_mb']:.0f} peak {rec['peak_mb']:.0f} end {rec['end_mb']:.0f} MB "
                  f"({rec['seconds']} s)", file=sys.stderr, flush=True)  # progress, kept if a long run is stopped


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def static_bytes(trainer) -> dict:
    """Weights, gradients and optimizer state, counted from the tensors themselves (MB)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    params = list(model.parameters())
    out = {"weights_mb": tensor_bytes(params) / MB, "grads_mb": tensor_bytes(p.grad for p in params) / MB}
    opt = getattr(trainer, "optimizer", None)
    state = [v for s in (opt.state.values() if opt is not None else []) for v in s.values() if hasattr(v, "untyped_storage")]
    out["optimizer_state_mb"] = tensor_bytes(state) / MB
    return out


def instrument(trainer, peaks: Peaks) -> dict:
    """Wrap the step's parts in phases; returns a dict the wrappers fill (saved activations per loss forward)."""
    import torch
    import trl.trainer.utils as trl_utils

    found = {"saved_activation_mb": []}
    param_ptrs = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}

    def wrap(obj, name, phase):
        original = getattr(obj, name)

        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            with peaks.phase(phase, step=trainer.state.global_step + 1):
                return original(*args, **kwargs)

        setattr(obj, name, wrapped)

    wrap(trainer, "_generate", "step: generation")
    wrap(trainer, "_calculate_rewards", "step: rewards")
    original_loss = trainer._compute_loss

    def compute_loss(model, inputs):
        saved: dict[int, int] = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in param_ptrs:
                saved[storage.data_ptr()] = storage.nbytes()
            return t

        with peaks.phase("step: loss forward", step=trainer.state.global_step + 1), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = original_loss(model, inputs)
        found["saved_activation_mb"].append(sum(saved.values()) / MB)
        return loss

    trainer._compute_loss = compute_loss
    base = trl_utils._ChunkedLogProbFunction

    class ProbedHead(base):  # TRL's fused LM head, its forward and backward measured
        @staticmethod
        def forward(ctx, *args):
            with peaks.phase("step: LM head forward", step=trainer.state.global_step + 1, tokens=args[0].shape[0]):
                return base.forward(ctx, *args)

        @staticmethod
        def backward(ctx, *grads):
            with peaks.phase("step: LM head backward", step=trainer.state.global_step + 1):
                return base.backward(ctx, *grads)

    trl_utils._ChunkedLogProbFunction = ProbedHead
    original_backward = trainer.accelerator.backward

    def backward(loss, **kwargs):
        with peaks.phase("step: backward", step=trainer.state.global_step + 1):
            return original_backward(loss, **kwargs)

    trainer.accelerator.backward = backward
    trainer.add_callback(_StepCallback(trainer, peaks))
    return found


def _step_callback_class():
    from transformers import TrainerCallback

    class StepCallback(TrainerCallback):
        def __init__(self, trainer, peaks):
            self.trainer, self.peaks, self._step, self._opt = trainer, peaks, None, None
            self.static = None

        def on_step_begin(self, args, state, control, **kw):
            self._step = self.peaks.phase("training step", trim_around=True, step=state.global_step + 1)
            self._step.__enter__()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self._opt = self.peaks.phase("step: optimizer", step=state.global_step + 1)
            self._opt.__enter__()

        def on_optimizer_step(self, args, state, control, **kw):
            self._opt.__exit__(None, None, None)
            self.static = static_bytes(self.trainer)  # gradients are still there (zeroed after this callback)

        def on_step_end(self, args, state, control, **kw):
            self._step.__exit__(None, None, None)

    return StepCallback


def _StepCallback(trainer, peaks):
    return _step_callback_class()(trainer, peaks)


# ------------------------------------------------------------------------------------------------ the trainers
def plain_grpo_trainer(model, reward_funcs=None, args=None, **kwargs):
    """TRL's ``GRPOTrainer`` with the same ``RLVRConfig`` and rewards as ``RLVRTrainer`` would get (registry names
    resolved, the overlong penalty appended with its weight): TRL's algorithm, our settings."""
    import copy

    from trl import GRPOTrainer

    from trl_rlvr.trainer import trainer_reward_funcs

    funcs = trainer_reward_funcs(reward_funcs, args)
    if args.overlong_buffer_length is not None:
        args = copy.copy(args)
        weights = args.reward_weights if args.reward_weights is not None else [1.0] * (len(funcs) - 1)
        args.reward_weights = [*weights, args.overlong_penalty_factor]
    trainer = GRPOTrainer(model, funcs, args, **kwargs)
    names = trainer.reward_func_names
    trainer.success_reward_index = names.index(args.success_reward) if args.success_reward in names else 0
    return trainer


# ------------------------------------------------------------------------------------------------ cases
def tiny_model_dir() -> str:
    from trl_rlvr.testing import build_tiny_model

    path = Path(tempfile.gettempdir()) / "trl_rlvr_memory_tiny"
    if not (path / "config.json").exists():
        build_tiny_model(path)
    return str(path)


def model_path(name: str) -> str:
    return tiny_model_dir() if name == "tiny" else name


def run_r1zero(argv: list[str]):
    """``python examples/r1zero.py ARGV``, run in this process (so that its phases can be measured); returns the
    trainer its ``main`` returned."""
    import runpy

    path = ROOT / "examples" / "r1zero.py"
    saved = sys.argv
    sys.argv = [str(path), *argv]
    try:
        return runpy.run_path(str(path), run_name="__main__")["trainer"]
    finally:
        sys.argv = saved


def run_main_case(opts) -> dict:
    """examples/r1zero.py run as a program, each phase measured; ``opts.script_args`` go to its command line."""
    import trl_rlvr.evaluation as evaluation
    import trl_rlvr.trainer as trainer_module
    from trl_rlvr.evaluation import report as eval_report
    from trl_rlvr.scripts import train as recipe

    peaks = Peaks()
    built = {}
    if opts.trl:
        trainer_module.RLVRTrainer = plain_grpo_trainer
    original_build = recipe.build_trainer

    def build_trainer(*args, **kwargs):
        with peaks.phase("load: data, rewards, model, trainer"):
            trainer, data = original_build(*args, **kwargs)
        built["trainer"] = trainer
        built["probe"] = instrument(trainer, peaks)
        return trainer, data

    recipe.build_trainer = build_trainer
    original_evaluate, original_run = evaluation.evaluate, eval_report.SampledComparison.run
    calls = {"greedy": 0, "sampled": 0}

    def evaluate(*args, **kwargs):
        calls["greedy"] += 1
        with peaks.phase(f"greedy evaluation {'before' if calls['greedy'] == 1 else 'after'}", trim_around=True):
            return original_evaluate(*args, **kwargs)

    def run(self, label, *args, **kwargs):
        with peaks.phase(f"sampled evaluation ({label})", trim_around=True):
            return original_run(self, label, *args, **kwargs)

    evaluation.evaluate, eval_report.SampledComparison.run = evaluate, run
    argv = ["--model_name_or_path", model_path(opts.model), "--output_dir", opts.output_dir,
            "--max_steps", str(opts.steps), "--save_model", "false", "--plot", "false", *opts.script_args]
    if opts.eval_questions is not None:
        argv += ["--num_eval_samples", str(opts.eval_questions)]
    if opts.model == "tiny":
        argv += ["--per_device_train_batch_size", "2", "--num_generations", "4", "--max_completion_length", "32",
                 "--overlong_buffer_length", "8", "--num_train_samples", "32"]
    with peaks.phase("whole job"):
        run_r1zero(argv)
    trainer = built["trainer"]
    return {"case": "main", "trainer": "GRPOTrainer" if opts.trl else "RLVRTrainer", "model": opts.model,
            "argv": argv, "phases": peaks.records, "static": _static_from(trainer), "saved_activation_mb": built["probe"]["saved_activation_mb"],
            "history": [h for h in trainer.state.log_history if "loss" in h]}


def _static_from(trainer) -> dict | None:
    for cb in trainer.callback_handler.callbacks:
        if hasattr(cb, "static"):
            return cb.static
    return None


def _warm_optimizer_callback():
    """Create AdamW's state before the first step (a zero-gradient step at learning rate 0: the weights do not move),
    so that a one-step measurement shows the steady state of every later step, optimizer state included."""
    import torch
    from transformers import TrainerCallback

    class WarmOptimizer(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kw):
            params = [p for group in optimizer.param_groups for p in group["params"]]
            lrs = [group["lr"] for group in optimizer.param_groups]
            for group in optimizer.param_groups:
                group["lr"] = 0.0
            for p in params:
                p.grad = torch.zeros_like(p)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            for group, lr in zip(optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr

    return WarmOptimizer()


def answer_length_reward(completions, **_):
    """Deterministic reward with spread inside every group (the sweep measures memory, not learning)."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]


def run_sweep_point(opts) -> dict:
    """One or more training steps at one (completion length, group size); every answer is exactly that long."""
    from trl_rlvr import RLVRConfig
    from trl_rlvr.scripts.data import arithmetic_dataset
    from trl_rlvr.scripts.models import load_tokenizer, resolve_model_path
    from trl_rlvr.scripts.train import use_cpu_threads
    from trl_rlvr.trainer import RLVRTrainer

    use_cpu_threads(None, 1)
    path = resolve_model_path(None if opts.model == "smollm2" else model_path(opts.model), quiet=True)
    tokenizer = load_tokenizer(path)
    length, group = opts.lengths[0], opts.groups[0]
    data = arithmetic_dataset(tokenizer, n_train=64, n_eval=1)["train"]
    args = RLVRConfig(
        output_dir=opts.output_dir, max_steps=opts.steps, per_device_train_batch_size=opts.batch // opts.grad_accum,
        gradient_accumulation_steps=opts.grad_accum,
        num_generations=group, max_completion_length=length, generation_kwargs={"min_new_tokens": length},
        learning_rate=3e-5, beta=0.0, loss_normalization="per_batch_token", epsilon_high=0.28,
        activation_checkpointing=opts.checkpointing, bf16=False, use_cpu=True, logging_steps=1,
        save_strategy="no", report_to="none", seed=0, model_init_kwargs={"dtype": "float32"},
        **({} if opts.cpu_tile is None else {"cpu_logprob_tile_tokens": opts.cpu_tile}),
    )
    peaks = Peaks()
    build = plain_grpo_trainer if opts.trl else RLVRTrainer
    with peaks.phase("load", trim_around=True):
        trainer = build(path, [answer_length_reward], args, train_dataset=data, processing_class=tokenizer)
    probe = instrument(trainer, peaks)
    trainer.add_callback(_warm_optimizer_callback())
    trainer.train()
    steps = [r for r in peaks.records if r["phase"] == "training step"]
    heads = [r for r in peaks.records if r["phase"].startswith("step: LM head")]
    last = steps[-1]
    return {
        "case": "sweep", "trainer": "GRPOTrainer" if opts.trl else "RLVRTrainer", "model": opts.model,
        "length": length, "group": group, "batch": opts.batch, "checkpointing": opts.checkpointing,
        "grad_accum": opts.grad_accum, "cpu_tile": None if opts.trl else args.cpu_logprob_tile_tokens,
        "tokens": heads[0].get("tokens") if heads else None,
        "step_peak_mb": last["peak_mb"], "step_start_mb": last["start_mb"], "step_seconds": last["seconds"],
        "step_cpu_seconds": last["cpu_seconds"],
        "head_peak_above_start_mb": max(r["peak_mb"] - r["start_mb"] for r in heads) if heads else None,
        "saved_activation_mb": probe["saved_activation_mb"][-1], "static": _static_from(trainer),
        "phases": peaks.records,
    }


# ------------------------------------------------------------------------------------------------ report
def summarize_phases(records: list[dict]) -> list[dict]:
    """One row per phase name: the highest peak, the first start and the last end (steps: per step)."""
    rows: dict[str, dict] = {}
    for rec in records:
        key = rec["phase"] if rec["phase"].startswith(("load", "greedy", "sampled", "whole")) else \
            f"{rec['phase']} [step {rec.get('step', '?')}]"
        row = rows.setdefault(key, {"phase": key, "start_mb": rec["start_mb"], "peak_mb": 0.0, "calls": 0,
                                    "seconds": 0.0})
        row["peak_mb"] = max(row["peak_mb"], rec["peak_mb"])
        row["end_mb"], row["children_mb"] = rec["end_mb"], rec["children_mb"]
        row["calls"] += 1
        row["seconds"] += rec["seconds"]
    return list(rows.values())


def print_main(result: dict) -> None:
    print(f"\n{result['trainer']} on {result['model']}: examples/r1zero.py {shlex.join(result['argv'])}")
    print(f"{'phase':<44} {'calls':>5} {'start':>8} {'peak':>8} {'end':>8} {'+peak':>8} {'children':>8} {'s':>7}")
    for row in summarize_phases(result["phases"]):
        print(f"{row['phase']:<44} {row['calls']:>5} {row['start_mb']:>8.0f} {row['peak_mb']:>8.0f} "
              f"{row['end_mb']:>8.0f} {row['peak_mb'] - row['start_mb']:>8.0f} {row['children_mb']:>8.0f} "
              f"{row['seconds']:>7.1f}")
    static = result.get("static") or {}
    print("counted exactly (MB): " + ", ".join(f"{k[:-3]} {v:.0f}" for k, v in static.items())
          + f", activations saved for backward per loss forward {[round(x) for x in result['saved_activation_mb']]}")


# ------------------------------------------------------------------------------------------------ command line
def run_case_in_subprocess(case_args: list[str], timeout: float) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, "-m", "benchmarks.memory", "--json-out", out, *case_args]
    proc = subprocess.run(cmd, cwd=ROOT, timeout=timeout, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    result = json.loads(Path(out).read_text())
    os.unlink(out)
    return result


def print_sweep(points: list[dict]) -> None:
    print(f"\n{'model':<8} {'trainer':<12} {'tile':>5} {'ckpt':>4} {'GA':>3} {'rows':>4} {'G':>3} {'length':>6} "
          f"{'tokens':>6} {'step peak':>9} {'above start':>11} {'LM head':>8} {'saved act.':>10} {'step s':>7} "
          f"{'cpu s':>7}")
    for p in points:
        print(f"{p['model']:<8} {p['trainer']:<12} {p.get('cpu_tile') or 'TRL':>5} "
              f"{'yes' if p['checkpointing'] else 'no':>4} {p['grad_accum']:>3} {p['batch']:>4} {p['group']:>3} "
              f"{p['length']:>6} {p['tokens'] or 0:>6} {p['step_peak_mb']:>9.0f} "
              f"{p['step_peak_mb'] - p['step_start_mb']:>11.0f} {p['head_peak_above_start_mb'] or 0:>8.0f} "
              f"{p['saved_activation_mb']:>10.0f} {p['step_seconds']:>7.1f} {p.get('step_cpu_seconds', 0):>7.1f}")


def growth_per_100_tokens(points: list[dict]) -> dict:
    """Least-squares slope of the step's peak against completion length, per 100 tokens, per (model, trainer)."""
    out = {}
    for key in sorted({(p["model"], p["trainer"], p["group"], p["checkpointing"], p["grad_accum"]) for p in points}):
        xs = [(p["length"], p["step_peak_mb"] - p["step_start_mb"]) for p in points
              if (p["model"], p["trainer"], p["group"], p["checkpointing"], p["grad_accum"]) == key]
        if len({x for x, _ in xs}) < 2:
            continue
        mx, my = sum(x for x, _ in xs) / len(xs), sum(y for _, y in xs) / len(xs)
        slope = sum((x - mx) * (y - my) for x, y in xs) / sum((x - mx) ** 2 for x, _ in xs)
        out[" ".join(map(str, key))] = round(100 * slope, 1)
    return out


def check_main(result: dict) -> list[str]:
    """What must hold for a main-job profile: every phase measured, and the steps flat (the last within 5% of the
    second, at their ends)."""
    names = {r["phase"] for r in result["phases"]}
    problems = [f"phase {n!r} missing" for n in ("load: data, rewards, model, trainer", "greedy evaluation before",
                                                  "training step", "step: generation", "step: LM head forward",
                                                  "step: backward", "step: optimizer") if n not in names]
    ends = [r["end_mb"] for r in result["phases"] if r["phase"] == "training step"]
    if len(ends) >= 3 and ends[-1] > 1.05 * ends[1]:
        problems.append(f"RSS after the last step {ends[-1]:.0f} MB > 1.05 x after step 2 ({ends[1]:.0f} MB)")
    return problems


def run_all(opts) -> int:
    model = "tiny" if opts.smoke else opts.model
    steps = 3 if opts.smoke else opts.steps
    results, problems = {"main": [], "sweep": []}, []
    timeout = 1800 if opts.smoke else 7200  # a loaded shared machine: a tiny case took over 10 minutes there
    if opts.case in ("main", "all"):
        for trl in (False, True):
            args = ["--case", "main", "--model", model, "--steps", str(steps), *(["--trl"] if trl else [])]
            if opts.eval_questions is not None or opts.smoke:
                args += ["--eval-questions", str(opts.eval_questions or 8)]
            try:
                result = run_case_in_subprocess(args + (["--", *opts.script_args] if opts.script_args else []), timeout)
            except Exception as err:  # noqa: BLE001 - reported, and the exit status says so
                problems.append(str(err))
                continue
            print_main(result)
            problems += [f"{result['trainer']}: {p}" for p in check_main(result)]
            results["main"].append(result)
        if len(results["main"]) == 2:
            ours, trl = (max(r["peak_mb"] for r in res["phases"] if r["phase"] == "whole job") for res in results["main"])
            print(f"\npeak RSS of the whole job: RLVRTrainer {ours:.0f} MB, GRPOTrainer {trl:.0f} MB, ours/TRL's "
                  f"{ours / trl:.2f}")
    if opts.case in ("sweep", "all"):
        lengths = [16, 32] if opts.smoke else opts.lengths
        for trl in (False, True):
            grid = [(length, opts.groups[0]) for length in lengths]
            grid += [] if opts.smoke else [(lengths[0], g) for g in opts.groups[1:]]  # smoke: two points a trainer
            for length, group in grid:
                args = ["--case", "sweep", "--model", model, "--steps", "1" if model != "tiny" else "2",
                        "--lengths", str(length), "--groups", str(group), "--batch", str(opts.batch),
                        "--grad-accum", str(opts.grad_accum), *(["--trl"] if trl else []),
                        *(["--checkpointing"] if opts.checkpointing else []),
                        *(["--cpu-tile", str(opts.cpu_tile)] if opts.cpu_tile is not None else [])]
                try:
                    point = run_case_in_subprocess(args, timeout)
                except Exception as err:  # noqa: BLE001
                    problems.append(str(err))
                    continue
                point.pop("phases")
                results["sweep"].append(point)
        print_sweep(results["sweep"])
        slopes = growth_per_100_tokens(results["sweep"])
        results["growth_mb_per_100_tokens"] = slopes
        print("step peak above its start, MB per 100 completion tokens (model trainer G checkpointing GA): "
              + json.dumps(slopes))
    print(f"\ncommand: python -m benchmarks.memory {shlex.join(sys.argv[1:])}")
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=1, default=str))
    for p in problems:
        print(f"FAILED: {p}", file=sys.stderr)
    return 1 if problems else 0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, few steps; exit non-zero on failure")
    parser.add_argument("--case", choices=["main", "sweep", "all"], default="all")
    parser.add_argument("--model", default="smollm2", help="'tiny', 'smollm2' (the offline default) or a path")
    parser.add_argument("--trl", action="store_true", help="plain GRPOTrainer (one case, in this process)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--eval-questions", type=int, default=None, help="held-out questions (default: r1zero's)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--groups", type=int, nargs="+", default=[8])
    parser.add_argument("--batch", type=int, default=16, help="sweep: rows per step")
    parser.add_argument("--checkpointing", action="store_true", help="sweep: activation checkpointing on")
    parser.add_argument("--grad-accum", type=int, default=1, help="sweep: micro-batches per step (rows / GA each)")
    parser.add_argument("--cpu-tile", type=int, default=None, help="sweep: RLVRTrainer's cpu_logprob_tile_tokens "
                        "(default: RLVRConfig's, 256; 0: TRL's tile of 4096 tokens, as GRPOTrainer)")
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--json", default=None, help="write all results here")
    parser.add_argument("--json-out", default=None, help=argparse.SUPPRESS)  # one case, run in this process
    parser.add_argument("script_args", nargs="*", help="after --: passed to examples/r1zero.py (case main)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    opts = parse_args(argv)
    if opts.json_out:  # a single case in this (fresh) process
        opts.output_dir = opts.output_dir or tempfile.mkdtemp(prefix="memory_")
        result = run_main_case(opts) if opts.case == "main" else run_sweep_point(opts)
        Path(opts.json_out).write_text(json.dumps(result, default=str))
        return 0
    return run_all(opts)


if __name__ == "__main__":
    sys.exit(main())
