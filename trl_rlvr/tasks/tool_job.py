"""One run of the tool job, stage by stage: what examples/tool_r1.py (the recipe) and benchmarks.tool_arms (its lab)
both do, written once.

A :class:`ToolJob` sets a run up (threads, output folder, model path, the questions of ``script_args.task``), times
each stage (``timings``: seconds per stage, in the order they ran, then ``total``), keeps the held-out evaluations
(``evals``: label -> :func:`~trl_rlvr.tasks.tool_arithmetic.evaluate_arm` result) and the logs of the cold start
and of RL, and writes what the run found (``<name>_metrics.json``, the curves, the printed table). The caller
composes the stages (the recipe: cold start, tool RL, evaluations; the lab: its arms and controls) and may pass
``after_stage(name)``, called after each timed stage (the lab records its peak memory there).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path

from trl_rlvr.tasks.tool_arithmetic import (
    TOOL_STEP_FIELDS,
    arm_summary,
    cold_start,
    evaluate_arm,
    jsonable,
    large_k_comparison,
    question_rows,
    save_curves,
    tool_format,
    tool_rows,
    tool_tokenizer,
    vllm_cpu_defaults,
)


class ToolJob:
    """The tool job's run in progress (see the module's docstring)."""

    def __init__(self, script_args, training_args, model_args, after_stage: Callable[[str], None] | None = None):
        from trl_rlvr.scripts.distributed import distributed_state
        from trl_rlvr.scripts.models import resolve_model_path
        from trl_rlvr.scripts.train import use_cpu_threads

        self.t_start = time.time()
        self.script_args, self.training_args = script_args, training_args
        self.async_rl = getattr(script_args, "async_rl", False)  # the RL stage on RLVRAsyncTrainer (tool_async)
        self.after_stage = after_stage or (lambda name: None)
        self.timings: dict[str, float] = {}
        self.evals: dict[str, dict] = {}
        self.sft_history: list[dict] = []
        self.trainer = self.tokenizer = self.progress = self.train_result = self.server_record = None
        self.state = distributed_state(training_args.use_cpu)
        use_cpu_threads(script_args.cpu_threads, self.state.num_processes)
        self.is_main = self.state.is_main_process
        self.out = Path(training_args.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        training_args.model_init_kwargs = {"dtype": model_args.dtype or "float32",
                                           **(training_args.model_init_kwargs or {})}
        vllm_cpu_defaults(training_args)
        with self.state.main_process_first():
            self.base_path = resolve_model_path(model_args.model_name_or_path, quiet=not self.is_main)
        self.train_questions, self.heldout = question_rows(script_args)

    def say(self, *objects) -> None:
        """Print on the main process."""
        if self.is_main:
            print(*objects, flush=True)

    @contextmanager
    def stage(self, name: str):
        """Time a stage into ``timings[name]``; then ``after_stage(name)``."""
        t = time.time()
        yield
        self.timings[name] = time.time() - t
        self.after_stage(name)

    # -------------------------------------------------------------------------------------------- stages
    def tool_data(self):
        """The tool arm's tokenizer (a chat template that renders tools) and its held-out and RL rows as (system,
        user) conversations -> (eval_rows, train_rows)."""
        args = self.script_args
        self.tokenizer = tool_tokenizer(self.base_path, args.chat_template)
        self.tokenizer.truncation_side = "left"
        return tool_rows(self.heldout, args.system_prompt), tool_rows(self.train_questions, args.system_prompt)

    def cold_start(self) -> Path:
        """SFT on tool-calling traces (:func:`~trl_rlvr.tasks.tool_arithmetic.cold_start`), saved to
        ``output_dir/cold_start`` -> that path."""
        from transformers.utils import get_json_schema

        from reward_plugins.code_sandbox import PythonEnvironment
        from trl_rlvr.evaluation import release_memory

        path = self.out / "cold_start"
        tools = [get_json_schema(PythonEnvironment.python)]
        with self.stage("cold start (SFT)"):
            self.sft_history = cold_start(self.base_path, self.tokenizer, self.script_args, self.training_args, path,
                                          tools)
        history = self.sft_history
        self.say(f"cold start: {len(history)} SFT steps in {self.timings['cold start (SFT)']:.0f}s, loss "
                 f"{history[0]['loss']:.3f} -> {history[-1]['loss']:.3f}")
        release_memory()
        return path

    def evaluate(self, label: str, stage: str, rows, success, fmt, *, tool: bool, n: int) -> dict:
        """The held-out evaluation of the trainer's policy now (``n`` samples per question), timed as ``stage``,
        kept as ``evals[label]``."""
        from trl_rlvr.evaluation.heldout import format_metric

        with self.stage(stage), self.evaluable_model():
            result = evaluate_arm(self.trainer, self.tokenizer, rows, success, fmt, self.script_args, tool=tool, n=n)
        self.evals[label] = result
        self.say(f"  {label}: pass@1 {format_metric(result['mean@n'], pct=True)}")
        return result

    def evaluable_model(self):
        """A context in which the trainer's model generates as a plain model: with ``async_rl``, TRL's tree attention
        (packed rows only) set aside (:func:`trl_rlvr._compat.async_adapter.plain_attention`)."""
        if not self.async_rl:
            return nullcontext()
        from trl_rlvr._compat.async_adapter import plain_attention

        return plain_attention(self.trainer.model)

    def evaluate_tool(self, label: str, when: str, rows) -> None:
        """The tool arm's evaluation (``boxed_math``, ``tool_format``), timed as ``eval <when>``; with
        ``passk_samples``, the large-k one of the first ``passk_questions`` questions too (``<label>, n=<k>``)."""
        from trl_rlvr.rewards.registry import load_reward

        args, success = self.script_args, load_reward("boxed_math")
        self.evaluate(label, f"eval {when}", rows, success, tool_format, tool=True, n=args.eval_num_samples)
        if args.passk_samples:
            self.evaluate(f"{label}, n={args.passk_samples}", f"large-k eval {when}", rows[:args.passk_questions],
                          success, tool_format, tool=True, n=args.passk_samples)

    def train(self):
        """RL (``trainer.train()``, one line per step), timed as ``RL``; then Adam's moments (twice the model's
        size) are dropped before the evaluation, whose KV caches would otherwise come on top of them (the job saves
        the model, not a checkpoint). With ``async_rl``, the vLLM server runs meanwhile on its own cores
        (:func:`trl_rlvr.tasks.tool_async.rl_server`; its start timed as ``vLLM server start``)."""
        from trl_rlvr.evaluation import release_memory
        from trl_rlvr.evaluation.heldout import StepProgressCallback

        self.progress = StepProgressCallback(TOOL_STEP_FIELDS, bar=False, say=self.say).install(self.trainer)
        server = nullcontext()
        if self.async_rl:
            from trl_rlvr.tasks.tool_async import rl_server

            server = rl_server(self.trainer, self.script_args, str(self.out / "vllm_server"))
        with server as served:
            if served is not None:
                self.timings["vLLM server start"] = served.startup_s
                self.say(f"vLLM server {served.base_url} up in {served.startup_s:.0f}s (log {served.log_path})")
            t = time.time()
            self.train_result = self.trainer.train()
            self.timings["RL"] = time.time() - t
            if served is not None:
                self.server_record = server_record(served)
        self.trainer.optimizer.state.clear()
        release_memory()
        self.after_stage("RL")
        return self.train_result

    def finish(self) -> None:
        """Save the trained model (``save_model``) to ``output_dir/rl``; the run's ``total`` time."""
        if self.script_args.save_model:
            self.trainer.save_model(str(self.out / "rl"))
        self.timings["total"] = time.time() - self.t_start
        self.after_stage("total")

    # -------------------------------------------------------------------------------------------- outputs
    def arms(self) -> dict:
        """The table's metrics of each evaluation (:func:`~trl_rlvr.tasks.tool_arithmetic.arm_summary`), the
        large-k ones left out."""
        return {label: arm_summary(r) for label, r in self.evals.items() if ", n=" not in label}

    def large_k(self) -> dict | None:
        """The large-k comparison (:func:`~trl_rlvr.tasks.tool_arithmetic.large_k_comparison`), with its plot."""
        args = self.script_args
        plot = self.out / "tool_r1_passk.png" if args.plot else None
        return large_k_comparison(self.evals, args.passk_samples, args.passk_questions, plot)

    def metrics(self, arms: dict, table: str, passk: dict | None, **extra) -> dict:
        """The metrics JSON: the arms and their table, the evaluations (without per-question records), the logs,
        the timings and the arguments; ``extra`` (the lab's) before the arguments."""
        return {
            "model": self.base_path, "num_processes": self.state.num_processes, "arms": arms, "table": table,
            "passk_large": passk, "cold_start_history": self.sft_history, "history": self.progress.history,
            "train_metrics": self.train_result.metrics,
            "evaluations": {label: {k: v for k, v in r.items() if k != "per_question"}
                            for label, r in self.evals.items()},
            "timings_s": {k: round(v, 1) for k, v in self.timings.items()},
            **({"vllm_server": self.server_record} if self.server_record else {}), **extra,
            "script_args": asdict(self.script_args),
            "training_args": {k: v for k, v in self.rl_args().to_dict().items()
                              if isinstance(v, (int, float, str, bool, type(None), list, dict))},
        }

    def rl_args(self):
        """The RL trainer's arguments: the run's ``RLVRConfig``, or with ``async_rl`` the ``RLVRAsyncConfig`` made
        from it."""
        return self.trainer.args if self.async_rl else self.training_args

    def write(self, name: str, metrics: dict, curves: str) -> Path | None:
        """``output_dir/<name>`` (the metrics as JSON) and, with ``plot``, the curves PNG -> its path or None."""
        (self.out / name).write_text(json.dumps(jsonable(metrics), indent=1))
        if not self.script_args.plot:
            return None
        return save_curves(self.progress.history, self.sft_history, self.out / curves)

    def report(self, heading: str, table: str, sentences, name: str, plot, notes: dict | None = None) -> None:
        """Print the evaluation's settings, the table under its heading, the sentences that are not None, the
        timings (each with ``notes[stage]`` after it) and where the files are."""
        args = self.training_args
        print(f"\nheld-out evaluation: {len(self.heldout)} questions x {self.script_args.eval_num_samples} samples, "
              f"temperature {args.temperature}, budget {args.max_completion_length} tokens")
        print(heading)
        print(table)
        for sentence in sentences:
            if sentence:
                print(sentence)
        for k, v in self.timings.items():
            print(f"time: {k}: {v:.0f} s" + (notes or {}).get(k, ""))
        print(f"metrics: {self.out / name}" + (f"   curves: {plot}" if plot else ""))


def server_record(server) -> dict:
    """What the RL stage's vLLM server did, from the server itself: its start time, the cores its process may use
    and this process's, its own counts (requests, prompt and generation tokens: Prometheus ``/metrics``)."""
    return {"startup_s": round(server.startup_s, 1), "server_cores": sorted(os.sched_getaffinity(server.process.pid)),
            "trainer_cores": sorted(os.sched_getaffinity(0)), "counters": server.counters()}
