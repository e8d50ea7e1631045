"""Sampled evaluation on the tiny model: seeded per-question sampling, 1 process == 2 processes, the
``trl-rlvr eval`` CLI (JSON + PNG), maj@k not defined without the voting interface, and the training callback."""

import json
import math
from pathlib import Path

import pytest

from tests.harness.eval_helpers import first_char, first_char_no_vote
from tests.harness.launch import launch_on_cpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from trl_rlvr.testing import load_tokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval(), load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def questions():
    from datasets import Dataset

    rows = [{"question": f"What is {a} + {a}?", "answer": str(2 * a)} for a in range(7)]
    return Dataset.from_list([{**r, "prompt": f"Q: {r['question']} A:"} for r in rows])


def _sampled(tiny, questions, **kw):
    from trl_rlvr.evaluation.evaluate import evaluate_sampled

    settings = dict(n=4, max_new_tokens=6, batch_size=8, seed=3)
    settings.update(kw)
    return evaluate_sampled(tiny[0], tiny[1], questions, first_char, None, **settings)


def _numbers(result):
    return {k: v for k, v in result.items() if k not in ("seconds",)}


def test_samples_do_not_depend_on_batching_and_metrics_are_consistent(tiny, questions):
    a = _sampled(tiny, questions, batch_size=4)  # one question per generate call
    b = _sampled(tiny, questions, batch_size=64)  # all questions in one call, padded together
    assert [q.get("samples") for q in a["per_question"]] == [q.get("samples") for q in b["per_question"]]
    assert _numbers(a) == _numbers(b)
    c = _sampled(tiny, questions, seed=4)
    assert [q["lengths"] for q in c["per_question"]] != [q["lengths"] for q in a["per_question"]] or \
        [q.get("samples") for q in c["per_question"]] != [q.get("samples") for q in a["per_question"]]
    # the toy reward gives the random model a non-trivial score, so the checks below mean something
    assert 0 < a["mean@n"] < 1
    assert a["ks"] == [1, 2, 4]
    assert a["pass@k"][1] == pytest.approx(a["mean@n"])
    assert a["pass@k"][1] <= a["pass@k"][2] <= a["pass@k"][4]
    assert a["maj@k"][1] == pytest.approx(a["pass@k"][1])  # one vote: the sample's own verdict
    per_q = a["per_question"]
    assert len(per_q) == len(questions) and [q["index"] for q in per_q] == list(range(len(questions)))
    assert a["pass@k"][4] == pytest.approx(sum(q["right"] > 0 for q in per_q) / len(per_q))
    assert a["truncated_frac"] == pytest.approx(sum(not f for q in per_q for f in q["finished"]) / (4 * len(per_q)))
    assert a["format_rate"] is None


def test_sampler_respects_temperature_top_k_and_top_p(tiny, questions):
    import torch

    from trl_rlvr.evaluation.evaluate import evaluate
    from trl_rlvr.evaluation.generation import SeededSampler

    greedy = evaluate(tiny[0], tiny[1], questions, first_char, max_new_tokens=6)
    for kw in (dict(top_k=1), dict(top_p=1e-9), dict(temperature=1e-4)):
        r = _sampled(tiny, questions, keep_samples=len(questions), **kw)
        for q in r["per_question"]:
            assert len(set(q["samples"])) == 1  # every sample is the argmax path
        assert r["mean@n"] == greedy["accuracy"]
    scores = torch.tensor([[0.0, 1.0, -math.inf, 2.0]] * 2000)
    sampler = SeededSampler([str(i) for i in range(2000)], temperature=1.0, top_k=2)
    picked = sampler(None, scores).argmax(-1)
    assert set(picked.tolist()) == {1, 3}  # never the -inf token, never outside the top 2
    share = (picked == 3).float().mean().item()
    assert abs(share - math.e / (1 + math.e)) < 0.05
    with pytest.raises(ValueError, match="temperature must be > 0"):
        SeededSampler(["0"], temperature=0.0)
    with pytest.raises(ValueError, match="k=8 > n=4"):
        _sampled(tiny, questions, ks=[1, 8])


def test_maj_at_k_is_reported_as_not_defined_without_the_voting_interface(tiny, questions):
    from trl_rlvr.evaluation.evaluate import evaluate_sampled

    r = evaluate_sampled(tiny[0], tiny[1], questions, first_char_no_vote, None, n=2, max_new_tokens=4, seed=3)
    assert r["maj@k"] is None and "maj@k not defined" in r["maj_note"] and "first_char_no_vote" in r["maj_note"]
    assert r["pass@k"][1] > 0


def _cli_args(model_a, model_b, out):
    return ["eval", str(model_a), str(model_b), "--label", "base", "--label", "other", "--dataset", "arithmetic",
            "--num_questions", "5", "--reward", "tests.harness.eval_helpers:first_char", "--format_reward", "think_format",
            "--n", "4", "--k", "1", "2", "4", "--max_new_tokens", "6", "--seed", "1", "--batch_size", "8",
            "--output_dir", str(out), "--no_progress"]


@pytest.fixture(scope="module")
def second_model(tmp_path_factory):
    from trl_rlvr.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model_b"), seed=1)


