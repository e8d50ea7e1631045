"""examples/tool_r1.py (its pieces: trl_rlvr.tasks.tool_arithmetic): its task (multi-digit word problems with held-out wordings), the cold-start traces, the
tool-rendering chat template, the format reward, and (slow) one short step of each stage on a tiny local model."""

import json
import re
from pathlib import Path

import pytest

from tests.harness.recipes import run_example
from tests.harness.results_shape import FREE, METRICS_ADDED_SINCE_THE_RUN, fields, per_k

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "examples" / "chat_templates" / "chatml_tools.jinja"


def _load_script():
    """The job's public pieces (the example composes them; nothing imports the example)."""
    from trl_rlvr.tasks import tool_arithmetic

    return tool_arithmetic


# ------------------------------------------------------------------------------------------------ data
def test_word_problems_are_right_deterministic_and_held_out():
    from trl_rlvr.tasks.word_problems import WORDINGS, word_problem_rows, wordings

    train = word_problem_rows("train", 300, seed=3)
    heldout = word_problem_rows("heldout", 100, seed=3)
    assert train == word_problem_rows("train", 300, seed=3) and heldout == word_problem_rows("heldout", 100, seed=3)
    assert word_problem_rows("train", 50, seed=3) == train[:50]
    assert not {(r["a"], r["op"], r["b"]) for r in train} & {(r["a"], r["op"], r["b"]) for r in heldout}

    def template_of(question):
        for _op, text in wordings(("sft", "rl", "rl_extra", "heldout")):
            pattern = re.escape(text).replace(re.escape("{a}"), r"\d+").replace(re.escape("{b}"), r"\d+")
            pattern = pattern.replace(re.escape("{name}"), r"\w+").replace(re.escape("{item}"), r"\w+")
            if re.fullmatch(pattern, question):
                return text
        raise AssertionError(question)

    held_texts = {text for op in WORDINGS for split, text in WORDINGS[op] if split == "heldout"}
    assert {template_of(r["question"]) for r in heldout} <= held_texts
    assert not {template_of(r["question"]) for r in train} & held_texts
    for row in train + heldout:
        a, b = row["a"], row["b"]
        assert str(a) in row["question"] and str(b) in row["question"]
        assert int(row["answer"]) == {"*": a * b, "+": a + b, "-": a - b}[row["op"]] > 0
        assert row["solution"] == row["answer"] and len(row["answer"]) >= 3 and max(a, b) >= 100
    with pytest.raises(ValueError, match="split"):
        word_problem_rows("test", 3)
    extra_texts = {text for op in WORDINGS for split, text in WORDINGS[op] if split == "rl_extra"}
    assert not {template_of(r["question"]) for r in train} & extra_texts  # off by default
    extra = word_problem_rows("train", 300, seed=3, extra_rl_wordings=True)
    used = {template_of(r["question"]) for r in extra}
    assert used & extra_texts == extra_texts and not used & held_texts
    assert not {(r["a"], r["op"], r["b"]) for r in extra} & {(r["a"], r["op"], r["b"]) for r in heldout}


def test_cold_start_traces_call_the_tool_and_box_its_reply():
    from trl_rlvr.tasks.word_problems import WORDINGS, cold_start_traces, word_problem_rows

    traces = cold_start_traces(24, seed=0, system_prompt="S")
    sft_texts = [t for op in WORDINGS for s, t in WORDINGS[op] if s == "sft"]
    heldout = {r["question"] for r in word_problem_rows("heldout", 200)}
    for trace in traces:
        system, user, call, tool, final = trace["messages"]
        assert system == {"role": "system", "content": "S"} and user["content"] not in heldout
        assert any(text.split("{")[0] in user["content"] or text.startswith("{") for text in sft_texts)
        code = call["tool_calls"][0]["function"]["arguments"]["code"]
        assert call["tool_calls"][0]["function"]["name"] == "python" and re.fullmatch(r"print\(\d+ [*+-] \d+\)", code)
        assert str(eval(code[6:-1])) == tool["content"] == trace["answer"]  # noqa: S307 (our own digits)
        assert final == {"role": "assistant", "content": f"\\boxed{{{trace['answer']}}}"}


