"""The tool job's task and stages (examples/tool_r1.py, benchmarks/tool_r1.py): multi-digit arithmetic word problems
(:mod:`trl_rlvr.tasks.word_problems`) solved with the sandboxed Python tool.

- options and settings: :class:`ToolR1Arguments`, :data:`DEFAULTS`, :data:`SMOKE`, :func:`parse_args`;
- data: :func:`question_rows` (RL and held-out questions), :func:`tool_rows` (system + user prompts),
  :func:`plain_rows` (the no-tool arm's pre-filled prompt), :func:`dataset`;
- the format reward :func:`tool_format`, the tokenizer :func:`tool_tokenizer` (a chat template that renders tools);
- stages: :func:`cold_start` (SFT on tool-calling traces), :func:`build_rl_trainer` (``RLVRTrainer`` with
  ``environment_factory``), :func:`evaluate_arm` (sampled held-out evaluation, with the tool when the arm has it);
- outputs: :func:`arm_summary`, :func:`summary_table` (with :func:`shown_arms`' heading), :func:`save_curves`,
  :func:`large_k_comparison`.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trl_rlvr.presets import SMALL_MODEL_ON_CPU

#: The chat template the job renders tools with (a source checkout's examples/chat_templates/chatml_tools.jinja).
TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "chat_templates" / "chatml_tools.jinja"

SYSTEM_PROMPT = "Use the python tool to compute, then give the final answer as \\boxed{number}."


@dataclass
class ToolR1Arguments:
    """The tool job's own options (the RL settings are ``RLVRConfig``'s, below in DEFAULTS); the lab's arms and
    controls add theirs (benchmarks/tool_arms.py)."""

    chat_template: str = field(default=str(TEMPLATE), metadata={"help": "Jinja file of a chat template that renders "
                               "tools (the tool arm)."})
    system_prompt: str = field(default=SYSTEM_PROMPT, metadata={"help": "System turn of the tool arm."})
    num_train_samples: int = field(default=512, metadata={"help": "RL questions (cold-start and RL wordings)."})
    num_eval_samples: int = field(default=32, metadata={"help": "Held-out questions in unseen wordings."})
    num_eval_training_wordings: int | None = field(default=None, metadata={"help": "More held-out questions, new "
                                                   "problems in the training wordings (task 'composed'): the table "
                                                   "then gives pass@1 on each kind and on all (default: 32 with "
                                                   "task 'composed', 0 with 'templates')."})
    eval_split: str = field(default="dev", metadata={"help": "The held-out questions evaluated: 'dev' (the "
                            "settings are chosen on it: num_eval_samples in held-out combinations and "
                            "num_eval_training_wordings new questions in the training wordings), or 'test' (reported "
                            "only in the final table: test_per_kind questions of each kind of "
                            "trl_rlvr.tasks.heldout_splits, drawn from their own seeds, none a problem of the RL "
                            "stream, the cold start or dev; task 'composed').", "choices": ["dev", "test"]})
    test_per_kind: int = field(default=128, metadata={"help": "Test-split questions per kind (new questions in the "
                               "training wordings; trained sentences with their number format held out; new story "
                               "frames and question forms), with eval_split 'test'."})
    dataset_seed: int = field(default=0, metadata={"help": "Seed of the questions and traces."})
    task: str = field(default="composed", metadata={"help": "'templates': the fixed wordings (word_problems.WORDINGS); "
                      "'composed': questions composed from parts, held out by combination (word_problems.composed_rows; "
                      "balanced streams)", "choices": ["templates", "composed"]})
    extra_rl_wordings: bool = field(default=False, metadata={"help": "RL questions also in three more wordings per "
                                    "operation (trl_rlvr.tasks.word_problems, split rl_extra): an experiment, "
                                    "examples/README.md."})
    sft_traces: int = field(default=24, metadata={"help": "Cold-start traces (0: no cold start, RL from the base)."})
    sft_epochs: float = field(default=2.0, metadata={"help": "Cold-start epochs."})
    sft_learning_rate: float = field(default=5e-5, metadata={"help": "Cold-start learning rate (constant)."})
    sft_batch_size: int = field(default=8, metadata={"help": "Cold-start traces per optimizer step."})
    sft_micro_batch_size: int = field(default=2, metadata={"help": "Cold-start traces per forward pass (gradient "
                                      "accumulation makes up sft_batch_size; the step's peak memory scales with it: "
                                      "8 at once peaked at 4.9 GB on a CPU, most of it the vocabulary-wide logits)."})
    tool_timeout: float = field(default=5.0, metadata={"help": "Seconds one tool cell may run (PythonEnvironment)."})
    short_tool_errors: bool = field(default=False, metadata={"help": "A cell that raised replies with the last line "
                                    "of its traceback only (ToRL; PythonEnvironment's error_reply='last_line'), "
                                    "in training and in the evaluation."})
    eval_start: bool = field(default=True, metadata={"help": "Evaluate the RL start (the cold start, or the base "
                             "model) before RL; false: a run from a checkpoint whose start is evaluated already "
                             "(an RL variant), its table without the start's column."})
    eval_num_samples: int = field(default=4, metadata={"help": "Sampled answers per held-out question (pass@1 is "
                                  "their mean accuracy)."})
    eval_batch_size: int = field(default=64, metadata={"help": "Rollouts per generate() call in the evaluation."})
    passk_samples: int = field(default=0, metadata={"help": "Large-k evaluation: answers per question for pass@k up "
                               "to k = this, cold start vs cold start + RL (0: off)."})
    passk_questions: int = field(default=16, metadata={"help": "Held-out questions of the large-k evaluation."})
    cpu_threads: int | None = field(default=None, metadata={"help": "Torch threads on a CPU (default: "
                                    "trl_rlvr.scripts.train.use_cpu_threads)."})
    async_rl: bool = field(default=False, metadata={"aliases": ["--async"], "help": "The RL stage on TRL's "
                           "asynchronous trainer (RLVRAsyncTrainer, trl_rlvr.tasks.tool_async): a vLLM server on "
                           "server_cpus cores serves the RL start and generates the next rollouts while the trainer "
                           "trains on the other cores (needs vLLM; docs/async.md)."})
    max_staleness: int = field(default=2, metadata={"help": "With --async: weight updates a rollout may lag the "
                               "trained weights at its loss (AsyncGRPOConfig.max_staleness; 2: rollouts generated "
                               "during a step train in the next one)."})
    server_cpus: int = field(default=1, metadata={"help": "With --async: cores of the vLLM server, the last ones "
                             "this process may use; the trainer keeps the others."})
    smoke: bool = field(default=False, metadata={"help": "A few questions, traces and one RL step (tests, CI)."})
    save_model: bool = field(default=True, metadata={"help": "Save the trained model to output_dir."})
    plot: bool = field(default=True, metadata={"help": "Write the PNGs (needs matplotlib)."})

    def __post_init__(self):
        if self.task not in ("templates", "composed"):
            raise ValueError(f"task={self.task!r} is not valid; allowed values: 'templates', 'composed'")
        if self.num_eval_training_wordings is None:
            self.num_eval_training_wordings = 32 if self.task == "composed" else 0
        if self.num_eval_training_wordings and self.task != "composed":
            raise ValueError("num_eval_training_wordings is for task='composed' (the templates' held-out questions "
                             "are in unseen wordings only)")
        if self.eval_split not in ("dev", "test"):
            raise ValueError(f"eval_split={self.eval_split!r} is not valid; allowed values: 'dev', 'test'")
        if self.eval_split == "test" and self.task != "composed":
            raise ValueError("eval_split='test' is for task='composed' (its test split: trl_rlvr.tasks.heldout_splits)")
        if self.task == "composed" and self.extra_rl_wordings:
            raise ValueError("extra_rl_wordings=True is for task='templates' (the composed task has its own wordings)")
        if self.sft_micro_batch_size < 1 or self.sft_batch_size % self.sft_micro_batch_size:
            raise ValueError(f"sft_batch_size={self.sft_batch_size} must be a multiple of sft_micro_batch_size="
                             f"{self.sft_micro_batch_size} (>= 1)")
        if self.async_rl and not self.uses_tool():
            raise ValueError("async_rl=True is for the tool arm (the RL stage with PythonEnvironment)")
        if self.async_rl and self.server_cpus < 1:
            raise ValueError(f"server_cpus must be >= 1, got {self.server_cpus}")
        if self.uses_tool() and not Path(self.chat_template).is_file():
            raise ValueError(f"chat_template={self.chat_template!r} is not a file")

    def uses_tool(self) -> bool:
        """Whether the run calls the tool (and so needs ``chat_template``); the lab's no-tool arm does not."""
        return True