@pytest.mark.slow
def test_cli_writes_json_and_plot_and_two_processes_give_the_same_numbers(tiny_model_dir, second_model, tmp_path, capsys):
    from trl_rlvr.scripts.cli import main

    one = tmp_path / "one"
    assert main(_cli_args(tiny_model_dir, second_model, one)) == 0
    table = capsys.readouterr().out
    assert "pass@4" in table and "maj@2" in table and "base" in table and "other" in table
    report = json.loads((one / "eval.json").read_text())
    assert report["num_processes"] == 1 and list(report["models"]) == ["base", "other"]
    for r in report["models"].values():
        assert set(r["pass@k"]) == {"1", "2", "4"} and r["format_rate"] is not None
        assert r["questions"] == 5 and r["n"] == 4
    png = one / "passk.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    two = tmp_path / "two"
    launch_on_cpu("-m", "trl_rlvr.scripts.cli", *_cli_args(tiny_model_dir, second_model, two), cwd=ROOT, timeout=300)
    report2 = json.loads((two / "eval.json").read_text())
    assert report2["num_processes"] == 2
    for label in ("base", "other"):
        a, b = report["models"][label], report2["models"][label]
        a.pop("seconds"), b.pop("seconds")
        assert a == b, label


def test_cli_rejects_bad_input_with_a_clear_error(tiny_model_dir, tmp_path, capsys):
    from trl_rlvr.scripts.cli import main

    base = ["eval", str(tiny_model_dir), "--output_dir", str(tmp_path), "--no_progress"]
    assert main([*base, "--n", "4", "--k", "8"]) == 2
    assert "k=8 > n=4" in capsys.readouterr().err
    assert main([*base, "--reward", "boxed_maths"]) == 2
    assert "Did you mean 'boxed_math'" in capsys.readouterr().err
    assert main([*base, "--reward_option", "think_format.prefiled=true"]) == 2
    assert "prefiled" in capsys.readouterr().err
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"q": "1+1", "answer": "2"}\n')
    assert main([*base, "--dataset", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "no column ['question']" in err and str(bad) in err
    assert main(["eval", str(tiny_model_dir), str(tiny_model_dir), "--label", "a"]) == 2
    assert "1 --label for 2 models" in capsys.readouterr().err
    assert main([*base, "--vllm", "--vllm-server", "http://127.0.0.1:1"]) == 2
    assert "give one" in capsys.readouterr().err
    assert main([*base[:2], str(tiny_model_dir), "--label", "a", "--label", "b", "--vllm_server", "http://h:1"]) == 2
    assert "a server serves one model, got 2" in capsys.readouterr().err


def test_cli_reads_a_local_jsonl_with_column_mapping(tiny_model_dir, tmp_path):
    from trl_rlvr.scripts.cli import main

    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{i} + 1", "solution": f"x #### {i + 1}"}) + "\n" for i in range(3)))
    out = tmp_path / "out"
    assert main(["eval", str(tiny_model_dir), "--dataset", str(data), "--question_column", "problem",
                 "--answer_column", "solution", "--n", "2", "--max_new_tokens", "4", "--output_dir", str(out),
                 "--no_progress", "--no_plot"]) == 0
    r = json.loads((out / "eval.json").read_text())["models"][Path(tiny_model_dir).name]
    assert [q["answer"] for q in r["per_question"]] == ["1", "2", "3"]  # GSM8K-style references reduced
    assert r["maj@k"] is not None  # boxed_math: defined (the random model has no answers: 0)
    assert r["no_answer_frac"] == 1.0


@pytest.mark.slow
def test_callback_logs_eval_keys_through_the_trainer_log(tiny_model_dir, questions):
    from transformers import TrainerCallback

    from tests.harness.loss_harness import make_trainer
    from trl_rlvr.evaluation.callback import SampledEvalCallback

    trainer = make_trainer(tiny_model_dir, reward_funcs=[first_char], max_steps=2)

    class Recorder(TrainerCallback):  # stands for a report_to integration: it sees what on_log gets
        logs = []

        def on_log(self, args, state, control, logs=None, **kw):
            self.logs.append((state.global_step, dict(logs)))

    recorder = Recorder()
    trainer.add_callback(recorder)
    cb = SampledEvalCallback(trainer, questions, n=2, max_new_tokens=4, eval_steps=1, at_start=True)
    trainer.add_callback(cb)
    trainer.train()
    evals = [(step, logs) for step, logs in recorder.logs if "eval/pass@1" in logs]
    assert [step for step, _ in evals] == [0, 1, 2]
    for _, logs in evals:
        assert {"eval/pass@1", "eval/pass@2", "eval/maj@1", "eval/maj@2"} <= set(logs)
        assert not any(k.startswith("rewards/") for k in logs)  # the training metrics stay in the training log
    train_logs = [logs for _, logs in recorder.logs if "reward" in logs]
    assert len(train_logs) == 2  # GRPO's own per-step training logs are intact
    assert [h for h in trainer.state.log_history if "eval/pass@1" in h][-1]["eval/pass@1"] == evals[-1][1]["eval/pass@1"]
    with pytest.raises(ValueError, match="success_reward 'boxed_math' is not one of the trainer's rewards"):
        SampledEvalCallback(trainer, questions, success_reward="boxed_math", eval_steps=1)


def test_load_model_reads_a_checkpoint_and_a_peft_adapter_on_its_base(tiny_model_dir, tmp_path):
    """`trl-rlvr eval` takes a checkpoint directory or a PEFT adapter directory (tokenizer from its base)."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from trl_rlvr.scripts.eval import load_model

    model, tokenizer = load_model(str(tiny_model_dir), "float32", "cpu")
    assert not model.training and model.dtype == torch.float32 and tokenizer.pad_token_id is not None

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    lora = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")  # no tokenizer files beside it
    loaded, tokenizer = load_model(str(tmp_path / "adapter"), "float32", "cpu")
    assert isinstance(loaded, PeftModel) and not loaded.training
    assert tokenizer.pad_token_id is not None  # read from the base model's directory
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, lora.eval()(input_ids=ids).logits, atol=1e-5)
