"""Sampled evaluation on a running vLLM server (``trl-rlvr eval --vllm_server URL``, ``SampledEvalCallback`` on a
trainer in ``vllm_mode="server"``), against the real server of tests/engines/conftest.py on a CPU.

- the samples come from the server: its own counters (requests, generated tokens) grow by exactly the samples and
  tokens the evaluation received, and the training model's ``generate`` is never called;
- they are seeded as on the colocated engine: a sample depends on (seed, question, sample) only (the same samples
  again, and with the questions in another order), another seed gives other samples;
- the tool loop's turns go to the server too (one request per turn), seeded alike;
- ``trl-rlvr eval --vllm_server`` writes the numbers ``evaluate_sampled`` computes on the server;
- the callback evaluates a server-mode trainer after pushing the step's weights: at its evaluation the served
  weights equal the trainer's, which the step's update moved.
Optional: skipped without vLLM (its own venv, as tests/engines/test_vllm_cpu.py; `.ci/run` runs this file there).
"""

import functools
import importlib.util
import json
import sys

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed (vllm-cpu, own venv)"),
]

PROMPTS = [f"Q: what is {a} + {a}? A:" for a in range(6)]
NORM = "model.norm.weight"


class Recorded:
    """A :class:`~trl_rlvr.evaluation.vllm_served.ServedEngine` on the server whose client records what it
    received, and the server's counters over a block."""

    def __init__(self, model_dir, server):
        from trl_rlvr.evaluation.vllm_served import ServedEngine
        from trl_rlvr.testing import load_tool_tokenizer

        self.server, self.engine = server, ServedEngine(server.base_url)
        self.tokenizer = load_tool_tokenizer(model_dir)  # the model's tokenizer, with the tool chat template
        self.received = []
        generate = self.engine.client.generate

        def recorded(prompts, **kwargs):
            output = generate(prompts, **kwargs)
            self.received.append(output["completion_ids"])
            return output

        self.engine.client.generate = recorded

    def counted(self, run):
        """``run()``'s result, the server's counter increments over it, and the completions received during it."""
        self.received.clear()
        before = self.server.counters()
        result = run()
        return result, {k: v - before[k] for k, v in self.server.counters().items()}, list(self.received)


@pytest.fixture(scope="module")
def served(vllm_server):
    return Recorded(*vllm_server)


def _sample(served, prompts, qids, **overrides):
    from trl_rlvr.evaluation.generation import end_of_sequence_ids
    from trl_rlvr.evaluation.vllm_generation import generate_completions_vllm

    settings = dict(n=3, temperature=1.0, max_new_tokens=8, seed=5)
    settings.update(overrides)
    eos = end_of_sequence_ids(None, served.tokenizer)
    groups = generate_completions_vllm(served.engine, served.tokenizer, prompts, qids, eos_ids=eos, **settings)
    return [[sample[1] for sample in group] for group in groups]


def test_the_samples_come_from_the_server_seeded_by_seed_question_and_sample(served):
    requests, tokens = served.engine.cpu_call_limits()  # read from the server: it runs on a CPU, waves apply
    assert 0 < requests < tokens and served.engine.max_model_len == 256
    together, counted, received = served.counted(lambda: _sample(served, PROMPTS, list(range(6))))
    assert len(received) == 18 and all(len(r) == 1 for r in received)  # one request per sample
    assert counted["requests"] == 18
    assert counted["generation_tokens"] == sum(len(ids) for r in received for ids in r) > 18
    assert _sample(served, PROMPTS, list(range(6))) == together
    assert _sample(served, PROMPTS[::-1], list(range(6))[::-1])[::-1] == together
    assert len({tuple(s) for group in together for s in group}) > 6  # the samples of a question differ
    assert _sample(served, PROMPTS, list(range(6)), seed=6) != together


@pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")
def test_tool_rollouts_take_their_turns_on_the_server_seeded(served):
    from reward_plugins.code_sandbox import PythonEnvironment
    from tests.harness.tool_eval_harness import boxed_product, questions
    from trl_rlvr.evaluation import evaluate_sampled

    def run(seed):
        result = evaluate_sampled(None, served.tokenizer, questions().select(range(3)), boxed_product, n=2,
                                  seed=seed, max_new_tokens=24, llm=served.engine, keep_samples=2,
                                  environment_factory=functools.partial(PythonEnvironment, timeout=5.0))
        result.pop("seconds")
        return result

    result, counted, received = served.counted(lambda: run(0))
    assert result["tools"]["samples"] == 6
    assert counted["requests"] == len(received) >= 6  # every turn of every rollout a request of the server's
    assert counted["generation_tokens"] == sum(len(ids) for r in received for ids in r) > 0
    assert run(0) == result
    assert run(1)["per_question"] != result["per_question"]


