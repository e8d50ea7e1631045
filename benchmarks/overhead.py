"""Step-time overhead of ``RLVRTrainer`` over plain TRL ``GRPOTrainer`` (goal: ratio <= 1.03).

    python -m benchmarks.overhead [--steps N] [--repeats R] [--completion-length L] [--json PATH] [--smoke]

Both trainers run on the same tiny local model (trl_rlvr/testing.py: 2-layer Qwen2, hidden 64, built in a temporary
directory, no hub access), the same prompts, the same seed and equivalent settings:

* A = ``GRPOTrainer`` with ``GRPOConfig(loss_type="dapo")``,
* B = ``RLVRTrainer`` with ``RLVRConfig(loss_normalization="per_batch_token")`` (which maps to TRL's "dapo"),

with one deterministic callable reward (fraction of vowels in the answer). Runs ALTERNATE A, B, A, B, ...;
each run is a fresh trainer that does ``--warmup`` optimizer steps (not timed) and then ``--steps`` timed ones.

An optimizer step is timed by a ``TrainerCallback`` from ``on_step_begin`` to the ``on_log`` of that step
(``logging_steps=1``), so it covers generation, rewards, advantages, the loss, backward, the optimizer and the
metric logging - everything either trainer does per step. ``on_step_begin``..``on_step_end`` (without logging)
and TRL's own ``step_time`` metric (``training_step`` only) are reported as well.

The learning rate is 0 by default, so the two trainers generate exactly the same answers at every step (their
advantages differ slightly: RLVR uses the population std, TRL the sample std, which would otherwise change the
weights and hence the generated lengths); the script checks that the answer lengths agree, and exits 1 if not
(``--smoke``: one pair of runs, 2 timed steps).

Reported: the median over repetitions of the per-pair ratio median(B steps) / median(A steps), with its
spread (interquartile range and min..max over pairs), and the ratio of the pooled medians. Other processes may
share the CPU: use enough repetitions and read the medians.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

from benchmarks._status import finish  # noqa: E402


def vowel_fraction(completions, **_):
    """Deterministic reward: fraction of vowels among the characters of the answer."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else c[0]["content"]
        out.append(sum(ch in "aeiouAEIOU" for ch in text) / max(len(text), 1))
    return out