#: Settings of the default run (both arms: the same steps, samples, learning rate and completion budget).
#: 8 questions x 4 answers per step at 8e-6 (5e-6 added less on every seed): the earlier 2 x 8 at 2e-5 moved the
#: negative rollouts' mean log-prob by -8.6 nats in one update and RL lost 19 points on unseen wordings
#: (docs/benchmarks.md, "The tool-RL redesign").
DEFAULTS = dict(
    SMALL_MODEL_ON_CPU,
    output_dir="outputs/tool_r1",
    per_device_train_batch_size=4, gradient_accumulation_steps=8, num_generations=4,  # 32 rollouts, 8 groups a step
    max_sampling_rounds=1,  # one round: each extra round of dynamic sampling costs a step's generation again
    max_steps=18,  # 10 and 16 added less over three seeds (docs/benchmarks.md); late steps find few informative groups
    max_completion_length=96,  # model turns and tool replies together (TRL's budget)
    max_tool_calling_iterations=2,
    learning_rate=8e-6,  # lr / sqrt(32 rollouts) = 1.4e-6, inside the doctor's bound (1.5e-6)
    overlong_buffer_length=32,  # penalty from 64 model-written tokens, -1 at 96
    activation_checkpointing=True,  # recomputes the micro-batch's activations in backward: peak RSS 4.37 -> 3.70 GB,
)                                   # the same figures, the same time (generation dominates a step)