# ------------------------------------------------------------------------------------------------ template
def test_chat_template_renders_tools_keeps_prefixes_and_parses_calls():
    from transformers.utils import get_json_schema
    from trl.chat_template_utils import (
        is_chat_template_prefix_preserving,
        is_chat_template_stop_token_trained,
        parse_response,
        qwen3_template,
        supports_tool_calling,
    )

    from reward_plugins.code_sandbox import PythonEnvironment
    from trl_rlvr.tasks.word_problems import cold_start_traces
    from trl_rlvr.testing import build_chatml_tokenizer

    tokenizer = build_chatml_tokenizer()
    tokenizer.chat_template = TEMPLATE.read_text()
    tokenizer.response_template = qwen3_template
    assert supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)
    assert is_chat_template_stop_token_trained(tokenizer)  # SFT's assistant-only loss trains <|im_end|>
    tools = [get_json_schema(PythonEnvironment.python)]
    messages = cold_start_traces(1, system_prompt="S")[0]["messages"]
    prompt = tokenizer.apply_chat_template(messages[:2], tools=tools, tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\nS\n\nTools:\n- python(code): Run Python code in a persistent")
    assert prompt.endswith(messages[1]["content"] + "<|im_end|>\n<|im_start|>assistant\n")
    full = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    turn = full[len(prompt):full.index("<|im_end|>", len(prompt)) + len("<|im_end|>")]
    parsed = parse_response(tokenizer, tokenizer(turn, add_special_tokens=False).input_ids,
                            prefix=tokenizer(prompt, add_special_tokens=False).input_ids, tools=tools)
    assert parsed["tool_calls"] == messages[2]["tool_calls"]  # what the trace wrote, TRL reads back
    assert "<tool_response>\n" + messages[3]["content"] + "\n</tool_response>" in full
    # the assistant-only mask covers exactly the two assistant turns, each with its <|im_end|>
    out = tokenizer.apply_chat_template(messages, tools=tools, return_dict=True, return_assistant_tokens_mask=True)
    masked = tokenizer.decode([i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m])
    assert masked == turn + f"\\boxed{{{messages[4]['content'][7:-1]}}}<|im_end|>"


def test_tool_format_reward():
    tool_format = _load_script().tool_format
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "python"}}]}
    reply = {"role": "tool", "name": "python", "content": "9716"}
    assert tool_format([
        [call, reply, {"role": "assistant", "content": "\\boxed{9716}"}],  # called, one box
        [call, reply, {"role": "assistant", "content": "\\boxed{9716} \\boxed{1}"}],  # two boxes
        [{"role": "assistant", "content": "\\boxed{9716}"}],  # no tool call
        [call, reply],  # no final turn: the last assistant turn holds no box
        "\\boxed{9716}",  # plain text
        None,
    ]) == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_short_tool_errors_cut_a_raising_cells_reply_to_its_last_line_only():
    """ToRL's error replies: a cell that raised answers with its traceback's last line; a cell that *printed* a
    traceback is output, kept whole; the tool's schema is PythonEnvironment's."""
    from types import SimpleNamespace

    from transformers.utils import get_json_schema

    from reward_plugins.code_sandbox import PythonEnvironment

    script = _load_script()
    factory = script.tool_environment(SimpleNamespace(short_tool_errors=True, tool_timeout=5.0))
    assert factory.func is PythonEnvironment and factory.keywords == {"timeout": 5.0, "error_reply": "last_line"}
    assert get_json_schema(factory().python) == get_json_schema(PythonEnvironment.python)
    full = script.tool_environment(SimpleNamespace(short_tool_errors=False, tool_timeout=5.0))
    assert full.func is PythonEnvironment and full.keywords["error_reply"] == "full"
    with factory() as env:
        env.reset()
        assert env.python("x = 12\nprint(x * 28)") == "336\n"
        assert env.python("print(y * 28)") == "NameError: name 'y' is not defined"
        fake = "print('Traceback (most recent call last):\\n  File x\\nValueError: no')"
        assert env.python(fake) == "Traceback (most recent call last):\n  File x\nValueError: no\n"
        assert env.python("print(347 *)").startswith("SyntaxError: ")
        assert env.stats["errors"] == 2 and env.stats["calls"] == 4


