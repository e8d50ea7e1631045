"""Sampled evaluation of multi-turn tool rollouts (``evaluate_sampled(environment_factory=...)``) on the tiny model
driven to use the tool (``trl_rlvr.testing.scripted_tool_model``) with the sandboxed ``PythonEnvironment``:
seeded per sample and turn, the same whatever the batching or the split over processes, and its tool metrics
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


def test_tool_metrics_agree_with_the_transcripts(batched):
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


def test_refused_without_a_tool_template_or_conversational_prompts(tiny_model_dir):
    from trl_rlvr.evaluation import evaluate_sampled
    from trl_rlvr.testing import load_tokenizer
    from trl_rlvr.testing.scripted_tool_model import load_scripted_tool_model

    model, tokenizer = load_scripted_tool_model(tiny_model_dir)
    with pytest.raises(ValueError, match="chat template does not render a tool-calling conversation"):
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


# ------------------------------------------------------------------------------------------------ the same as TRL
BUDGET = 240


def _policy_text(context: str) -> str:
    """A deterministic policy over a ``TOOL_CHAT_TEMPLATE`` context, one behavior per question (``What is K*B?``,
    K picks it): each branch of TRL's tool loop is taken by some question."""
    import re

    from trl_rlvr.testing import tool_call_text

    question = re.findall(r"<user>(.*?)<eos>", context)[0]
    a, b = map(int, re.findall(r"\d+", question)[:2])
    replies = context.count("<user>output: ")
    last_reply = re.findall(r"<user>output: (.*?)<eos>", context, flags=re.S)
    kind = a % 8
    answer = f"\\boxed{{{last_reply[-1].strip() if last_reply else a}}}<eos>"
    if kind == 0:  # a call, then the answer from its reply
        return tool_call_text("python", code=f"print({a}*{b})") + "<eos>" if not replies else answer
    if kind == 1:  # a call TRL cannot parse (kept as text)
        return '<call>{"name": "python", "arguments": {"code": print(1)}}</call><eos>'
    if kind == 2:  # a tool that does not exist: TRL's error reply
        return tool_call_text("calculator", expression=f"{a}*{b}") + "<eos>" if not replies else answer
    if kind == 3:  # code that raises
        return tool_call_text("python", code="1/0") + "<eos>" if not replies else "\\boxed{0}<eos>"
    if kind == 4:  # two calls in one turn
        calls = tool_call_text("python", code=f"print({a})") + tool_call_text("python", code=f"print({b})")
        return calls + "<eos>" if not replies else answer
    if kind == 5:  # a reply too long for the budget: dropped, the rollout ends
        return tool_call_text("python", code="print('x' * 300)") + "<eos>"
    if kind == 6:  # calls without end: stopped by max_tool_calling_iterations
        return tool_call_text("python", code=f"print({replies})") + "<eos>"
    return "\\boxed{" + "9" * 300  # no end of sequence: cut at the budget


def test_rollouts_are_the_ones_trls_own_tool_loop_makes(tiny_model_dir, monkeypatch):
    """The same policy through TRL's ``_tool_call_loop`` (an RLVRTrainer's generation step) and through the
    evaluation's loop: the same completion ids, tool masks and messages for every branch of the loop."""
    from reward_plugins.code_sandbox import PythonEnvironment
    from tests.rollouts.test_tool_rollouts import make_trainer
    from trl_rlvr.evaluation import tool_rollouts
    from trl_rlvr.evaluation.generation import cut_after_eos

    seen = {}

    def spy(completions, completion_ids, tool_mask=None, **kwargs):
        seen.update(completions=completions, completion_ids=completion_ids, tool_mask=tool_mask)
        return [0.0] * len(completions)

    pairs = [(k + 8, 3) for k in range(8)]
    rows = [{"prompt": [{"role": "user", "content": f"What is {a}*{b}?"}], "answer": str(a * b)} for a, b in pairs]
    from datasets import Dataset

    trainer = make_trainer(tiny_model_dir, dataset=Dataset.from_list(rows), environment_factory=PythonEnvironment,
                           reward_funcs=(spy,), num_generations=2, per_device_train_batch_size=16,
                           max_completion_length=BUDGET, max_tool_calling_iterations=2)
    tokenizer = trainer.processing_class
    eos = tokenizer.eos_token_id

    def policy(ids, limit):
        text = _policy_text(tokenizer.decode(ids, skip_special_tokens=False))
        return cut_after_eos(tokenizer(text, add_special_tokens=False)["input_ids"][:limit], {eos})

    def trl_generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        return [policy(ids, BUDGET)[0] for ids in prompt_ids], None

    trainer._generate_single_turn = trl_generate
    inputs = [row for row in rows for _ in range(2)]  # groups of num_generations
    trainer._generate_and_score_completions(inputs)
    trl = seen.copy()

    class ScriptedTurns:  # the evaluation's generator (turns continued on one KV cache), the same policy
        def __init__(self, *args, **kwargs):
            pass

        def generate(self, id_lists, seeds, *, max_new_tokens, rows=None):
            assert seeds is None  # greedy
            return [policy(ids, max_new_tokens) for ids in id_lists]

    monkeypatch.setattr(tool_rollouts, "CachedTurns", ScriptedTurns)
    groups = tool_rollouts.generate_tool_completions(
        trainer.model, tokenizer, [r["prompt"] for r in rows], list(range(len(rows))), 1, rows=rows,
        environment_factory=PythonEnvironment, greedy=True, max_new_tokens=BUDGET, batch_size=3,
        chat_template=tool_rollouts.tool_chat_template(tokenizer), max_tool_calling_iterations=2)
    ours = [g[0] for g in groups]
    for i, (_, ids, _, info) in enumerate(ours):
        j = 2 * i
        assert ids == list(trl["completion_ids"][j]), i
        assert info["tool_mask"] == list(trl["tool_mask"][j]), i
        assert info["messages"] == trl["completions"][j], i
        assert info["tool_tokens"] == list(trl["tool_mask"][j]).count(0), i
    counts = {k: [o[3][k] for o in ours] for k in ("calls", "parse_failures", "call_failures", "env_errors",
                                                   "reply_dropped", "capped")}
    assert counts == {"calls": [1, 0, 1, 1, 2, 1, 2, 0], "parse_failures": [0, 1, 0, 0, 0, 0, 0, 0],
                      "call_failures": [0, 0, 1, 0, 0, 0, 0, 0], "env_errors": [0, 0, 0, 1, 0, 0, 0, 0],
                      "reply_dropped": [0, 0, 0, 0, 0, 1, 0, 0], "capped": [0, 0, 0, 0, 0, 0, 1, 0]}
    assert [o[2] for o in ours] == [True] * 7 + [False]


