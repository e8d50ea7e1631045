"""The tool job's imitation arms, at the RL stage's compute: is RL worth it over the cheaper things a practitioner tries
first? Both start from the same 24-trace cold start as the default run (benchmarks.tool_arms) and are evaluated like it:

* ``--arm rft``: rejection-sampling fine-tuning (trl_rlvr.supervised.rejection_sampling) from the cold start, with
  the tool: rounds of ``rft_questions_per_round`` RL-stream questions x ``rft_samples`` answers (the RL step's 8 x 4)
  until the answers hold as many model tokens as the RL stage generated; accepted = ``boxed_math`` right and
  ``tool_format`` 1, every call parsed and ran, ended with EOS, no duplicate; then SFT of the cold start on them
  (the cold start's settings; with no answer accepted, the cold start is the arm's model, and the metrics say so);
* ``--arm more_traces``: the cold start on more programmatic traces, as many as the RL stage's training tokens buy
  (SFT and RL pass every token of a sequence through forward and backward, so at one model size equal tokens are
  equal training FLOPs, 6 N per token): traces until ``epochs x their tokens`` >= the 24 traces' + the RL stage's.

The RL stage's budget comes from its run's metrics (``--rl_metrics``, :func:`rl_budget`: the generated model tokens,
the sum over steps of ``completions/mean_length`` x the step's rollouts; the training tokens, TRL's ``num_tokens``:
prompt + model tokens of every rollout, an upper bound of what RL trained on, since steps without an informative
group train nothing), or is given
(``--generated_tokens``, ``--trained_tokens``)::

    python -m benchmarks.imitation_arms --arm rft --rl_metrics OUT/tool_r1_metrics.json --seed 42 --eval_split test
    python -m benchmarks.imitation_arms --arm more_traces --rl_metrics OUT/tool_r1_metrics.json --seed 42
    python -m benchmarks.imitation_arms --smoke     # both arms, one short round each, on a tiny random model (CI)

Every option of the recipe (``ToolR1Arguments``, ``RLVRConfig``, ``trl.ModelConfig``) is accepted (``--passk_samples
64``: pass@k up to 64 on the first ``passk_questions`` held-out questions, as the recipe). Writes
``tool_r1_<arm>_metrics.json`` (the arm's evaluation, its table, the budget and what it spent, timings) to
``output_dir``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from trl_rlvr.scripts.train import passive_openmp_waits  # imports no torch

passive_openmp_waits()  # before torch loads: threads on shared cores (docs/benchmarks.md)

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from trl_rlvr.tasks.tool_arithmetic import ToolR1Arguments, jsonable, parse_args, shown_arms  # noqa: E402
from trl_rlvr.tasks.tool_job import ToolJob  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("rft", "more_traces")
#: The default run's committed metrics: its RL stage's budget (a comparison run passes its own seed's run).
COMMITTED_RL = ROOT / "examples" / "results" / "tool_r1_metrics.json"
#: Cold-start problems kept out of every held-out question (trl_rlvr.tasks.word_problems._COLD_START_POOL).
TRACE_POOL = 1000


@dataclass
class ImitationArguments(ToolR1Arguments):
    """The recipe's options and the imitation arms' (the module's docstring)."""

    arm: str = field(default="rft", metadata={"help": "'rft' or 'more_traces'", "choices": list(ARMS)})
    rl_metrics: str = field(default=str(COMMITTED_RL), metadata={"help": "The RL run's metrics JSON, whose RL stage "
                            "sets the budget."})
    generated_tokens: int | None = field(default=None, metadata={"help": "RFT's budget of generated model tokens "
                                         "(default: the RL stage's, from rl_metrics)."})
    trained_tokens: int | None = field(default=None, metadata={"help": "The more-traces arm's budget of training "
                                       "tokens beyond the cold start (default: the RL stage's, from rl_metrics)."})
    rft_samples: int = field(default=4, metadata={"help": "RFT answers per question (the RL group size)."})
    rft_questions_per_round: int = field(default=8, metadata={"help": "RFT questions per sampling round."})

    def __post_init__(self):
        if self.arm not in ARMS:
            raise ValueError(f"arm={self.arm!r} is not valid; allowed values: {ARMS}")
        super().__post_init__()


def rl_budget(metrics: dict) -> dict:
    """The RL stage's compute from its run's metrics: ``trained_tokens``, TRL's cumulative ``num_tokens`` at the last
    step (prompts + model tokens of every rollout), and ``generated_tokens``, per step ``completions/mean_length`` x
    the step's rollouts (TRL counts the model's tokens, not the tool replies). A step that trained nothing logs no
    lengths (``estimated_steps``): its generated tokens are its ``num_tokens`` increase less the mean prompt tokens
    of the steps that logged both."""
    args = metrics["training_args"]
    rollouts = args["per_device_train_batch_size"] * args["gradient_accumulation_steps"] * metrics["num_processes"]
    steps = [h for h in metrics["history"] if "num_tokens" in h]
    if not steps:
        raise ValueError("rl_metrics: no RL step logged num_tokens")
    seen = [b["num_tokens"] - a for a, b in zip([0.0] + [h["num_tokens"] for h in steps], steps)]
    logged = [(d, h["completions/mean_length"] * rollouts) for d, h in zip(seen, steps) if "completions/mean_length" in h]
    if not logged:
        raise ValueError("rl_metrics: no RL step logged completions/mean_length")
    prompt_tokens = sum(d - g for d, g in logged) / len(logged)
    generated = sum(g for _, g in logged) + sum(d - prompt_tokens for d, h in zip(seen, steps)
                                                if "completions/mean_length" not in h)
    return {"generated_tokens": round(generated), "trained_tokens": round(steps[-1]["num_tokens"]),
            "steps": len(steps), "estimated_steps": len(steps) - len(logged), "rollouts_per_step": rollouts}


def budget_of(args) -> dict:
    """:func:`rl_budget` of ``args.rl_metrics``, each figure replaced by ``generated_tokens`` / ``trained_tokens``
    when given."""
    given = {k: getattr(args, k) for k in ("generated_tokens", "trained_tokens") if getattr(args, k) is not None}
    if len(given) == 2:
        return {**given, "source": "given"}
    path = Path(args.rl_metrics)
    if not path.is_file():
        raise ValueError(f"rl_metrics={path}: no such file (or give --generated_tokens and --trained_tokens)")
    return {**rl_budget(json.loads(path.read_text())), **given, "source": str(path)}


def tool_schemas() -> list[dict]:
    from transformers.utils import get_json_schema

    from reward_plugins.code_sandbox import PythonEnvironment

    return [get_json_schema(PythonEnvironment.python)]


def traces_for_tokens(tokenizer, script_args, extra_tokens: float) -> tuple[int, int]:
    """The fewest cold-start traces (never fewer than ``sft_traces``) whose tokens x epochs reach the cold start's
    plus ``extra_tokens`` -> (traces, their tokens per epoch). ``ValueError`` past the 1000 traces kept out of the
    held-out questions."""
    from trl_rlvr.tasks.word_problems import composed_cold_start_traces

    schemas = tool_schemas()
    traces = composed_cold_start_traces(TRACE_POOL, seed=script_args.dataset_seed,
                                        system_prompt=script_args.system_prompt)

    def tokens(trace) -> int:
        return len(tokenizer.apply_chat_template(trace["messages"], tools=schemas, tokenize=True, return_dict=False))

    count = script_args.sft_traces
    total = sum(tokens(t) for t in traces[:count])
    target = total + extra_tokens / script_args.sft_epochs
    for trace in traces[count:]:
        if total >= target:
            break
        total, count = total + tokens(trace), count + 1
    if total < target:
        raise ValueError(f"{extra_tokens} training tokens need more than the {TRACE_POOL} cold-start traces kept out "
                         "of the held-out questions")
    return count, total


def rft_stage(job: ToolJob, start: Path, budget: int, train_rows) -> tuple[Path, dict]:
    """RFT from ``start``: rounds of RL-stream questions until the answers' model tokens reach ``budget``, then SFT
    of ``start`` on the accepted answers -> (the model's path, what was spent and kept)."""
    from transformers import AutoModelForCausalLM

    from trl_rlvr.evaluation import release_memory
    from trl_rlvr.rewards.registry import load_reward
    from trl_rlvr.supervised.fine_tune import supervised_fine_tune
    from trl_rlvr.supervised.rejection_sampling import RFTSettings, rejection_sample, round_metrics
    from trl_rlvr.tasks.tool_arithmetic import dataset, sft_settings, tool_environment, tool_format

    args, per_round = job.script_args, job.script_args.rft_questions_per_round
    settings = RFTSettings.from_training_args(job.training_args, num_samples=args.rft_samples,
                                              batch_size=args.eval_batch_size)
    accepted, rejected, rounds = [], [], 0
    with job.stage("RFT sampling"):
        model = AutoModelForCausalLM.from_pretrained(str(start), dtype="float32").eval()
        while sum(r["tokens"] for r in accepted + rejected) < budget:
            chunk = train_rows[rounds * per_round:(rounds + 1) * per_round]
            if not chunk:
                raise ValueError(f"the {len(train_rows)} RL questions ran out before {budget} generated tokens")
            kept, dropped, _ = rejection_sample(model, job.tokenizer, dataset(chunk), load_reward("boxed_math"),
                                                settings, format_fn=tool_format, tools=tool_schemas(),
                                                environment_factory=tool_environment(args), iteration=rounds)
            for row in kept + dropped:  # the question's place in the RL stream
                row["question_index"] += rounds * per_round
            accepted, rejected, rounds = accepted + kept, rejected + dropped, rounds + 1
        del model
        release_memory()
    spent = {**round_metrics(accepted, rejected, rounds * per_round), "rounds": rounds}
    job.say(f"RFT: {spent['accepted']}/{spent['samples']} answers accepted, {spent['generated_tokens']} tokens "
            f"generated (budget {budget})")
    if not accepted:  # nothing to imitate: the arm's model is its start (a tiny random model's smoke run)
        job.say("RFT accepted no answer: the cold start is the arm's model, unchanged")
        return start, {**spent, "sft_steps": 0, "sft_loss": []}
    path = job.out / "rft"
    with job.stage("RFT (SFT)"):
        history = supervised_fine_tune(start, job.tokenizer, accepted, path, sft_settings(args, job.training_args),
                                       tool_schemas(), label="RFT")
    return path, {**spent, "sft_steps": len(history), "sft_loss": [h["loss"] for h in history]}


def run_arm(script_args, training_args, model_args) -> dict:
    """One arm (``script_args.arm``): the cold start, the arm's stage, the held-out evaluation -> the metrics."""
    from trl_rlvr.tasks.tool_arithmetic import build_rl_trainer

    job = ToolJob(script_args, training_args, model_args)
    budget = budget_of(script_args)
    eval_rows, train_rows = job.tool_data()
    job.say(f"model {job.base_path}; arm {script_args.arm}; the RL stage's budget {budget}")
    if script_args.arm == "more_traces":
        traces, tokens = traces_for_tokens(job.tokenizer, script_args, budget["trained_tokens"])
        job.say(f"more traces: {traces} traces ({tokens} tokens an epoch) instead of {script_args.sft_traces}")
        spent, label = {"sft_traces": traces, "tokens_per_epoch": tokens}, f"SFT, {traces} traces (tool)"
        script_args.sft_traces = traces
        model_path = job.cold_start()
    else:
        model_path, spent = rft_stage(job, job.cold_start(), budget["generated_tokens"], train_rows)
        label = "cold start + RFT (tool)"
    job.trainer = build_rl_trainer(model_path, job.tokenizer, script_args, training_args, train_rows, tool=True)
    job.evaluate_tool(label, f"after {script_args.arm}", eval_rows)
    return write_outputs(job, budget, spent)


def write_outputs(job: ToolJob, budget: dict, spent: dict) -> dict:
    """``tool_r1_<arm>_metrics.json`` and the printed table."""
    import time
    from dataclasses import asdict

    from trl_rlvr.tasks.tool_arithmetic import summary_table

    args = job.script_args
    job.timings["total"] = time.time() - job.t_start
    arms = job.arms()
    shown, heading = shown_arms(arms, None, args.smoke, job.base_path)
    table = summary_table(shown)
    metrics = {"arm": args.arm, "model": job.base_path, "budget": budget, "spent": spent, "arms": arms,
               "table": table, "passk_large": job.large_k(), "cold_start_history": job.sft_history,
               "evaluations": {label: {k: v for k, v in r.items() if k != "per_question"}
                               for label, r in job.evals.items()},
               "timings_s": {k: round(v, 1) for k, v in job.timings.items()}, "script_args": asdict(args)}
    name = f"tool_r1_{args.arm}_metrics.json"
    if job.is_main:
        (job.out / name).write_text(json.dumps(jsonable(metrics), indent=1))
        job.report(heading, table, [], name, None)
    return metrics


def run(argv=None) -> dict:
    """Parse (:class:`ImitationArguments`) and run one arm -> its metrics."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from trl_rlvr.evaluation.progress import plain_library_bars

    plain_library_bars()
    return run_arm(*parse_args(argv, ImitationArguments))


#: The smoke run's budgets: one short RFT round, a few more traces.
SMOKE_BUDGET = ["--generated_tokens", "8", "--trained_tokens", "600"]


def main(argv=None) -> int:
    """The arms' command line: every job option, and ``--smoke``: each arm in turn on a tiny random model with ChatML
    tokens (``benchmarks._jobs.tool_job_smoke_args``), small budgets, in a temporary folder."""
    import argparse
    import shutil
    import tempfile

    from benchmarks._status import finish

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="each arm, one short round, on a tiny random model")
    args, job = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if not args.smoke:
        run(job)
        return 0
    from benchmarks._jobs import tool_job_smoke_args

    failures, temporary = [], Path(tempfile.mkdtemp(prefix="imitation_arms_"))
    try:
        for arm in ARMS if "--arm" not in job else [job[job.index("--arm") + 1]]:
            out = temporary / arm
            out.mkdir()
            extra = [a for a in job if a != "--arm" and a not in ARMS]
            metrics = run(["--arm", arm, "--output_dir", str(out), *tool_job_smoke_args(temporary),
                           "--eval_num_samples", "2", "--rft_questions_per_round", "2", *SMOKE_BUDGET, *extra])
            if not metrics["arms"]:
                failures.append(f"{arm}: no evaluation")
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return finish("imitation_arms", failures)


if __name__ == "__main__":
    sys.exit(main())
