"""The tool job's lab: its arms, the random-reward control, committed-run comparisons, timings and peak RSS.

examples/tool_r1.py is the recipe (cold start, tool RL, held-out evaluation); this module runs the same stages from
the same public pieces (:mod:`trl_rlvr.tasks.tool_arithmetic`) for the experiments around it, and writes the files
the committed runs are (examples/results/tool_r1_metrics.json, tool_r1_r1zero_metrics.json)::

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
import time  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402

from trl_rlvr.evaluation.heldout import format_metric  # noqa: E402
from trl_rlvr.tasks.tool_arithmetic import (  # noqa: E402
    TOOL_STEP_FIELDS,
    ToolR1Arguments,
    arm_summary,
    build_rl_trainer,
    cold_start,
    evaluate_arm,
    jsonable,
    large_k_comparison,
    parse_args,
    plain_rows,
    question_rows,
    save_curves,
    shown_arms,
    summary_table,
    tool_format,
    tool_rows,
    tool_tokenizer,
    vllm_cpu_defaults,
)

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
    from trl_rlvr.evaluation import release_memory
    from trl_rlvr.rewards.registry import load_reward
    from trl_rlvr.scripts.distributed import distributed_state
    from trl_rlvr.scripts.models import load_tokenizer, resolve_model_path
    from trl_rlvr.scripts.train import use_cpu_threads

    t_start = time.time()
    timings = {}
    state = distributed_state(training_args.use_cpu)
    use_cpu_threads(script_args.cpu_threads, state.num_processes)
    say = (lambda *a: print(*a, flush=True)) if state.is_main_process else (lambda *a: None)
    out = Path(training_args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    training_args.model_init_kwargs = {"dtype": model_args.dtype or "float32", **(training_args.model_init_kwargs or {})}
    vllm_cpu_defaults(training_args)
    with state.main_process_first():
        base_path = resolve_model_path(model_args.model_name_or_path, quiet=not state.is_main_process)
    train, heldout = question_rows(script_args)
    seen_kind = sum(r.get("wordings") == "training" for r in heldout)
    kinds = f"{len(heldout) - seen_kind} in unseen wordings, {seen_kind} new in the training wordings" if seen_kind \
        else "held-out wordings"
    say(f"model {base_path}; {len(train)} RL questions, {len(heldout)} held-out questions ({kinds}); "
        f"arm {script_args.arm}; torch threads {__import__('torch').get_num_threads()}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}")
    boxed = load_reward("boxed_math")
    evals, sft_history, metrics = {}, [], {}
    n = script_args.eval_num_samples

    peaks = {}

    def checkpoint_figures():
        """What is measured so far, after each stage (a run stopped early keeps its figures), with this process's
        peak RSS so far (which stage sets the job's peak)."""
        if timings:
            peaks[next(reversed(timings))] = peak_rss_mib()
        if state.is_main_process:
            partial = {"arms": {label: arm_summary(r) for label, r in evals.items()}, "cold_start_history": sft_history,
                       "timings_s": {k: round(v, 1) for k, v in timings.items()}, "peak_rss_mib_after": peaks}
            (out / "tool_r1_partial.json").write_text(json.dumps(jsonable(partial), indent=1))

    if script_args.arm == "r1zero":
        tokenizer = load_tokenizer(base_path)
        tokenizer.truncation_side = "left"
        success, fmt = load_reward("boxed_math", prefilled=True), load_reward("think_format", prefilled=True)
        eval_rows, train_rows = plain_rows(heldout, tokenizer), plain_rows(train, tokenizer)
        trainer = build_rl_trainer(base_path, tokenizer, script_args, training_args, train_rows, tool=False)
        if script_args.eval_start:
            t = time.time()
            evals["base (no tool)"] = evaluate_arm(trainer, tokenizer, eval_rows, success, fmt, script_args, tool=False,
                                                   n=n)
            timings["eval base"] = time.time() - t
            checkpoint_figures()
        label_after = "R1-Zero (no tool)"
    else:
        tokenizer = tool_tokenizer(base_path, script_args.chat_template)
        tokenizer.truncation_side = "left"
        from transformers.utils import get_json_schema

        from reward_plugins.code_sandbox import PythonEnvironment

        tools = [get_json_schema(PythonEnvironment.python)]
        success, fmt = boxed, tool_format
        eval_rows, train_rows = tool_rows(heldout, script_args.system_prompt), tool_rows(train, script_args.system_prompt)
        start_path = base_path
        if script_args.sft_traces:
            t = time.time()
            start_path = out / "cold_start"
            # SFTTrainer: one process, or data-parallel over the launched processes; it saves on the main one
            sft_history = cold_start(base_path, tokenizer, script_args, training_args, start_path, tools)
            timings["cold start (SFT)"] = time.time() - t
            checkpoint_figures()
            say(f"cold start: {len(sft_history)} SFT steps in {timings['cold start (SFT)']:.0f}s, loss "
                f"{sft_history[0]['loss']:.3f} -> {sft_history[-1]['loss']:.3f}")
            release_memory()
        trainer = build_rl_trainer(start_path, tokenizer, script_args, training_args, train_rows, tool=True)
        label = "cold start (tool)" if script_args.sft_traces else "base (tool)"
        if script_args.eval_start:
            t = time.time()
            evals[label] = evaluate_arm(trainer, tokenizer, eval_rows, success, fmt, script_args, tool=True, n=n)
            timings["eval cold start"] = time.time() - t
            checkpoint_figures()
            if script_args.passk_samples:
                t = time.time()
                evals[label + f", n={script_args.passk_samples}"] = evaluate_arm(
                    trainer, tokenizer, eval_rows[:script_args.passk_questions], success, fmt, script_args, tool=True,
                    n=script_args.passk_samples)
                timings["large-k eval cold start"] = time.time() - t
        label_after = "cold start + tool RL" if script_args.sft_traces else "tool RL"
    if script_args.reward_control == "shuffled":
        label_after += CONTROL
    for label, result in evals.items():
        say(f"  {label}: pass@1 {format_metric(result['mean@n'], pct=True)}")

    from trl_rlvr.evaluation.heldout import StepProgressCallback

    history = StepProgressCallback(TOOL_STEP_FIELDS, bar=False, say=say).install(trainer)
    t = time.time()
    train_result = trainer.train()
    timings["RL"] = time.time() - t
    # Adam's moments (twice the model's size) are not needed once training ends: the job saves the model, not a
    # checkpoint. Dropped before the last evaluation, whose KV caches would otherwise come on top of them.
    trainer.optimizer.state.clear()
    release_memory()
    checkpoint_figures()

    t = time.time()
    tool = script_args.arm == "tool"
    evals[label_after] = evaluate_arm(trainer, tokenizer, eval_rows, success, fmt, script_args, tool=tool, n=n)
    timings["eval after RL"] = time.time() - t
    checkpoint_figures()
    if tool and script_args.passk_samples:
        t = time.time()
        evals[label_after + f", n={script_args.passk_samples}"] = evaluate_arm(
            trainer, tokenizer, eval_rows[:script_args.passk_questions], success, fmt, script_args, tool=True,
            n=script_args.passk_samples)
        timings["large-k eval after RL"] = time.time() - t
    if script_args.save_model:
        trainer.save_model(str(out / "rl"))
    timings["total"] = time.time() - t_start
    peaks["total"] = peak_rss_mib()

    if state.is_main_process:
        arms = {label: arm_summary(r) for label, r in evals.items() if ", n=" not in label}
        committed = None
        if tool and Path(script_args.r1zero_results).is_file():
            committed = json.loads(Path(script_args.r1zero_results).read_text())
        shown, heading = shown_arms(arms, committed, script_args.smoke, base_path)
        table = summary_table(shown)
        sentence = goals_sentence(arms if script_args.smoke else shown)  # a smoke run is compared with nothing
        passk = large_k_comparison(evals, script_args.passk_samples, script_args.passk_questions,
                                   out / "tool_r1_passk.png" if script_args.plot else None)
        name = "tool_r1_metrics.json" if tool else "tool_r1_r1zero_metrics.json"
        metrics = {
            "model": base_path, "arm": script_args.arm, "num_processes": state.num_processes,
            "arms": arms, "shown_with_committed_r1zero": bool(committed), "table": table, "goals": sentence,
            "passk_large": passk, "cold_start_history": sft_history, "history": history.history,
            "train_metrics": train_result.metrics,
            "evaluations": {label: {k: v for k, v in r.items() if k != "per_question"} for label, r in evals.items()},
            "timings_s": {k: round(v, 1) for k, v in timings.items()}, "peak_rss_mib_after": peaks,
            "load_average_end": os.getloadavg(), "torch_threads": __import__("torch").get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
            "script_args": asdict(script_args),
            "training_args": {k: v for k, v in training_args.to_dict().items()
                              if isinstance(v, (int, float, str, bool, type(None), list, dict))},
        }
        (out / name).write_text(json.dumps(jsonable(metrics), indent=1))
        plot = save_curves(history.history, sft_history, out / ("tool_r1_curves.png" if tool else
                                                                "tool_r1_r1zero_curves.png")) if script_args.plot else None
        print(f"\nheld-out evaluation: {len(heldout)} questions x {n} samples, temperature "
              f"{training_args.temperature}, budget {training_args.max_completion_length} tokens")
        print(heading)
        print(table)
        if sentence:
            print(sentence)
        if passk:
            print(passk["sentence"])
        for k, v in timings.items():
            print(f"time: {k}: {v:.0f} s" + (f" (peak RSS so far {peaks[k]} MiB)" if k in peaks else ""))
        print(f"metrics: {out / name}" + (f"   curves: {plot}" if plot else ""))
    return trainer, metrics


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
