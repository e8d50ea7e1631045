"""Sampled evaluation of tool rollouts on one or more processes (``accelerate launch``): the scripted tool-using
tiny model, the sandboxed Python tool, the result as JSON (written by the main process).

    python -m tests.harness.tool_eval_harness MODEL_DIR OUT.json BATCH_SIZE
"""

from __future__ import annotations

import functools
import json
import sys


def questions():
    from datasets import Dataset

    pairs = [(12, 34), (56, 78), (91, 23), (45, 67), (11, 99), (38, 72), (64, 15)]
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {a}*{b}?"}], "question": f"{a}*{b}",
                               "answer": str(a * b)} for a, b in pairs])


def boxed_product(completions, answer, **kwargs):
    """1 when the last assistant turn boxes the product (the tiny model only gets it from the tool's reply)."""
    return [float(f"\\boxed{{{gold}}}" in turns[-1]["content"]) for turns, gold in zip(completions, answer)]


def run(model_dir, batch_size=8, accelerator=None, **overrides):
    from reward_plugins.code_sandbox import PythonEnvironment
    from trl_rlvr.evaluation import evaluate_sampled
    from trl_rlvr.testing.scripted_tool_model import load_scripted_tool_model

    model, tokenizer = load_scripted_tool_model(model_dir)
    settings = dict(n=4, max_new_tokens=160, batch_size=batch_size, seed=0, keep_samples=7, accelerator=accelerator,
                    environment_factory=functools.partial(PythonEnvironment, timeout=5.0))
    settings.update(overrides)
    return evaluate_sampled(model, tokenizer, questions(), boxed_product, **settings)


if __name__ == "__main__":
    from trl_rlvr.scripts.distributed import distributed_state

    state = distributed_state()
    result = run(sys.argv[1], int(sys.argv[3]), accelerator=state)
    if state.is_main_process:
        result.pop("seconds")
        with open(sys.argv[2], "w") as f:
            json.dump({"num_processes": state.num_processes, "result": result}, f)