def test_a_step_that_trained_nothing_stays_in_the_history():
    """A step that trained nothing (no informative group, or too few rows for one update) logs its loss but no reward
    metrics (the trainer logs what it trained): the job keeps it and says so, so that the JSON has every step the run took (the default
    run's last step was missing from its history); the train summary is not a step."""
    from types import SimpleNamespace

    from trl_rlvr.evaluation.heldout import StepProgressCallback

    said = []
    history = StepProgressCallback(_load_script().TOOL_STEP_FIELDS, bar=False, say=said.append)
    state = SimpleNamespace(global_step=1, max_steps=2, is_world_process_zero=True)
    history.on_log(None, state, None, logs={"loss": 0.1, "reward": 1.5, "rlvr/accuracy": 0.75})
    state.global_step = 2
    history.on_log(None, state, None, logs={"loss": 0.0, "rlvr/sampling_rounds": 2.0})
    history.on_log(None, state, None, logs={"train_loss": 0.05, "train_runtime": 9.0})
    assert [h["step"] for h in history.history] == [1, 2] and "reward" not in history.history[1]
    assert said[0].startswith("step 1/2") and "reward 1.50" in said[0] and "acc 0.75" in said[0]
    assert said[1].startswith("step 2/2") and "nothing trained" in said[1] and len(said) == 2


def test_parser_defaults_and_smoke():
    from benchmarks.tool_arms import ArmArguments

    script = _load_script()
    script_args, train_args, _ = script.parse_args([])
    assert script_args.sft_traces == 24 and train_args.max_steps == 18
    assert script.parse_args([], ArmArguments)[0].arm == "tool"  # the lab's default arm: the recipe's run
    assert script_args.task == "composed" and script_args.num_eval_training_wordings == 32
    # 8 groups of 4 per step (one sampling round) at a step size that fits them
    assert (train_args.per_device_train_batch_size * train_args.gradient_accumulation_steps, train_args.num_generations,
            train_args.max_sampling_rounds, train_args.learning_rate) == (32, 4, 1, 8e-6)
    assert script.parse_args(["--task", "templates"])[0].num_eval_training_wordings == 0  # that task has no such split
    assert train_args.loss_normalization == "per_batch_token" and train_args.loss_type == "dapo"
    assert (train_args.epsilon, train_args.epsilon_high) == (0.2, 0.28) and train_args.dynamic_sampling
    assert train_args.overlong_buffer_length == 32 and train_args.max_tool_calling_iterations == 2
    script_args, train_args, _ = script.parse_args(["--smoke", "--max_steps", "2"])
    assert train_args.max_steps == 2 and script_args.sft_traces == 8  # the command line beats --smoke's sizes
    assert script.parse_args(["--smoke", "--task", "templates"])[0].num_eval_training_wordings == 0
    with pytest.raises(SystemExit):  # argparse names the choices
        script.parse_args(["--arm", "nope"], ArmArguments)
    with pytest.raises(ValueError, match="arm"):  # the recipe has no arms: an unknown option
        script.parse_args(["--arm", "r1zero"])


def test_the_table_splits_held_out_questions_by_wordings_and_names_the_control():
    from benchmarks.tool_arms import ArmArguments, goals_sentence

    script = _load_script()
    rows = [{"op": "+", "wordings": "training"}, {"op": "*", "wordings": "unseen"}, {"op": "+", "wordings": "unseen"}]
    per_question = [{"index": 0, "right": 2, "right_flags": [1, 1]}, {"index": 1, "right": 0, "right_flags": [0, 0]},
                    {"index": 2, "right": 1, "right_flags": [1, 0]}]
    assert script.pass1_by(rows, per_question, "wordings") == {"training": 1.0, "unseen": 0.25}
    assert script.pass1_by(rows, per_question, "op") == {"*": 0.0, "+": 0.75}
    split = {"pass@1": 0.5, "pass@1 training wordings": 1.0, "pass@1 unseen wordings": 0.25, "n": 2}
    table = script.summary_table({"cold start (tool)": split, "cold start + tool RL, shuffled rewards": split})
    assert "new questions, training wordings" in table and "trained sentences, number format held out" in table
    assert "wordings" not in script.summary_table({"cold start (tool)": {"pass@1": 0.5, "n": 2}})  # templates task
    sentence = goals_sentence({"cold start (tool)": {"pass@1": 0.5},
                                      "cold start + tool RL, shuffled rewards": {"pass@1": 0.4}})
    assert sentence == "random-reward control vs its start: -10.0 points"
    from_checkpoint = goals_sentence({"base (tool)": {"pass@1": 0.5}, "tool RL, shuffled rewards": {"pass@1": 0.6}})
    assert from_checkpoint == "random-reward control vs its start: +10.0 points"
    with pytest.raises(SystemExit):  # argparse names the choices
        script.parse_args(["--reward_control", "random"], ArmArguments)
    with pytest.raises(ValueError, match="num_eval_training_wordings"):
        script.parse_args(["--task", "templates", "--num_eval_training_wordings", "8"])  # no such split there


