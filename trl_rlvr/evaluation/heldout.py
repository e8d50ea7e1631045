"""A training job's before/after held-out evaluation and its report, as ``examples/r1zero.py`` uses them::

    report = HeldOutReport(trainer, data["test"], script_args, job="r1zero")  # installs its progress callback
    report.evaluate("before")
    with report.timed("training"):
        trainer.train()
    report.evaluate("after")
    report.write()   # <job>_metrics.json, <job>_curves.png, <job>_passk.png; prints the table (main process)

- :class:`HeldOutEvalArguments`: the evaluation's options, a dataclass to add to a script's own (``TrlParser``);
- :class:`StepProgressCallback`: the progress bar or one line per step, and every step's log (``history``);
- :class:`HeldOutReport`: greedy accuracy before and after (:func:`trl_rlvr.evaluation.evaluate`), sampled pass@k /
  maj@k before and after (:class:`trl_rlvr.evaluation.report.SampledComparison`), the timings, and the outputs:
  :func:`before_after_table`, :func:`plot_rlvr_curves`, the metrics JSON (:meth:`HeldOutReport.metrics`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from transformers import TrainerCallback

from trl_rlvr.evaluation.progress import STEP_FIELDS, step_line


@dataclass
class HeldOutEvalArguments:
    """The held-out evaluation's options (a script's arguments dataclass inherits them)."""

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
    plot: bool = field(default=True, metadata={"help": "Write <job>_curves.png and <job>_passk.png (needs matplotlib)."})


# ------------------------------------------------------------------------------------------------ progress
class StepProgressCallback(TrainerCallback):
    """Training progress for a job's console, in place of transformers' ``ProgressCallback`` / ``PrinterCallback``
    (:meth:`install` swaps them): a rich bar with the last step's figures on a terminal (``bar=True``), else one
    line per step, ``step 3/9 (41s) reward 0.51 | acc 50% | ...`` (:func:`step_line`). It keeps every training
    step's log (with ``step`` and ``time``) in ``history``, for a job's metrics JSON and curves; the end-of-training
    summary (``train_loss``, ...) is not a step. Lines and bar only on the main process."""

    def __init__(self, fields=STEP_FIELDS, bar: bool = True, say: Callable[[str], None] | None = None):
        self.fields, self.bar_wanted = tuple(fields), bar
        self.say = say or (lambda line: print(line, flush=True))
        self.history: list[dict] = []
        self.progress = self.task = None
        self.t0 = time.time()

    def install(self, trainer) -> StepProgressCallback:
        """Replace the trainer's own progress bar and log printer with this callback; returns it."""
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(self)
        return self

    def on_train_begin(self, args, state, control, **kw):
        self.t0 = time.time()
        if not state.is_world_process_zero or not self.bar_wanted:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        progress = Progress(TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[stats]}"))
        if progress.console.is_terminal:  # a bar only on a terminal (stopped, it prints its last frame into a log)
            self.progress = progress
            self.progress.start()
            self.task = self.progress.add_task("train", total=state.max_steps, stats="generating...")

    def on_log(self, args, state, control, logs=None, **kw):
        logs = dict(logs or {})
        if "reward" not in logs and "loss" not in logs:  # the train summary (train_loss, ...) is not a step
            return
        logs["step"], logs["time"] = state.global_step, time.time()
        self.history.append(logs)
        if not state.is_world_process_zero:
            return
        line = step_line(logs, self.fields)
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step, stats=line)
        else:
            self.say(f"step {state.global_step}/{state.max_steps} ({time.time() - self.t0:.0f}s) {line}")

    def on_step_end(self, args, state, control, **kw):
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)

    def on_train_end(self, args, state, control, **kw):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