SMOKE = dict(max_steps=1, num_train_samples=8, num_eval_samples=3, num_eval_training_wordings=3, test_per_kind=2,
             sft_traces=8,
             sft_epochs=1.0, eval_num_samples=2, num_generations=4, per_device_train_batch_size=4,
             gradient_accumulation_steps=2, max_sampling_rounds=1, passk_questions=2)


def make_parser(script_class: type = ToolR1Arguments):
    """The recipe parser (preset, YAML, command line) over ``script_class``, with :data:`DEFAULTS` as defaults."""
    from trl_rlvr.presets import on_this_machine
    from trl_rlvr.scripts.train import make_parser as make_recipe_parser

    return make_recipe_parser(script_class, on_this_machine(DEFAULTS))


def parse_args(argv=None, script_class: type = ToolR1Arguments):
    """Parse; ``--smoke`` replaces the defaults of the sizes it names that the command line leaves alone."""
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args, training_args, model_args = make_parser(script_class).parse_args_and_config(argv)
    if script_args.smoke:
        given = {a.lstrip("-").split("=", 1)[0] for a in argv if a.startswith("--")}
        for key, value in SMOKE.items():
            if key not in given and not (key == "num_eval_training_wordings" and script_args.task != "composed"):
                setattr(script_args if hasattr(script_args, key) else training_args, key, value)
    return script_args, training_args, model_args