def _timer_callback(warmup: int):
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Per optimizer step, wall and CPU time: begin -> on_log (full), begin -> on_step_end (compute)."""

        def __init__(self):
            self.full, self.compute, self.cpu, self.cpu_compute, self.trl, self.lengths = [], [], [], [], [], []
            self._t0 = self._c0 = None
            self.own, self._own_step = [], 0.0  # RLVRTrainer only: seconds in its own code per step
            self._logged = set()

        def on_step_begin(self, args, state, control, **kw):
            self._t0, self._c0 = time.perf_counter(), time.process_time()
            self._own_step = 0.0

        def on_step_end(self, args, state, control, **kw):
            if state.global_step > warmup:
                self.compute.append(time.perf_counter() - self._t0)
                self.cpu_compute.append(time.process_time() - self._c0)

        def on_log(self, args, state, control, logs=None, **kw):
            now, cpu_now = time.perf_counter(), time.process_time()
            step = state.global_step
            if step in self._logged or logs is None or "loss" not in logs:
                return  # only the first (per-step) log; not the end-of-training summary
            self._logged.add(step)
            if step > warmup:
                self.full.append(now - self._t0)
                self.cpu.append(cpu_now - self._c0)
                self.own.append(self._own_step)
                if "step_time" in logs:
                    self.trl.append(float(logs["step_time"]))
                self.lengths.append(float(logs.get("completions/mean_length", float("nan"))))

    return StepTimer()


def _time_own_code(trainer, timer):
    """Wrap the code RLVRTrainer adds to a GRPOTrainer step (not the TRL code it calls) with wall-clock timers.

    Instance attributes over the trainer's and its round driver's methods; the time is added to ``timer._own_step``.
    """
    def timed(fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                timer._own_step += time.perf_counter() - t0
        return wrapper

    for name in ("transform_rewards", "optimizer_step_token_counts"):  # the hooks the adapter calls on self
        setattr(trainer, name, timed(getattr(trainer, name)))
    driver = trainer._round_driver  # its per-round work on top of TRL's round (advantages once, counts, metrics)
    for name in ("compute_advantages", "log_round", "loss_tokens", "decide"):
        setattr(driver, name, timed(getattr(driver, name)))


def run_once(kind: str, model_dir: str, opts) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from trl_rlvr import RLVRConfig, RLVRTrainer
    from trl_rlvr.testing import load_tokenizer

    settings = dict(
        output_dir=tempfile.mkdtemp(prefix="overhead-"), per_device_train_batch_size=opts.batch_size,
        num_generations=opts.num_generations, max_completion_length=opts.completion_length,
        learning_rate=opts.learning_rate, max_steps=opts.warmup + opts.steps, bf16=False,
        activation_checkpointing=False, report_to="none", logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=opts.seed, use_cpu=True,
    )
    if kind == "grpo":
        args, trainer_cls = GRPOConfig(loss_type="dapo", **settings), GRPOTrainer
    else:
        args, trainer_cls = RLVRConfig(loss_normalization="per_batch_token", **settings), RLVRTrainer
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    dataset = Dataset.from_dict({"prompt": [f"question {i}: " for i in range(512)]})
    timer = _timer_callback(opts.warmup)
    trainer = trainer_cls(model=model, reward_funcs=[vowel_fraction], args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # disable_tqdm=True would print every log dict
    if kind == "rlvr":
        _time_own_code(trainer, timer)
    trainer.train()
    result = {"full": timer.full, "compute": timer.compute, "cpu": timer.cpu, "cpu_compute": timer.cpu_compute,
              "trl": timer.trl, "lengths": timer.lengths, "own": timer.own}
    del trainer, model
    gc.collect()
    return result


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def _summary(runs_a: list[list[float]], runs_b: list[list[float]]) -> dict:
    pairs = [statistics.median(b) / statistics.median(a) for a, b in zip(runs_a, runs_b)]
    pooled_a = [t for r in runs_a for t in r]
    pooled_b = [t for r in runs_b for t in r]
    q1, q3 = _quartiles(pairs)
    return {
        "ratio_median_of_pairs": statistics.median(pairs),
        "ratio_iqr": [q1, q3],
        "ratio_min_max": [min(pairs), max(pairs)],
        "ratio_pooled_medians": statistics.median(pooled_b) / statistics.median(pooled_a),
        "pair_ratios": pairs,
        "grpo_median_s": statistics.median(pooled_a),
        "rlvr_median_s": statistics.median(pooled_b),
        "grpo_iqr_s": list(_quartiles(pooled_a)),
        "rlvr_iqr_s": list(_quartiles(pooled_b)),
    }


def _machine() -> dict:
    import torch

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "usable_cores": usable,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "platform": platform.platform()}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8, help="timed optimizer steps per run (default 8)")
    p.add_argument("--repeats", type=int, default=6, help="A/B pairs of runs (default 6)")
    p.add_argument("--warmup", type=int, default=1, help="untimed optimizer steps at the start of each run")
    p.add_argument("--completion-length", type=int, default=32, help="max_completion_length (default 32)")
    p.add_argument("--batch-size", type=int, default=8, help="per_device_train_batch_size (default 8)")
    p.add_argument("--num-generations", type=int, default=4, help="answers per prompt (default 4)")
    p.add_argument("--learning-rate", type=float, default=0.0,
                   help="default 0: both trainers then generate identical answers at every step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads (default 1: steadier on a shared CPU; 0 = torch's choice)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH ('-' for stdout)")
    p.add_argument("--smoke", action="store_true", help="seconds: 1 pair of runs, 2 timed steps, 16-token answers")
    opts = p.parse_args(argv)
    if opts.smoke:
        opts.repeats, opts.steps, opts.completion_length = 1, 2, 16

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore")
    if opts.threads:
        torch.set_num_threads(opts.threads)

    from trl_rlvr.testing import build_tiny_model

    command = "python -m benchmarks.overhead " + shlex.join(sys.argv[1:] if argv is None else argv)
    machine = _machine()
    load_before = os.getloadavg()
    started = time.perf_counter()
    runs = {"grpo": [], "rlvr": []}
    with tempfile.TemporaryDirectory(prefix="overhead-model-") as model_dir:
        build_tiny_model(model_dir)
        for r in range(opts.repeats):
            for kind in ("grpo", "rlvr"):  # strictly alternating A, B, A, B, ...
                t0 = time.perf_counter()
                res = run_once(kind, model_dir, opts)
                res["run_s"] = time.perf_counter() - t0
                runs[kind].append(res)
                print(f"  repeat {r + 1}/{opts.repeats} {kind:>4}: median step {statistics.median(res['full']):.3f}s "
                      f"(steps {', '.join(f'{t:.3f}' for t in res['full'])}; run {res['run_s']:.1f}s)", flush=True)
    elapsed = time.perf_counter() - started
    load_after = os.getloadavg()

    results = {"command": command, "machine": machine, "loadavg_before": load_before, "loadavg_after": load_after,
               "wall_s": elapsed, "options": vars(opts)}
    for measure in ("full", "compute", "trl", "cpu", "cpu_compute"):
        a = [r[measure] for r in runs["grpo"]]
        b = [r[measure] for r in runs["rlvr"]]
        if all(a) and all(b):
            results[measure] = _summary(a, b)
    own = [t for r in runs["rlvr"] for t in r["own"]]
    if own:
        results["own_code_median_s"] = statistics.median(own)
        results["own_code_fraction_of_grpo_step"] = statistics.median(own) / results["full"]["grpo_median_s"]
    len_a = [x for r in runs["grpo"] for x in r["lengths"]]
    len_b = [x for r in runs["rlvr"] for x in r["lengths"]]
    results["same_answers"] = len_a == len_b
    results["mean_answer_length"] = statistics.mean(len_a) if len_a else None

    full = results["full"]
    print()
    print(f"RLVRTrainer / GRPOTrainer step time (median of {opts.repeats} alternating pairs, {opts.steps} timed steps "
          f"each after {opts.warmup} warm-up):")
    print(f"  ratio {full['ratio_median_of_pairs']:.3f}  (IQR {full['ratio_iqr'][0]:.3f}..{full['ratio_iqr'][1]:.3f}, "
          f"min..max {full['ratio_min_max'][0]:.3f}..{full['ratio_min_max'][1]:.3f}; pooled medians "
          f"{full['ratio_pooled_medians']:.3f})   goal <= 1.03")
    print(f"  GRPOTrainer(loss_type='dapo')                      median step {full['grpo_median_s'] * 1000:.1f} ms "
          f"(IQR {full['grpo_iqr_s'][0] * 1000:.1f}..{full['grpo_iqr_s'][1] * 1000:.1f})")
    print(f"  RLVRTrainer(loss_normalization='per_batch_token')  median step {full['rlvr_median_s'] * 1000:.1f} ms "
          f"(IQR {full['rlvr_iqr_s'][0] * 1000:.1f}..{full['rlvr_iqr_s'][1] * 1000:.1f})")
    for measure, label in (("compute", "wall, without logging (on_step_begin..on_step_end)"),
                           ("trl", "wall, TRL step_time (training_step only)"),
                           ("cpu", "CPU time of the process (less sensitive to other load)"),
                           ("cpu_compute", "CPU time, without logging")):
        if measure in results:
            s = results[measure]
            print(f"  {label}: ratio {s['ratio_median_of_pairs']:.3f} "
                  f"(IQR {s['ratio_iqr'][0]:.3f}..{s['ratio_iqr'][1]:.3f}, min..max {s['ratio_min_max'][0]:.3f}.."
                  f"{s['ratio_min_max'][1]:.3f}; pooled medians {s['ratio_pooled_medians']:.3f}; "
                  f"{s['grpo_median_s'] * 1000:.1f} vs {s['rlvr_median_s'] * 1000:.1f} ms)")
    if own:
        print(f"  time in RLVRTrainer's own per-step code (transform_rewards, the round driver's decisions, "
              f"advantages, token count and rollout metrics, the exact per-step token counts): median {results['own_code_median_s'] * 1000:.2f} ms/step = "
              f"{100 * results['own_code_fraction_of_grpo_step']:.2f}% of the GRPO step (timed directly, so much "
              f"less sensitive to other load)")
    print(f"  same answers in both trainers: {results['same_answers']} (mean answer length "
          f"{results['mean_answer_length']:.1f} tokens, max {opts.completion_length})")
    print(f"command: {command}")
    print(f"machine: {machine['cpu']}; {machine['usable_cores']} usable cores of {machine['cpu_count']}, torch "
          f"{machine['torch']} with {machine['torch_threads']} threads, Python {machine['python']}; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (shared CPU); wall {elapsed:.0f}s")
    if opts.json:
        text = json.dumps(results, indent=2)
        if opts.json == "-":
            print(text)
        else:
            Path(opts.json).write_text(text + "\n")
    return results


def exit_status(results: dict) -> int:
    """1 when, at learning rate 0, the two trainers did not generate the same answers (the A/B comparison then
    compares different work)."""
    same = results["same_answers"] or results["options"]["learning_rate"] != 0
    return finish("benchmarks.overhead", [] if same else
                  ["GRPOTrainer and RLVRTrainer generated different answers at learning rate 0"])


if __name__ == "__main__":
    sys.exit(exit_status(main()))