# ------------------------------------------------------------------------------------------------ figures
def format_metric(v, pct: bool = False, digits: int = 1) -> str:
    """A figure as the job's table prints it (and the READMEs quote it): percentages and lengths with one decimal,
    rewards with two; ``-`` when undefined."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}%}" if pct else f"{v:.{digits}f}"


def history_mean(history: list[dict], key: str) -> float | None:
    """Mean of a logged metric over the steps that logged it (NaN skipped); None when none did."""
    vals = [h[key] for h in history if isinstance(h.get(key), (int, float)) and not math.isnan(h[key])]
    return sum(vals) / len(vals) if vals else None


def history_sum(history: list[dict], key: str) -> float | None:
    """Sum of a logged metric over the steps that logged it; None when none did."""
    vals = [h[key] for h in history if isinstance(h.get(key), (int, float))]
    return sum(vals) if vals else None


def before_after_table(before: dict | None, after: dict | None, history: list[dict], timings: dict,
                       format_reward: str = "think_format") -> str:
    """The R1-Zero job's table under its title: the greedy evaluation before and after
    (:func:`trl_rlvr.evaluation.evaluate` results), the training diagnostics of the first and last step and over all
    steps (RLVRTrainer's ``rlvr/*`` metrics) and the timings (seconds), in
    :func:`trl_rlvr.evaluation.metric_table.text_table`'s layout."""
    from trl_rlvr.evaluation.metric_table import text_table

    fmt, mean = format_metric, history_mean
    b, a = before or {}, after or {}
    first, last = (history[0] if history else {}), (history[-1] if history else {})
    fmt_key = f"rewards/{format_reward}/mean"

    def both(name, get, **kw):  # a metric before and after
        return name, [fmt(get(b), **kw), fmt(get(a), **kw)]

    def steps(name, key, **kw):  # a training metric at the first and the last step
        return name, [fmt(first.get(key), **kw), fmt(last.get(key), **kw)]

    def over_steps(name, value, **kw):  # a training metric over all steps
        return name, ["", fmt(value, **kw)]

    rows = [
        both(f"held-out accuracy (n={a.get('n') or b.get('n')})", lambda r: r.get("accuracy"), pct=True),
        both("held-out format rate", lambda r: r.get("format_rate"), pct=True),
        both("mean length, right answers (tokens)", lambda r: r.get("length_right")),
        both("mean length, wrong answers (tokens)", lambda r: r.get("length_wrong")),
        both("truncated answers", lambda r: r.get("truncated_frac"), pct=True),
        None,
        steps("training reward (first / last step)", "reward", digits=2),
        steps("training accuracy (first / last step)", "rlvr/accuracy", pct=True),
        steps("training format rate (first / last step)", fmt_key, pct=True),
        ("train length right / wrong (mean over steps)", [fmt(mean(history, "rlvr/length_right")),
                                                          fmt(mean(history, "rlvr/length_wrong"))]),
        over_steps("wasted-group share (zero-signal, mean)", mean(history, "rlvr/zero_signal_frac"), pct=True),
        over_steps("expected if all questions equally hard", mean(history, "rlvr/zero_signal_expected"), pct=True),
        over_steps("groups skipped by selective sampling (total)", history_sum(history, "rlvr/prompts_skipped")),
        over_steps("answers generated per informative row (mean)", mean(history, "rlvr/answers_per_informative_row")),
        None,
        *((f"time: {k} (s)", ["", f"{v:.0f}"]) for k, v in timings.items()),
    ]
    title = "R1-Zero: held-out evaluation (greedy) and training diagnostics"
    return f"{title}\n{text_table(['before', 'after'], rows)}"


def plot_rlvr_curves(history: list[dict], path, format_reward: str = "think_format") -> Path | None:
    """Three panels of an RLVR run's training curves: the reward (total and per reward function), accuracy /
    format / zero-signal groups on the training samples, and completion lengths (all, right, wrong)."""
    from trl_rlvr.evaluation.report import plot_training_curves

    rewards = sorted({k for h in history for k in h if k.startswith("rewards/") and k.endswith("/mean")})
    accuracy = [("rlvr/accuracy", "o-", "accuracy (boxed_math)"), ("rlvr/zero_signal_frac", ":", "zero-signal groups")]
    fmt_key = f"rewards/{format_reward}/mean"
    if any(fmt_key in h for h in history):
        accuracy.insert(1, (fmt_key, ".--", f"format ({format_reward})"))
    return plot_training_curves(history, [
        ("reward", [("reward", "o-", "total reward")] + [(k, ".--", k.split("/")[1]) for k in rewards]),
        ("accuracy / format (training samples)", accuracy),
        ("completion length (tokens)", [("completions/mean_length", "o-", "all"), ("rlvr/length_right", ".--", "right"),
                                        ("rlvr/length_wrong", ".--", "wrong")]),
    ], path)



# ------------------------------------------------------------------------------------------------ report
class HeldOutReport:
    """The held-out evaluation of a trainer's model before and after training, and the job's report.

    Args:
        trainer: an ``RLVRTrainer`` (its reward functions score the evaluation: ``args.success_reward`` decides
            right/wrong, ``options.format_reward`` (a reward name, or None) counts as formatted).
        test_set: held-out rows (``prompt`` and the rewards' reference columns).
        options: a :class:`HeldOutEvalArguments` (a script's arguments that inherit it).
        job: the outputs' prefix (``<job>_metrics.json``, ``<job>_curves.png``, ``<job>_passk.png``).
        timings: seconds already measured (e.g. ``{"data, rewards and model": 12.0}``), in the table's order.
        fields: the progress line's figures (:data:`trl_rlvr.evaluation.progress.STEP_FIELDS`).
        training_args: the arguments the metrics JSON records (default: the trainer's ``args``; a script passes
            the ones it parsed).

    It installs a :class:`StepProgressCallback` (``self.progress``) on the trainer. The greedy evaluation runs
    ``eval_batch_size`` prompts per call with ``eval_max_new_tokens`` (default ``max_completion_length``); the
    sampled one ``eval_num_samples`` samples of the first ``eval_sampled_questions`` questions at the training
    temperature, seeded with the training seed.
    """

    def __init__(self, trainer, test_set, options: HeldOutEvalArguments, *, job: str, timings: dict | None = None,
                 fields=STEP_FIELDS, training_args=None, console=None):
        from trl_rlvr.evaluation.report import SampledComparison

        self.trainer, self.test_set, self.options, self.job = trainer, test_set, options, job
        self.timings = dict(timings or {})
        self.main = trainer.accelerator.is_main_process
        self.console = console
        self.t_start = time.time() - sum(self.timings.values())
        self.results: dict[str, dict | None] = {"before": None, "after": None}
        self.train_result = None
        self.training_args = training_args if training_args is not None else trainer.args
        args, names = trainer.args, trainer.reward_func_names
        self.success_fn = trainer.reward_funcs[trainer.success_reward_index]
        self.format_fn = trainer.reward_funcs[names.index(options.format_reward)] if options.format_reward in names \
            else None
        self.eval_kwargs = dict(accelerator=trainer.accelerator, max_new_tokens=options.eval_max_new_tokens or
                                args.max_completion_length, success_threshold=args.success_threshold)
        self.sampled = SampledComparison(
            test_set, self.success_fn, self.format_fn, n=options.eval_num_samples,
            num_questions=options.eval_sampled_questions, temperature=args.temperature, seed=args.seed,
            **self.eval_kwargs) if options.eval_num_samples else None
        self.progress = StepProgressCallback(fields).install(trainer)

    def say(self, *objects, **kwargs) -> None:
        """Print on the main process (rich markup)."""
        if self.main:
            if self.console is None:
                from rich.console import Console

                self.console = Console(stderr=False, soft_wrap=True)
            self.console.print(*objects, **kwargs)

    @contextmanager
    def timed(self, name: str):
        """Time a phase of the job into the table's and the JSON's timings."""
        t = time.time()
        try:
            yield
        finally:
            self.timings[name] = time.time() - t

    def evaluate(self, when: str) -> dict:
        """The greedy evaluation (and, with ``eval_num_samples``, the sampled one) of the trainer's model now;
        ``when``: ``"before"`` or ``"after"`` training."""
        from trl_rlvr.evaluation import evaluate

        trainer, tokenizer = self.trainer, self.trainer.processing_class
        self.say(f"evaluating {len(self.test_set)} held-out questions before training (greedy)..." if when == "before"
                 else "evaluating after training...")
        with self.timed(f"eval {when}"):
            result = evaluate(trainer.model_wrapped, tokenizer, self.test_set, self.success_fn, self.format_fn,
                              batch_size=self.options.eval_batch_size, **self.eval_kwargs)
        self.results[when] = result
        if when == "before":
            self.say(f"  before: accuracy {result['accuracy']:.1%}, format {format_metric(result['format_rate'], True)}")
        if self.sampled:
            with self.timed(f"sampled eval {when}"):
                self.sampled.run("base" if when == "before" else "trained", trainer.model_wrapped, tokenizer)
        return result

    def train(self, **kwargs):
        """``trainer.train(**kwargs)``, timed; then the memory the last step held is given back."""
        from trl_rlvr.evaluation import release_memory

        with self.timed("training"):
            self.train_result = self.trainer.train(**kwargs)
        release_memory()  # the last step's activations and batches, before the evaluation after training
        return self.train_result

    def metrics(self, sampled: dict | None, **extra) -> dict:
        """The job's metrics JSON: the evaluations, the training diagnostics averaged over steps, every step's log,
        the timings, and the script's and trainer's arguments; ``extra`` first (``model``, ``dataset``, ...)."""
        history, training_args = self.progress.history, self.training_args
        return {
            **extra,
            "before": self.results["before"],
            "after": self.results["after"],
            "sampled": sampled,  # pass@k / maj@k before and after (trl_rlvr.evaluation.report.SampledComparison)
            "wasted_group_share": history_mean(history, "rlvr/zero_signal_frac"),
            "groups_skipped": history_sum(history, "rlvr/prompts_skipped"),
            "answers_per_informative_row": history_mean(history, "rlvr/answers_per_informative_row"),
            "train_length_right": history_mean(history, "rlvr/length_right"),
            "train_length_wrong": history_mean(history, "rlvr/length_wrong"),
            "train_metrics": self.train_result.metrics if self.train_result is not None else None,
            "history": history,
            "timings_s": {k: round(v, 1) for k, v in self.timings.items()},
            "script_args": asdict(self.options),
            "training_args": {k: v for k, v in training_args.to_dict().items()
                              if isinstance(v, (int, float, str, bool, type(None), list, dict))},
        }

    def write(self, **extra) -> Path | None:
        """On the main process: ``<job>_metrics.json`` (:meth:`metrics`; ``extra`` first), and with
        ``options.plot`` ``<job>_curves.png`` and ``<job>_passk.png``, in ``output_dir``; prints the table, the
        sampled table and its sentence. Returns the metrics path (None on the other processes)."""
        self.timings["total"] = time.time() - self.t_start
        if not self.main:
            return None
        out = Path(self.trainer.args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        history, plot = self.progress.history, self.options.plot
        fmt_name = self.options.format_reward or "think_format"
        sampled = self.sampled.report(out / f"{self.job}_passk.png" if plot else None) if self.sampled else None
        path = out / f"{self.job}_metrics.json"
        path.write_text(json.dumps(self.metrics(sampled, **extra), indent=1, default=str))
        curves = plot_rlvr_curves(history, out / f"{self.job}_curves.png", fmt_name) if plot and history else None
        self.say(before_after_table(self.results["before"], self.results["after"], history, self.timings, fmt_name),
                 markup=False, highlight=False)
        if sampled:
            self.say(sampled["table"], markup=False, highlight=False)
            self.say(sampled["sentence"] or "", markup=False)
        self.say(f"metrics: {path}" + (f"   plot: {curves}" if curves else ""))
        return path