# ------------------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def tiny_chatml_model(tmp_path_factory):
    from trl_rlvr.testing import build_tiny_chatml_model

    return build_tiny_chatml_model(tmp_path_factory.mktemp("tiny_chatml"))


@pytest.fixture(scope="module", params=["tool", "r1zero"])
def one_step_run(request, tiny_chatml_model, tmp_path_factory):
    """The lab's ``--smoke`` run (``benchmarks.tool_arms``: what the committed runs are) on the tiny model, one step
    of each stage of ``arm`` -> (arm, trainer, out)."""
    from benchmarks.tool_arms import run

    arm = request.param
    tmp = tmp_path_factory.mktemp(f"tool_r1_{request.param}")
    out = tmp / "out"
    trainer, _ = run(["--smoke", "--arm", arm, "--model_name_or_path", str(tiny_chatml_model), "--output_dir", str(out),
                      "--max_completion_length", "24", "--overlong_buffer_length", "8",
                      "--r1zero_results", str(tmp / "none.json")])
    return arm, trainer, out




def _metrics_file(arm: str) -> str:
    return "tool_r1_metrics.json" if arm == "tool" else "tool_r1_r1zero_metrics.json"


@pytest.mark.slow
def test_main_one_step_of_each_stage(one_step_run):
    arm, trainer, out = one_step_run
    assert trainer.state.global_step == 1
    saved = json.loads((out / _metrics_file(arm)).read_text())
    labels = ["cold start (tool)", "cold start + tool RL"] if arm == "tool" else ["base (no tool)", "R1-Zero (no tool)"]
    assert list(saved["arms"]) == labels
    for label in labels:
        arm_metrics = saved["arms"][label]
        assert 0.0 <= arm_metrics["pass@1"] <= arm_metrics["pass@2"] <= 1.0  # pass@n is shown, also when 0
        assert arm_metrics["questions"] == 6 and arm_metrics["n"] == 2  # 3 + 3: every operation in each kind
        assert (arm_metrics["tool_call_rate"] is not None) == (arm == "tool")
    assert [h["step"] for h in saved["history"]] == [1]
    if arm == "tool":
        assert saved["cold_start_history"] and (out / "cold_start" / "model.safetensors").exists()
        assert "rewards/tool_format/mean" in saved["history"][0]
        assert (out / "tool_r1_curves.png").stat().st_size > 1000


@pytest.mark.slow
def test_a_variant_from_a_checkpoint_can_skip_evaluating_its_start(tiny_chatml_model, tmp_path):
    out = tmp_path / "out"
    trainer = run_example("tool_r1", "--smoke", "--model_name_or_path", str(tiny_chatml_model), "--sft_traces", "0",
                          "--eval_start", "false", "--output_dir", str(out), "--max_completion_length", "24",
                          "--overlong_buffer_length", "8", "--plot", "false", "--save_model", "false")["trainer"]
    saved = json.loads((out / "tool_r1_metrics.json").read_text())
    assert trainer.state.global_step == 1 and list(saved["arms"]) == ["tool RL"]
    assert list(saved["timings_s"]) == ["RL", "eval after RL", "total"]


@pytest.mark.slow
def test_the_recipe_gives_the_labs_metrics(one_step_run, tiny_chatml_model, tmp_path):
    """examples/tool_r1.py (the recipe) and the lab's tool arm (benchmarks.tool_arms, what the committed run is) run
    the same stages from the same pieces: the same arms, metrics, table, steps and cold start; the lab adds only its
    comparisons and measurements."""
    arm, _, lab_out = one_step_run
    if arm != "tool":
        pytest.skip("the recipe runs the tool arm")
    out = tmp_path / "out"
    run_example("tool_r1", "--smoke", "--model_name_or_path", str(tiny_chatml_model), "--output_dir", str(out),
                "--max_completion_length", "24", "--overlong_buffer_length", "8")
    recipe, lab = (json.loads((d / "tool_r1_metrics.json").read_text()) for d in (out, lab_out))
    assert recipe["arms"] == lab["arms"] and recipe["table"] == lab["table"]
    for part in ("history", "cold_start_history"):
        assert [{k: v for k, v in h.items() if "time" not in k and "runtime" not in k and "per_second" not in k}
                for h in recipe[part]] == \
            [{k: v for k, v in h.items() if "time" not in k and "runtime" not in k and "per_second" not in k}
             for h in lab[part]]
    lab_only = {"arm", "shown_with_committed_r1zero", "goals", "peak_rss_mib_after", "load_average_end",
                "torch_threads", "omp_wait_policy", "gomp_spincount"}
    assert set(recipe) == set(lab) - lab_only
    assert set(lab["script_args"]) - set(recipe["script_args"]) == {"arm", "reward_control", "r1zero_results"}


