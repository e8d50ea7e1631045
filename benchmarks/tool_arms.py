"""The tool job's lab: its arms, the random-reward control, committed-run comparisons, timings and peak RSS.

examples/tool_r1.py is the recipe (cold start, tool RL, held-out evaluation); this module runs the same stages from
the same public pieces (:class:`trl_rlvr.tasks.tool_job.ToolJob`, :mod:`trl_rlvr.tasks.tool_arithmetic`) for the
experiments around it, and writes the files the committed runs are (examples/results/tool_r1_metrics.json,
tool_r1_r1zero_metrics.json)::

    python -m benchmarks.tool_arms                  # the default run, its table beside the committed no-tool arm
    python -m benchmarks.tool_arms --arm r1zero     # the no-tool arm: base and R1-Zero, same task and budget
    python -m benchmarks.tool_arms --reward_control shuffled --model_name_or_path OUT/cold_start --sft_traces 0
                                                    # the random-reward control, from a run's cold start
    python -m benchmarks.tool_arms --smoke          # one short step of each stage on a tiny random model (CI)

Every option of the recipe (``ToolR1Arguments``, ``RLVRConfig``, ``trl.ModelConfig``) is accepted, plus
:class:`ArmArguments`' own. Beside the recipe's outputs the metrics JSON records the goals' differences in points
(:func:`goals_sentence`), this process's peak RSS after each stage (``peak_rss_mib_after``; ``tool_r1_partial.json``
after each stage, so that a run stopped early keeps its figures), the load average and the OpenMP settings.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from trl_rlvr.scripts.train import passive_openmp_waits  # imports no torch

passive_openmp_waits()  # before torch loads: threads on shared cores (docs/benchmarks.md)

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from trl_rlvr.tasks.tool_arithmetic import (  # noqa: E402
    ToolR1Arguments,
    arm_summary,
    build_rl_trainer,
    jsonable,
    parse_args,
    plain_rows,
    shown_arms,
    summary_table,
)
from trl_rlvr.tasks.tool_job import ToolJob  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("tool", "r1zero")
CONTROL = ", shuffled rewards"  # the random-reward control's column: its arm's label + this
#: The committed no-tool arm's metrics, shown beside a run's own columns (``r1zero_results``).
COMMITTED_R1ZERO = ROOT / "examples" / "results" / "tool_r1_r1zero_metrics.json"


@dataclass
class ArmArguments(ToolR1Arguments):
    """The recipe's options and the lab's: which arm, the random-reward control, the committed no-tool arm."""

    arm: str = field(default="tool", metadata={"help": "'tool': cold start + tool RL (the default run); 'r1zero': the "
                     "no-tool arm, R1-Zero on the same questions and budget (writes tool_r1_r1zero_metrics.json).",
                     "choices": list(ARMS)})
    reward_control: str = field(default="none", metadata={"help": "'shuffled': the random-reward control, the same "
                                "RL with each batch's rewards shuffled between its answers "
                                "(trl_rlvr.rewards.controls); its column says so.", "choices": ["none", "shuffled"]})
    r1zero_results: str = field(default=str(COMMITTED_R1ZERO), metadata={
        "help": "The no-tool arm's metrics (from --arm r1zero) shown beside this run's."})

    def __post_init__(self):
        if self.arm not in ARMS:
            raise ValueError(f"arm={self.arm!r} is not valid; allowed values: {ARMS}")
        if self.reward_control not in ("none", "shuffled"):
            raise ValueError(f"reward_control={self.reward_control!r} is not valid; allowed values: 'none', 'shuffled'")
        super().__post_init__()

    def uses_tool(self) -> bool:
        return self.arm == "tool"


def run_job(script_args, training_args, model_args):
    """The job's stages for ``script_args.arm`` (an :class:`ArmArguments`); -> (trainer, metrics)."""
    peaks = {}

    def checkpoint_figures(stage):
        """After each stage: this process's peak RSS so far (which stage sets the job's peak) and what is measured
        so far, in ``tool_r1_partial.json`` (a run stopped early keeps its figures)."""
        if stage.startswith("large-k"):
            return
        peaks[stage] = peak_rss_mib()
        if job.is_main and stage != "total":
            partial = {"arms": {label: arm_summary(r) for label, r in job.evals.items()},
                       "cold_start_history": job.sft_history, "timings_s": {k: round(v, 1) for k, v in
                                                                            job.timings.items()},
                       "peak_rss_mib_after": peaks}
            (job.out / "tool_r1_partial.json").write_text(json.dumps(jsonable(partial), indent=1))

    job = ToolJob(script_args, training_args, model_args, after_stage=checkpoint_figures)
    kinds = held_out_kinds(job.heldout, script_args.eval_split)
    job.say(f"model {job.base_path}; {len(job.train_questions)} RL questions, {len(job.heldout)} held-out questions "
            f"({kinds}); arm {script_args.arm}; torch threads {__import__('torch').get_num_threads()}, "
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}")
    tool = script_args.arm == "tool"
    label_after, evaluate_after = tool_arm(job) if tool else r1zero_arm(job)
    if script_args.reward_control == "shuffled":
        label_after += CONTROL
    job.train()
    evaluate_after(label_after)
    job.finish()
    if not job.is_main:
        return job.trainer, {}
    return job.trainer, write_outputs(job, peaks)


