"""Sampled evaluation of multi-turn tool rollouts (``evaluate_sampled(environment_factory=...)``) on the tiny model
driven to use the tool (``trl_rlvr.testing.scripted_tool_model``) with the sandboxed ``PythonEnvironment``:
seeded per sample and turn, the same whatever the batching or the split over processes, and its tool figures
agree with the transcripts."""

import json
import sys
from pathlib import Path

import pytest

from tests.harness.launch import launch_on_cpu
from tests.harness.tool_eval_harness import boxed_product, questions, run

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def batched(tiny_model_dir):
    return run(tiny_model_dir, batch_size=4), run(tiny_model_dir, batch_size=64)


def _numbers(result):
    return {k: v for k, v in result.items() if k != "seconds"}


def test_tool_rollouts_do_not_depend_on_batching(batched):
    one_question, all_questions = batched  # 1 question (4 rollouts) per batch / all 28 rollouts in one batch
    assert _numbers(one_question) == _numbers(all_questions)
    samples = [s for q in one_question["per_question"] for s in q["samples"]]
    assert len(samples) == 28 and len(set(samples)) > 7  # the samples of a question differ


def test_tool_figures_agree_with_the_transcripts(batched):
    result = batched[0]
    tools = result["tools"]
    per_q = result["per_question"]
    samples = [s for q in per_q for s in q["samples"]]
    replies = sum(s.count("<user>output: ") for s in samples)
    assert tools["samples"] == 28
    # every call ran; its reply is in the completion unless it would not fit the budget (TRL drops it)
    assert tools["calls"] == replies + tools["reply_dropped"] and replies > 0
    assert tools["reply_dropped_frac"] == tools["reply_dropped"] / 28
    assert tools["calls_per_answer"] == tools["calls"] / 28
    # a turn that opens a call TRL cannot parse (the script's bad JSON, a call the random model broke off) is kept
    # as text: it ran nothing; the script writes one call per turn
    assert tools["call_turns"] == tools["calls"]
    assert tools["parse_failures"] == sum(s.count("<call>") for s in samples) - tools["call_turns"]
    bad_json = sum('"code": print(' in s for s in samples)
    assert tools["parse_failures"] >= bad_json > 0
    assert tools["tool_call_parse_rate"] == tools["call_turns"] / (tools["call_turns"] + tools["parse_failures"])
    unknown = sum("Tool calculator not found" in s for s in samples)
    assert tools["call_failures"] == unknown
    raised = sum("ZeroDivisionError" in s for s in samples)
    assert raised <= tools["env_errors"] <= raised + tools["reply_dropped"]  # a long traceback may be dropped
    assert tools["tool_error_rate"] == (unknown + tools["env_errors"]) / tools["calls"]
    assert tools["timeouts"] == 0 and tools["tool_timeout_rate"] == 0
    # right answers come only from the tool: the tiny model boxes what the interpreter printed
    for q in per_q:
        for text, right in zip(q["samples"], q["right_flags"]):
            assert right == (f"output: {q['answer']}\n<eos><assistant>\\boxed{{{q['answer']}}}<eos>" in text)
    assert 0 < result["mean@n"] < 1
    # lengths count the model's tokens; the replies' share of the tokens and of the budget
    model_tokens = sum(x for q in per_q for x in q["lengths"])
    assert tools["model_tokens"] == model_tokens
    assert tools["tool_token_frac"] == tools["tool_tokens"] / (tools["tool_tokens"] + model_tokens) > 0
    assert tools["tool_budget_frac"] == pytest.approx(tools["tool_tokens"] / (28 * 160))


def test_the_split_over_processes_gives_each_question_the_same_samples(tiny_model_dir, batched, monkeypatch):
    """Each process rolls out every second question with that question's seeds (gather emulated: the real
    two-process run is the slow test below)."""
    import accelerate.utils

    class Rank:
        num_processes, distributed_type = 2, "MULTI_CPU"

        def __init__(self, rank):
            self.process_index = rank

    monkeypatch.setattr(accelerate.utils, "gather_object", lambda local: local)
    shares = [run(tiny_model_dir, batch_size=8, accelerator=Rank(r))["per_question"] for r in (0, 1)]
    merged = sorted(shares[0] + shares[1], key=lambda q: q["index"])
    assert [q["index"] for q in shares[0]] == [0, 2, 4, 6]
    assert merged == batched[0]["per_question"]


def test_refused_with_vllm_and_without_a_tool_template(tiny_model_dir):
    from trl_rlvr.evaluation import evaluate_sampled
    from trl_rlvr.testing import load_tokenizer
    from trl_rlvr.testing.scripted_tool_model import load_scripted_tool_model

    model, tokenizer = load_scripted_tool_model(tiny_model_dir)
    with pytest.raises(ValueError, match="vLLM generator does not run multi-turn tool rollouts"):
        evaluate_sampled(model, tokenizer, questions(), boxed_product, n=2, llm=object(), environment_factory=dict)
    with pytest.raises(ValueError, match="does not render a tool-calling conversation"):
        evaluate_sampled(model, load_tokenizer(tiny_model_dir), questions(), boxed_product, n=2,
                         environment_factory=dict)
    plain = questions().map(lambda r: {"prompt": r["question"]})
    with pytest.raises(ValueError, match="tool rollouts need conversational prompts"):
        evaluate_sampled(model, tokenizer, plain, boxed_product, n=2, environment_factory=dict)


@pytest.mark.slow
def test_two_processes_give_the_same_numbers(tiny_model_dir, batched, tmp_path):
    out = tmp_path / "two.json"
    launch_on_cpu("--module", "tests.harness.tool_eval_harness", tiny_model_dir, out, 8, cwd=ROOT, timeout=600)
    report = json.loads(out.read_text())
    assert report["num_processes"] == 2
    one = json.loads(json.dumps(_numbers(batched[0])))  # keys as JSON writes them
    assert report["result"] == one