def test_the_callback_evaluates_tool_rollouts_with_the_trainers_environment(tiny_model_dir):
    from transformers import TrainerState

    from tests.rollouts.test_tool_rollouts import CheckedPython, make_trainer, right
    from trl_rlvr.evaluation.callback import SampledEvalCallback

    trainer = make_trainer(tiny_model_dir, max_tool_calling_iterations=2, eval_steps=1)
    heldout = questions().select(range(2))
    cb = SampledEvalCallback(trainer, heldout, n=2, max_new_tokens=24, eval_steps=1)
    assert cb.environment_factory is CheckedPython and cb.kwargs["max_tool_calling_iterations"] == 2
    resets = CheckedPython.resets
    result = cb.evaluate(TrainerState())
    assert CheckedPython.resets == resets + 4  # one reset per rollout: the trainer's environment ran them
    assert result["tools"]["samples"] == 4
    logged = cb.history[-1]
    assert {"eval/pass@1", "eval/tools/tool_call_rate", "eval/tools/tool_budget_frac"} <= set(logged)
    assert "eval/tools/tool_call_rate" in cb.keys()
    plain = SampledEvalCallback(trainer, heldout, n=2, eval_steps=1, environment_factory=None)
    assert plain.environment_factory is None and not any("tools" in k for k in plain.keys())
    with pytest.raises(ValueError, match="generator='vllm' needs the trainer's vLLM: set use_vllm=True"):  # tools or not
        SampledEvalCallback(trainer, heldout, n=2, eval_steps=1, generator="vllm")
    assert right  # the trainer's reward decides right / wrong


def test_the_table_shows_the_tool_metrics():
    from trl_rlvr.evaluation.evaluate import summarize_sampled
    from trl_rlvr.evaluation.report import format_table
    from trl_rlvr.evaluation.tool_rollouts import TOOL_COUNTS

    def record(calls, tool_tokens):
        tool = dict.fromkeys(TOOL_COUNTS, [0, 0])
        tool.update(calls=calls, call_turns=calls, tool_tokens=tool_tokens, model_tokens=[10, 10])
        return {"right": 1, "unscored": 0, "formatted": None, "pass@k": {1: 0.5}, "maj@k": None, "lengths": [10, 10],
                "right_flags": [True, False], "finished": [True, True], "tool": tool}

    with_tools = summarize_sampled([record([1, 0], [5, 0])], 2, [1], max_new_tokens=20, temperature=1.0)
    assert with_tools["tools"]["tool_call_rate"] == 0.5 and with_tools["tools"]["tool_budget_frac"] == 5 / 40
    plain = {**with_tools, "tools": None}
    table = format_table({"tool": with_tools, "plain": plain})
    line = next(x for x in table.splitlines() if x.startswith("tool-call rate"))
    assert line.split()[-2:] == ["50.0%", "n/a"]
    assert "tool replies: share of budget" in table and "12.5%" in table
    assert "tool-call rate" not in format_table({"plain": plain})