#: What each kind of held-out question holds (the rows' ``wordings``; trl_rlvr.tasks.heldout_splits).
KIND_NAMES = {"training": "new in the training wordings", "unseen": "trained sentences with a held-out number format",
              "novel": "new story frames and question forms"}


def held_out_kinds(rows, split: str) -> str:
    """``"dev split: 32 new in the training wordings, ..."``: how many held-out questions of each kind."""
    counts = {}
    for row in rows:
        counts[row.get("wordings")] = counts.get(row.get("wordings"), 0) + 1
    if None in counts:
        return f"{split} split: held-out wordings"
    return f"{split} split: " + ", ".join(f"{count} {KIND_NAMES.get(kind, kind)}" for kind, count in counts.items())


def tool_arm(job: ToolJob):
    """The recipe's stages up to RL: cold start (with ``sft_traces``), the trainer with the tool, the evaluation
    of its start -> (the label of the evaluation after RL, that evaluation: label -> None)."""
    args = job.script_args
    eval_rows, train_rows = job.tool_data()
    start_path = job.cold_start() if args.sft_traces else job.base_path
    job.trainer = build_rl_trainer(start_path, job.tokenizer, args, job.training_args, train_rows, tool=True)
    if args.eval_start:
        job.evaluate_tool("cold start (tool)" if args.sft_traces else "base (tool)", "cold start", eval_rows)
    return ("cold start + tool RL" if args.sft_traces else "tool RL",
            lambda label: job.evaluate_tool(label, "after RL", eval_rows))


def r1zero_arm(job: ToolJob):
    """The no-tool arm up to RL: the first main job's prompt on the same questions, ``think_format`` +
    ``boxed_math``, the evaluation of the base model -> (the label of the evaluation after RL, that evaluation)."""
    from trl_rlvr.rewards.registry import load_reward
    from trl_rlvr.scripts.models import load_tokenizer

    args = job.script_args
    job.tokenizer = load_tokenizer(job.base_path)
    job.tokenizer.truncation_side = "left"
    scorers = load_reward("boxed_math", prefilled=True), load_reward("think_format", prefilled=True)
    eval_rows, train_rows = plain_rows(job.heldout, job.tokenizer), plain_rows(job.train_questions, job.tokenizer)
    job.trainer = build_rl_trainer(job.base_path, job.tokenizer, args, job.training_args, train_rows, tool=False)

    def evaluate(label, stage):
        job.evaluate(label, stage, eval_rows, *scorers, tool=False, n=args.eval_num_samples)

    if args.eval_start:
        evaluate("base (no tool)", "eval base")
    return "R1-Zero (no tool)", lambda label: evaluate(label, "eval after RL")