# ------------------------------------------------------------------------------------------------ rewards
def tool_format(completions, **kwargs):
    """Format of a tool rollout: 1.0 when it ran at least one tool call and its last assistant turn holds exactly
    one ``\\boxed{}``; else 0.0. (The answer itself is ``boxed_math``'s.)"""
    from reward_plugins._text import completion_text
    from reward_plugins.boxed_math.boxes import find_boxes

    scores = []
    for completion in completions:
        messages = completion if isinstance(completion, list) else []
        called = any(isinstance(m, dict) and m.get("role") == "tool" for m in messages)
        scores.append(1.0 if called and len(find_boxes(completion_text(completion))) == 1 else 0.0)
    return scores


# ------------------------------------------------------------------------------------------------ data
def vllm_cpu_defaults(training_args) -> None:
    """With ``use_vllm`` on a CPU: 1 GiB of KV cache unless ``VLLM_CPU_KVCACHE_SPACE`` says otherwise (vLLM's CPU
    default takes a large share of the machine's memory; the job's 32 rollouts of <= 250 tokens need ~180 MiB in bf16)."""
    if training_args.use_vllm and training_args.use_cpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def question_rows(script_args) -> tuple[list[dict], list[dict]]:
    """The RL questions and the held-out ones of ``script_args.task``; with ``num_eval_training_wordings``, held-out
    rows carry ``wordings``: "training" (new problems in the RL wordings) or "unseen" (a trained sentence with its
    number format held out). These held-out rows are the dev split; with ``eval_split="test"`` the held-out rows are
    the test split instead (:func:`trl_rlvr.tasks.heldout_splits.rows_of_test_split`, kinds "training", "unseen" and
    "novel"), none a problem of the RL rows or of dev."""
    from trl_rlvr.tasks.word_problems import composed_new_questions, composed_rows, word_problem_rows

    seed = script_args.dataset_seed
    if script_args.task != "composed":
        return (word_problem_rows("train", script_args.num_train_samples, seed=seed,
                                  extra_rl_wordings=script_args.extra_rl_wordings),
                word_problem_rows("heldout", script_args.num_eval_samples, seed=seed))
    train = composed_rows("train", script_args.num_train_samples, seed=seed)
    heldout = composed_rows("heldout", script_args.num_eval_samples, seed=seed)
    if script_args.num_eval_training_wordings:
        new = composed_new_questions(script_args.num_eval_training_wordings, seed, train)
        heldout = [{**r, "wordings": "training"} for r in new] + [{**r, "wordings": "unseen"} for r in heldout]
    if script_args.eval_split == "test":
        from trl_rlvr.tasks.heldout_splits import rows_of_test_split

        return train, rows_of_test_split(seed, train + heldout, per_kind=script_args.test_per_kind)
    return train, heldout


def tool_rows(rows, system_prompt):
    """Conversational prompts (system, user) for the tool arm; the row's columns stay (the rewards read them)."""
    return [{**r, "prompt": [{"role": "system", "content": system_prompt}, {"role": "user", "content": r["question"]}]}
            for r in rows]


def plain_rows(rows, tokenizer):
    """The first main job's prompt (chat template, instruction + one-shot example, pre-filled ``<think>``)."""
    from trl_rlvr.scripts.data import format_prompt

    return [{**r, "prompt": format_prompt(r["question"], tokenizer, "chat_prefill")} for r in rows]


def dataset(rows):
    from datasets import Dataset

    keep = ("prompt", "question", "answer", "solution")
    return Dataset.from_list([{k: r[k] for k in keep} for r in rows])


def tool_tokenizer(path, template_file):
    """The model's tokenizer with a tool-rendering chat template and TRL's ``qwen3`` response template (how TRL
    parses ``<tool_call>{json}</tool_call>`` after ``<|im_start|>assistant\\n``)."""
    from trl.chat_template_utils import qwen3_template, supports_tool_calling

    from trl_rlvr.scripts.models import load_tokenizer

    tokenizer = load_tokenizer(path)
    tokenizer.chat_template = Path(template_file).read_text()
    tokenizer.response_template = qwen3_template
    if not supports_tool_calling(tokenizer):
        raise ValueError(f"chat_template {template_file}: it does not render a tool-calling conversation")
    return tokenizer