def test_cli_eval_on_the_server_writes_the_functions_numbers(served, vllm_server, tmp_path, capsys):
    from trl_rlvr.evaluation.evaluate import evaluate_sampled
    from trl_rlvr.scripts import eval as eval_cli
    from trl_rlvr.scripts.cli import main

    model_dir, server = vllm_server
    data = tmp_path / "questions.jsonl"  # ready prompts, short enough for the server's 256-token context
    data.write_text("\n".join(json.dumps({"question": f"{a} + {a}", "answer": str(2 * a), "prompt": f"{a} + {a} ="})
                              for a in range(4)))
    options = ["--dataset", str(data), "--prompt_column", "prompt", "--format_reward", "none"]
    out = tmp_path / "out"
    argv = ["eval", model_dir, "--vllm-server", server.base_url, *options, "--n", "3", "--max_new_tokens", "10",
            "--seed", "2", "--no_plot", "--no_progress", "--output_dir", str(out)]
    code, counted, _ = served.counted(lambda: main(argv))
    assert code == 0, capsys.readouterr().err
    (result,) = json.loads((out / "eval.json").read_text())["models"].values()
    assert result["generator"] == "vllm_server" and counted["requests"] == 12

    ns = eval_cli.add_parser(__import__("argparse").ArgumentParser().add_subparsers()).parse_args([model_dir, *options])
    ns.prompt_style = eval_cli.default_prompt_style(ns)  # as main() resolves it
    success_fn, _ = eval_cli.eval_rewards(ns)
    engine, tokenizer = eval_cli.load_served_engine(model_dir, server.base_url)
    rows = eval_cli.with_prompts(eval_cli.load_rows(ns), tokenizer, ns.prompt_style)
    direct = evaluate_sampled(None, tokenizer, rows, success_fn, n=3, max_new_tokens=10, seed=2, llm=engine)
    assert [q["lengths"] for q in direct["per_question"]] == [q["lengths"] for q in result["per_question"]]
    assert direct["pass@k"] == {int(k): v for k, v in result["pass@k"].items()}


def ord_sum_reward(completions, **kwargs):
    """A reward with signal in almost every group: the character codes of the answer, mod 7."""
    return [float(sum(map(ord, c)) % 7) for c in completions]


def test_the_callback_evaluates_a_server_mode_trainer_on_its_server_after_the_push(vllm_server):
    from tests.harness.loss_harness import make_trainer
    from trl_rlvr._compat.vllm_server import served_parameter_matches
    from trl_rlvr.evaluation.callback import SampledEvalCallback

    model_dir, server = vllm_server
    trainer = make_trainer(model_dir, reward_funcs=[ord_sum_reward], use_vllm=True, vllm_mode="server",
                           vllm_server_base_url=server.base_url, use_cpu=True, learning_rate=5e-2, max_steps=1,
                           per_device_train_batch_size=8, max_completion_length=8)

    def hf_generate(*args, **kwargs):
        raise AssertionError("the training model's generate was called: the server was not used")

    trainer.model.generate = hf_generate
    norm = next(p for n, p in trainer.model.named_parameters() if n.endswith(NORM))
    initial = norm.detach().clone()
    rows = [{"question": f"q{i}", "answer": "", "prompt": f"q{i}: {i} + {i} ="} for i in range(3)]
    callback = SampledEvalCallback(trainer, rows, n=2, eval_steps=1, max_new_tokens=4, generator="vllm")
    trainer.add_callback(callback)
    evaluations, evaluate = [], callback.evaluate

    def checked_evaluate(state):
        before = server.counters()
        result = evaluate(state)
        evaluations.append({"step": state.global_step, "questions": result["questions"],
                            "requests": server.counters()["requests"] - before["requests"],
                            "served_is_trained": served_parameter_matches(server.base_url, NORM, norm),
                            "moved": (norm.detach() - initial).abs().max().item()})
        return result

    callback.evaluate = checked_evaluate
    trainer.train()
    (evaluation,) = evaluations
    assert evaluation["step"] == 1 and evaluation["questions"] == 3
    assert evaluation["requests"] == 6  # 3 questions x 2 samples, on the server (HF generate raised throughout)
    assert evaluation["served_is_trained"] and evaluation["moved"] > 1e-3, evaluation  # equal only after the push
    assert [h["step"] for h in trainer.state.log_history if "eval/pass@1" in h] == [1]