def write_outputs(job: ToolJob, peaks: dict) -> dict:
    """The recipe's outputs (the table beside the committed no-tool arm, for the tool arm) with the lab's: the goals'
    sentence, peak RSS per stage, the load average and the OpenMP settings -> the metrics."""
    args, tool = job.script_args, job.script_args.arm == "tool"
    arms, committed = job.arms(), None
    if tool and Path(args.r1zero_results).is_file():
        committed = json.loads(Path(args.r1zero_results).read_text())
    shown, heading = shown_arms(arms, committed, args.smoke, job.base_path)
    table, passk = summary_table(shown), job.large_k()
    sentence = goals_sentence(arms if args.smoke else shown)  # a smoke run is compared with nothing
    metrics = job.metrics(
        arms, table, passk, arm=args.arm, shown_with_committed_r1zero=bool(committed), goals=sentence,
        peak_rss_mib_after=peaks, load_average_end=os.getloadavg(), torch_threads=__import__("torch").get_num_threads(),
        omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"), gomp_spincount=os.environ.get("GOMP_SPINCOUNT"))
    name = "tool_r1_metrics.json" if tool else "tool_r1_r1zero_metrics.json"
    plot = job.write(name, metrics, "tool_r1_curves.png" if tool else "tool_r1_r1zero_curves.png")
    notes = {stage: f" (peak RSS so far {peak} MiB)" for stage, peak in peaks.items()}
    job.report(heading, table, [sentence, passk and passk["sentence"]], name, plot, notes)
    return metrics


def peak_rss_mib() -> int:
    """This process's peak resident memory so far, MiB (``ru_maxrss``, KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def goals_sentence(arms: dict) -> str | None:
    """The goals' differences in points: tool RL vs R1-Zero without the tool, tool RL vs the cold start."""
    def find(prefix):
        for label, arm in arms.items():
            if label.startswith(prefix) and arm:
                return arm["pass@1"]
        return None

    rl, cold, r1 = find("cold start + tool RL"), find("cold start (tool)"), find("R1-Zero (no tool)")
    control = next((arm["pass@1"] for label, arm in arms.items() if CONTROL in label and arm), None)
    if control is not None:  # the control's own run: from the cold start, or from its checkpoint (sft_traces 0)
        start = cold if cold is not None else find("base (tool)")
        return None if start is None else f"random-reward control vs its start: {100 * (control - start):+.1f} points"
    parts = []
    if rl is not None and r1 is not None:
        parts.append(f"cold start + tool RL vs R1-Zero without the tool: {100 * (rl - r1):+.1f} points")
    if rl is not None and cold is not None:
        parts.append(f"tool RL vs the cold start alone: {100 * (rl - cold):+.1f} points")
    return "; ".join(parts) or None


def run(argv=None):
    """``python -m benchmarks.tool_arms ARGV`` without the benchmark's own flags: parse (:class:`ArmArguments`) and
    run; -> (trainer, metrics)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from trl_rlvr.evaluation.progress import plain_library_bars

    plain_library_bars()  # redirected to a file: no \r bars from transformers, datasets, the hub
    return run_job(*parse_args(argv, ArmArguments))


def main(argv=None) -> int:
    """The lab's command line: every job option, and ``--smoke``: the job's smoke sizes, on a tiny random model with
    ChatML tokens (``benchmarks._jobs.tool_job_smoke_args``, in a temporary folder unless ``--output_dir``) unless
    ``--model_name_or_path`` names one."""
    import argparse
    import shutil
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="one short step per stage on a tiny random model")
    args, job = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    temporary = None
    if args.smoke and "--model_name_or_path" in job:
        job.append("--smoke")  # the job's smoke sizes on the model given
    elif args.smoke:
        from benchmarks._jobs import tool_job_smoke_args

        if "--output_dir" not in job:
            temporary = tempfile.mkdtemp(prefix="tool_arms_")
            job += ["--output_dir", temporary]
        job += tool_job_smoke_args(Path(job[job.index("--output_dir") + 1]))
    try:
        run(job)
    finally:
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