# ------------------------------------------------------------------------------------------------ stages
def cold_start(model_path, tokenizer, script_args, training_args, out_dir, tools):
    """SFT on ``sft_traces`` tool-calling traces (assistant-only loss,
    :func:`trl_rlvr.supervised.fine_tune.supervised_fine_tune`); the model and tokenizer saved to ``out_dir``.
    Returns the log history."""
    from trl_rlvr.supervised.fine_tune import supervised_fine_tune
    from trl_rlvr.tasks.word_problems import cold_start_traces, composed_cold_start_traces

    make = composed_cold_start_traces if script_args.task == "composed" else cold_start_traces
    traces = make(script_args.sft_traces, seed=script_args.dataset_seed, system_prompt=script_args.system_prompt)
    return supervised_fine_tune(model_path, tokenizer, [{"messages": t["messages"]} for t in traces], out_dir,
                                sft_settings(script_args, training_args), tools)


def sft_settings(script_args, training_args):
    """The cold start's SFT settings (``sft_*`` options; the run's seed, device, precision and model kwargs)."""
    from trl_rlvr.supervised.fine_tune import SFTSettings

    return SFTSettings(epochs=script_args.sft_epochs, learning_rate=script_args.sft_learning_rate,
                       batch_size=script_args.sft_batch_size, micro_batch_size=script_args.sft_micro_batch_size,
                       max_length=512, seed=training_args.seed, use_cpu=training_args.use_cpu, bf16=training_args.bf16,
                       model_init_kwargs=dict(training_args.model_init_kwargs))



#: What the tool job's step lines show (:class:`trl_rlvr.evaluation.heldout.StepProgressCallback`).
TOOL_STEP_FIELDS = (("rlvr/accuracy", "acc", "{:.2f}"), ("rewards/tool_format/mean", "format", "{:.2f}"),
                    ("rewards/think_format/mean", "format", "{:.2f}"), ("rlvr/tool_calls_per_rollout", "calls", "{:.2f}"),
                    ("rlvr/zero_signal_frac", "zero-signal", "{:.2f}"), ("completions/mean_length", "len", "{:.2f}"))


def tool_environment(script_args):
    """The environment factory of the tool arm: ``PythonEnvironment`` with the run's cell timeout; with
    ``short_tool_errors``, its ``error_reply="last_line"`` (ToRL's error replies, in training and evaluation)."""
    from functools import partial

    from reward_plugins.code_sandbox import PythonEnvironment

    return partial(PythonEnvironment, timeout=script_args.tool_timeout,
                   error_reply="last_line" if script_args.short_tool_errors else "full")


def build_rl_trainer(model_path, tokenizer, script_args, training_args, train_rows, tool: bool):
    """``RLVRTrainer`` for one arm: with the tool (``environment_factory=PythonEnvironment``, ``boxed_math`` +
    ``tool_format``) or without (``think_format`` + ``boxed_math``, pre-filled prompts); with ``async_rl``, the tool
    arm's ``RLVRAsyncTrainer`` (:func:`trl_rlvr.tasks.tool_async.build_async_rl_trainer`)."""

    from trl_rlvr.rewards.registry import load_reward
    from trl_rlvr.trainer import RLVRTrainer

    if tool:
        rewards = [load_reward("boxed_math"), tool_format]
        environment_factory = tool_environment(script_args)
    else:
        rewards = [load_reward("think_format", prefilled=True), load_reward("boxed_math", prefilled=True)]
        environment_factory = None
    if getattr(script_args, "reward_control", "none") == "shuffled":  # the lab's random-reward control
        from trl_rlvr.rewards.controls import shuffled_rewards

        if getattr(script_args, "async_rl", False):
            raise ValueError("reward_control runs synchronously only: leave async_rl off for the control")
        rewards = shuffled_rewards(rewards, seed=training_args.seed)
    if tool and getattr(script_args, "async_rl", False):
        from trl_rlvr.tasks.tool_async import build_async_rl_trainer

        return build_async_rl_trainer(model_path, tokenizer, script_args, training_args, rewards,
                                      dataset(train_rows), environment_factory)
    return RLVRTrainer(model=str(model_path), reward_funcs=rewards, args=training_args,
                       train_dataset=dataset(train_rows), processing_class=tokenizer,
                       environment_factory=environment_factory)