#: The job's options added after the committed runs whose default runs the job exactly as before (an experiment's
#: switch, off by default): a committed run needs no regenerating for them.
OPTIONS_THAT_KEEP_THE_COMMITTED_RUN = {"eval_start": True, "eval_split": "dev", "test_per_kind": 128,
                                      "async_rl": False, "max_staleness": 2, "server_cpus": 1}
#: What an evaluation reports since the committed runs, computed from the same samples (the committed numbers stay):
#: pass@1 per number format and the bootstrap intervals over questions.
EVALUATION_FIELDS_ADDED = {"pass@1_by_number_format", "pass@1_intervals"}
ARM_FIELDS_ADDED = {"pass@1 interval", "pass@1 training wordings interval", "pass@1 unseen wordings interval",
                    "pass@1 format plain", "pass@1 format comma", "pass@1 format words"}


def without_added_fields(metrics: dict) -> dict:
    """``metrics`` without the fields of :data:`EVALUATION_FIELDS_ADDED` and :data:`ARM_FIELDS_ADDED`."""
    def drop(group, added):
        return {label: {k: v for k, v in (r or {}).items() if k not in added} if r is not None else None
                for label, r in group.items()}

    return {**metrics, "arms": drop(metrics["arms"], ARM_FIELDS_ADDED),
            "evaluations": drop(metrics["evaluations"], EVALUATION_FIELDS_ADDED)}
#: what a run records about its environment since a committed run was made (the OpenMP spin count, recorded from the
#: version that sets it): absent from the older committed run, which changes none of its numbers.
ENVIRONMENT_RECORDS_ADDED = {"gomp_spincount"}


@pytest.mark.slow
def test_the_committed_runs_have_the_fields_a_run_writes_today(one_step_run):
    """The committed run of each arm (examples/results/) has the fields this code writes: every logged step's keys,
    every metric's name, the script's and the trainer's arguments (a field added, renamed or dropped since the
    committed run shows here)."""
    arm, _, out = one_step_run
    saved = without_added_fields(json.loads((out / _metrics_file(arm)).read_text()))
    committed = json.loads((ROOT / "examples" / "results" / _metrics_file(arm)).read_text())
    # the union over steps: a step that found no informative group logs no metrics of trained rows (none were)
    assert set().union(*committed["history"]) == set().union(*saved["history"]) - METRICS_ADDED_SINCE_THE_RUN
    assert set(committed["script_args"]) <= set(saved["script_args"])  # none renamed or dropped
    added = {name: saved["script_args"][name] for name in set(saved["script_args"]) - set(committed["script_args"])}
    smoke = _load_script().SMOKE  # the smoke run's own sizes (a size of the test split, unused by the dev split)
    assert added == {name: smoke.get(name, value) for name, value in OPTIONS_THAT_KEEP_THE_COMMITTED_RUN.items()
                     if name in added}, \
        "a new option of the job: regenerate the committed runs, or list it below if its default changes nothing"
    assert set(committed["training_args"]) == set(saved["training_args"])
    parts = ("history", "cold_start_history", "script_args", "training_args", "goals", "passk_large")
    # a metric per sample count (pass@4 of 4 samples; the smoke run draws 2) is compared by its kind, not its k
    free = FREE | {"pass@k", "maj@k"}
    newer = {k for k in ENVIRONMENT_RECORDS_ADDED if k not in committed}
    assert fields({k: v for k, v in committed.items() if k not in parts}, free, per_k) == \
        fields({k: v for k, v in saved.items() if k not in parts and k not in newer}, free, per_k)
