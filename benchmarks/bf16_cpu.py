"""bf16 on a CPU: RLVRTrainer training steps with bf16=True vs bf16=False (use_cpu=True), same model and data.

    python -m benchmarks.bf16_cpu [--steps 4] [--hidden 256] [--layers 4] [--threads N] [--smoke]

A random Qwen2 (``trl_rlvr.testing.build_tiny_model`` with the given width and depth, character tokenizer) is
trained for ``--steps`` steps twice from the same seed: 8 answers of 64 tokens per step (2 prompts x G=4), real
generation, a constant reward. The time per step (generation, log-probs, loss, backward, optimizer) is reported
for both and their ratio; the first step (warm-up) is left out. Where the result is quoted: docs/benchmarks.md.
``--smoke``: 2 steps of a 2-layer, 64-wide model, 16-token answers (seconds). A run that crashes exits non-zero.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks._status import finish  # noqa: E402


def run(model_dir, bf16: bool, steps: int, completion_length: int = 64) -> float:
    from datasets import Dataset
    from transformers import TrainerCallback

    from trl_rlvr import RLVRConfig, RLVRTrainer
    from trl_rlvr.testing import load_tokenizer

    stamps = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    args = RLVRConfig(
        output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=bf16, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=completion_length, max_steps=steps, learning_rate=1e-5, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, seed=0, activation_checkpointing=False,
    )
    dataset = Dataset.from_dict({"prompt": [f"question {i}: what is {i} + {i}?" for i in range(64)]})
    trainer = RLVRTrainer(model=str(model_dir), reward_funcs=[lambda completions, **_: [1.0] * len(completions)],
                          args=args, train_dataset=dataset, processing_class=load_tokenizer(model_dir))
    trainer.add_callback(Clock())
    start = time.perf_counter()
    trainer.train()
    stamps.insert(0, start)
    per_step = [b - a for a, b in zip(stamps, stamps[1:])]
    return sum(per_step[1:]) / len(per_step[1:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--completion-length", type=int, default=64, help="tokens per answer (default 64)")
    parser.add_argument("--smoke", action="store_true", help="2 steps, hidden 64, 2 layers, 16-token answers")
    opts = parser.parse_args(argv)
    if opts.smoke:
        opts.steps, opts.hidden, opts.layers, opts.completion_length = 2, 64, 2, 16
    if opts.steps < 2:
        parser.error("--steps must be >= 2 (the first step is left out as warm-up)")
    import torch

    from trl_rlvr.testing import build_tiny_model

    if opts.threads:
        torch.set_num_threads(opts.threads)
    model_dir = build_tiny_model(tempfile.mkdtemp(), hidden_size=opts.hidden, num_layers=opts.layers)
    fp32 = run(model_dir, False, opts.steps, opts.completion_length)
    bf16 = run(model_dir, True, opts.steps, opts.completion_length)
    print(f"hidden {opts.hidden}, {opts.layers} layers, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"cpu bf16 support: {torch.backends.mkldnn.is_available()}")
    print(f"seconds per step: float32 {fp32:.2f}, bf16 {bf16:.2f}, bf16/float32 {bf16 / fp32:.1f}x")
    print(f"load average: {os.getloadavg()}")
    print("command: python -m benchmarks.bf16_cpu " + " ".join(sys.argv[1:] if argv is None else argv))
    return finish("benchmarks.bf16_cpu", [f"{name}: {t} s per step" for name, t in (("float32", fp32), ("bf16", bf16))
                                          if not (math.isfinite(t) and t > 0)])


if __name__ == "__main__":
    sys.exit(main())