def evaluate_arm(trainer, tokenizer, rows, success_fn, format_fn, script_args, *, tool, n):
    """The held-out evaluation every arm gets: ``n`` samples per question at the training temperature and budget,
    seeded, of the trainer's current policy; with the tool, TRL's tool loop (:mod:`trl_rlvr.evaluation.tool_rollouts`).
    With ``use_vllm`` the samples come from the trainer's colocated vLLM engine, synced to the policy first."""

    from trl_rlvr.evaluation import evaluate_sampled
    from trl_rlvr.evaluation.vllm_generation import trainer_vllm_engine

    training_args = trainer.args
    extra = dict(environment_factory=tool_environment(script_args),
                 max_tool_calling_iterations=training_args.max_tool_calling_iterations) if tool else {}
    result = evaluate_sampled(
        trainer.model_wrapped, tokenizer, dataset(rows), success_fn, format_fn, n=n, accelerator=trainer.accelerator,
        temperature=training_args.temperature, max_new_tokens=training_args.max_completion_length,
        batch_size=script_args.eval_batch_size, seed=training_args.seed, keep_samples=2,
        llm=trainer_vllm_engine(trainer) if getattr(training_args, "use_vllm", False) else None, **extra,
    )
    result["pass@1_by_operation"] = pass1_by(rows, result["per_question"], "op")
    if any("wordings" in r for r in rows):
        result["pass@1_by_wordings"] = pass1_by(rows, result["per_question"], "wordings")
    if any("number_format" in r for r in rows):
        result["pass@1_by_number_format"] = pass1_by(rows, result["per_question"], "number_format")
    result["pass@1_intervals"] = pass1_intervals(rows, result["per_question"])
    return result


def pass1_by(rows, per_question, column):
    """Mean accuracy of the samples per value of the rows' ``column``: per arithmetic operation (``op``: ``*``,
    ``+``, ``-``), where an arm's errors are; per kind of held-out question (``wordings``: ``training``, new
    problems in the training wordings; ``unseen``, trained sentences with their number format held out; ``novel``,
    story frames and question forms no stage trained on); per number format (``number_format``: ``plain``,
    ``comma``, ``words``)."""
    right, total = {}, {}
    for record in per_question:
        key = rows[record["index"]][column]
        right[key] = right.get(key, 0) + record["right"]
        total[key] = total.get(key, 0) + len(record["right_flags"])
    return {key: right[key] / total[key] for key in sorted(total)}


def pass1_intervals(rows, per_question, confidence: float = 0.95) -> dict:
    """The bootstrap interval over questions (:func:`trl_rlvr.evaluation.intervals.bootstrap_interval`) of pass@1
    (``"all"``) and of each kind of held-out question (the rows' ``wordings``): label -> [low, high]."""
    from trl_rlvr.evaluation.intervals import bootstrap_interval, per_question_accuracy

    groups = {"all": per_question}
    for record in per_question:
        kind = rows[record["index"]].get("wordings")
        if kind is not None:
            groups.setdefault(kind, []).append(record)
    return {label: list(bootstrap_interval(per_question_accuracy(records), confidence=confidence))
            for label, records in groups.items()}


# ------------------------------------------------------------------------------------------------ outputs
def _pct(v):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1%}"


def _num(v, digits=1):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def arm_summary(result):
    """The table's figures of one evaluation (JSON-friendly)."""
    if result is None:
        return None
    tools = result.get("tools") or {}
    return {
        "pass@1": result["mean@n"], "n": result["n"], "questions": result["questions"],
        f"pass@{result['n']}": next((v for k, v in result["pass@k"].items() if str(k) == str(result["n"])), None),
        "format_rate": result["format_rate"], "truncated_frac": result["truncated_frac"],
        "length_right": result["length_right"], "length_wrong": result["length_wrong"],
        "tool_call_rate": tools.get("tool_call_rate"), "calls_per_answer": tools.get("calls_per_answer"),
        "tool_call_parse_rate": tools.get("tool_call_parse_rate"), "parse_failures": tools.get("parse_failures"),
        "tool_errors": (tools.get("call_failures") or 0) + (tools.get("env_errors") or 0) if tools else None,
        "tool_timeouts": tools.get("timeouts"), "tool_budget_frac": tools.get("tool_budget_frac"),
        **{f"pass@1 {op}": v for op, v in (result.get("pass@1_by_operation") or {}).items()},
        **{f"pass@1 {kind} wordings": v for kind, v in (result.get("pass@1_by_wordings") or {}).items()},
        **{f"pass@1 format {fmt}": v for fmt, v in (result.get("pass@1_by_number_format") or {}).items()},
        **{("pass@1 interval" if label == "all" else f"pass@1 {label} wordings interval"): v
           for label, v in (result.get("pass@1_intervals") or {}).items()},
    }


def _interval(v):
    return "-" if not v else f"{v[0]:.1%} to {v[1]:.1%}"


#: (label, arm_summary key, format). A row whose key no arm has is left out (the templates task has no kinds of
#: held-out question; the dev split has no novel wordings). The key "unseen wordings" is the committed runs' name
#: for trained sentences whose number format is held out (every such sentence is in the RL stream with its other
#: number format): the label says what the column holds.
ROWS = [
    ("held-out pass@1", "pass@1", _pct), ("  95% interval (bootstrap over questions)", "pass@1 interval", _interval),
    ("  new questions, training wordings", "pass@1 training wordings", _pct),
    ("    95% interval", "pass@1 training wordings interval", _interval),
    ("  trained sentences, number format held out", "pass@1 unseen wordings", _pct),
    ("    95% interval", "pass@1 unseen wordings interval", _interval),
    ("  new story frames and question forms", "pass@1 novel wordings", _pct),
    ("    95% interval", "pass@1 novel wordings interval", _interval),
    ("  numbers as digits (4821)", "pass@1 format plain", _pct),
    ("  thousands separators (4,821)", "pass@1 format comma", _pct),
    ("  a factor in words (fifty-two)", "pass@1 format words", _pct),
    ("  questions a * b", "pass@1 *", _pct), ("  questions a + b", "pass@1 +", _pct),
    ("  questions a - b", "pass@1 -", _pct), ("held-out pass@n", "pass@n", _pct), ("format rate", "format_rate", _pct),
    ("answers that ran a tool call", "tool_call_rate", _pct), ("tool calls per answer", "calls_per_answer", _num),
    ("tool-call turns that parse", "tool_call_parse_rate", _pct), ("turns that did not parse", "parse_failures", str),
    ("tool errors (calls)", "tool_errors", str), ("tool timeouts (calls)", "tool_timeouts", str),
    ("budget taken by tool replies", "tool_budget_frac", _pct), ("truncated answers", "truncated_frac", _pct),
    ("mean length, right (model tokens)", "length_right", _num),
    ("mean length, wrong (model tokens)", "length_wrong", _num),
]


def summary_table(arms: dict) -> str:
    """One column per arm (label -> arm_summary), one row per metric of :data:`ROWS`
    (:func:`trl_rlvr.evaluation.metric_table.text_table`'s layout)."""
    from trl_rlvr.evaluation.metric_table import text_table

    rows = []
    for name, key, fmt in ROWS:
        optional = key.startswith("pass@1 ") and key not in ("pass@1 *", "pass@1 +", "pass@1 -")
        if optional and not any(key in (arm or {}) for arm in arms.values()):
            continue  # a column no evaluation has (the templates task: one kind of held-out question)
        cells = []
        for arm in arms.values():
            value = (arm or {}).get(key if key != "pass@n" else f"pass@{(arm or {}).get('n')}")
            cells.append("-" if value is None else fmt(value))
        rows.append((name, cells))
    return text_table(list(arms), rows)


def save_curves(history, sft_history, path):
    from trl_rlvr.evaluation.report import plot_training_curves

    sft_loss = [(([h["step"] for h in sft_history], [h["loss"] for h in sft_history]), "o-", "loss")] if sft_history else []
    formats = [(k, ".--", k.split("/")[1]) for k in ("rewards/tool_format/mean", "rewards/think_format/mean")
               if any(k in h for h in history)]
    return plot_training_curves(history, [
        ("cold start: SFT loss", sft_loss),
        ("RL: reward / accuracy / format (training samples)",
         [("reward", "o-", "total reward"), ("rlvr/accuracy", ".--", "accuracy (boxed_math)"), *formats,
          ("rlvr/zero_signal_frac", ":", "zero-signal groups")]),
        ("RL: tool use", [("rlvr/tool_calls_per_rollout", "o-", "tool calls per rollout"),
                          ("rlvr/tool_errors_per_rollout", ".--", "tool errors per rollout"),
                          ("tools/failure_frequency", ":", "TRL tools/failure_frequency")]),
        ("RL: completion length", [("completions/mean_length", "o-", "model tokens, all"),
                                   ("rlvr/length_right", ".--", "right"), ("rlvr/length_wrong", ".--", "wrong")]),
    ], path)


def jsonable(obj):
    """``obj`` as JSON reads it back (keys as strings, other values by ``str``)."""
    return json.loads(json.dumps(obj, default=str))



def shown_arms(arms: dict, committed: dict | None, smoke: bool, model: str) -> tuple[dict, str]:
    """The table's columns and the line above it that says what each column is: this run's arms, after the
    committed no-tool arms (``[committed]``, from ``--arm r1zero`` on SmolLM2-135M) when there are any; in a smoke
    run this run's columns are marked ``[smoke]`` (a tiny model, one short step per stage: they test the code path,
    not the method)."""
    ran = {f"{label} [smoke]": arm for label, arm in arms.items()} if smoke else dict(arms)
    old = {f"{label} [committed]": arm for label, arm in (committed or {}).get("arms", {}).items()}
    parts = []
    if smoke:
        parts.append(f"SMOKE RUN: the [smoke] columns are this run's, on {model} with one short step per stage; "
                     "their figures test the code path, not the method")
    else:
        parts.append(f"this run's columns: {model}")
    if old:
        source = Path(str(committed.get("model") or "the committed model")).name
        parts.append(f"the [committed] columns are {source}'s, from the committed `--arm r1zero` run "
                     "(examples/results/tool_r1_r1zero_metrics.json), not this run")
    return old | ran, "; ".join(parts) + "."


def large_k_comparison(evals: dict, passk_samples: int, passk_questions: int, plot_path: Path | None) -> dict | None:
    """The large-k evaluation's figures (``evals``' labels with ``", n=<k>"``): pass@k per arm, the sentence on the
    first vs the last arm (:func:`trl_rlvr.evaluation.report.compare_sentence`) and the pass@k plot (None: not
    drawn); None without a large-k evaluation."""
    large = {label.split(", n=")[0]: r for label, r in evals.items() if ", n=" in label}
    if not large:
        return None
    from trl_rlvr.evaluation.report import compare_sentence, plot_passk

    labels = list(large)
    return {
        "n": passk_samples, "questions": passk_questions,
        "pass@k": {label: r["pass@k"] for label, r in large.items()},
        "sentence": compare_sentence(large[labels[0]], large[labels[-1]], labels[0], labels[-1]),
        # as the committed runs record it: the string "None" when no plot was drawn
        "plot": str(plot_passk(large, plot_path, title=f"held-out pass@k, {passk_questions} questions")
                    if plot_path is not None else None),
    }
