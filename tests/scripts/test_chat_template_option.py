"""A run's chat template by name (a file or one of TRL's), through the parsers of ``trl-rlvr train``, ``doctor`` and
``eval``; the doctor stops a tool run whose template cannot render tools before the model loads, and reports the
tool metrics of one that can."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.scripts.test_doctor import main_job_defaults

ROOT = Path(__file__).resolve().parents[2]
TOOL = "reward_plugins.code_sandbox.PythonEnvironment"


def test_the_train_parser_reads_a_template_by_trl_name_or_file(tmp_path):
    from trl_rlvr.scripts.chat_templates import resolve_chat_template, trl_template_names
    from trl_rlvr.scripts.train import make_parser
    from trl_rlvr.testing import TOOL_CHAT_TEMPLATE

    assert "qwen2_5" in trl_template_names()
    cpu = ["--output_dir", str(tmp_path), "--bf16", "false", "--use_cpu", "true"]
    recipe, _, _ = make_parser().parse_args_and_config(["--chat_template", "qwen2_5", *cpu])
    assert recipe.chat_template == "qwen2_5" and "<tool_call>" in resolve_chat_template("qwen2_5")
    path = tmp_path / "tools.jinja"
    path.write_text(TOOL_CHAT_TEMPLATE)
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump({"chat_template": str(path)}))
    recipe, _, _ = make_parser().parse_args_and_config(["--config", str(config), *cpu])
    assert resolve_chat_template(recipe.chat_template) == TOOL_CHAT_TEMPLATE
    recipe, _, _ = make_parser().parse_args_and_config(["--chat_template", "none", *cpu])
    assert recipe.chat_template is None
    with pytest.raises(ValueError, match=r"chat_template 'qwen2_55': no such file.*Did you mean 'qwen2_5'"):
        make_parser().parse_args_and_config(["--chat_template", "qwen2_55", *cpu])


def test_the_recipes_template_is_set_and_checked_for_tools(tiny_model_dir):
    from trl_rlvr.scripts.train import recipe_chat_template
    from trl_rlvr.testing import CHAT_TEMPLATE, load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    assert tokenizer.chat_template == CHAT_TEMPLATE  # renders no tools
    recipe_chat_template(SimpleNamespace(chat_template=None, environment_factory=None), tokenizer)  # no tool: fine
    with pytest.raises(ValueError, match="does not render tool calls.*qwen2_5"):
        recipe_chat_template(SimpleNamespace(chat_template=None, environment_factory=TOOL), tokenizer)
    recipe_chat_template(SimpleNamespace(chat_template="qwen2_5", environment_factory=TOOL), tokenizer)
    assert "<tool_call>" in tokenizer.chat_template


def _doctor(tmp_path, tiny_model_dir, capsys, *extra):
    from trl_rlvr.scripts.cli import main

    settings = {**main_job_defaults(), "output_dir": str(tmp_path / "out"), "use_cpu": True, "bf16": False,
                "model_name_or_path": str(tiny_model_dir), "reward_funcs": ["tests.scripts.test_doctor.even_length"],
                "num_train_samples": 32, "num_eval_samples": 4, "prompt_style": "chat", "environment_factory": TOOL,
                "max_completion_length": 48}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(settings))
    report = tmp_path / "report.json"
    code = main(["doctor", "--config", str(recipe), "--json", str(report), *extra])
    return code, (json.loads(report.read_text()) if report.exists() else None), capsys.readouterr()


@pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")
def test_the_doctor_stops_a_tool_run_without_a_tool_template_before_the_model_loads(tmp_path, tiny_model_dir, capsys,
                                                                                   monkeypatch):
    import trl_rlvr.trainer

    def no_model(*args, **kwargs):
        raise AssertionError("the trainer (and the model) must not be built")

    monkeypatch.setattr(trl_rlvr.trainer.RLVRTrainer, "__init__", no_model)
    code, report, out = _doctor(tmp_path, tiny_model_dir, capsys)
    assert code == 2 and report is None
    assert "could not run" in out.err and "does not render tool calls" in out.err and "qwen2_5" in out.err
    code, _, out = _doctor(tmp_path, tiny_model_dir, capsys, "--chat_template", "qwen2_55")
    assert code == 2 and "Did you mean 'qwen2_5'" in out.err


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")
def test_the_doctor_reports_the_tool_metrics_of_a_tool_run(tmp_path, tiny_model_dir, capsys):
    code, report, out = _doctor(tmp_path, tiny_model_dir, capsys, "--chat_template", "qwen2_5")
    assert code in (0, 1), out.err
    tool = next(c for c in report["checks"] if c["name"] == "tool use")
    numbers = tool["numbers"]
    assert numbers["answers"] == 16 and "tool-call parse rate" in tool["summary"]
    assert {"call_turns", "parse_failures", "calls_per_answer", "budget_frac", "errors_per_answer"} <= set(numbers)
    # the random tiny model writes no tool call: the doctor says what to do about it
    assert numbers["call_turns"] == 0 and tool["verdict"] == "warn" and "cold start" in tool["advice"]


def test_eval_cli_tool_options_are_checked_before_a_model_loads(tiny_model_dir, tmp_path, capsys):
    from trl_rlvr.scripts.cli import main

    base = ["eval", str(tiny_model_dir), "--output_dir", str(tmp_path), "--no_progress"]
    assert main([*base, "--chat_template", "qwen2_5"]) == 2
    assert "--chat_template is set but --environment is not" in capsys.readouterr().err
    env = ["--environment", "reward_plugins.code_sandbox:PythonEnvironment"]
    assert main([*base, *env, "--chat_template", "qwen2_55"]) == 2
    assert "--chat_template 'qwen2_55': no such file" in capsys.readouterr().err
    assert main([*base, *env, "--prompt_style", "chat_prefill"]) == 2
    assert "--environment needs conversational prompts" in capsys.readouterr().err
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"prompt": "What is 2 + 2?", "answer": "4"}) + "\n")
    assert main([*base, *env, "--dataset", str(plain), "--prompt_column", "prompt"]) == 2
    assert "row 0's prompt is not a conversation" in capsys.readouterr().err
    assert main([*base, *env, "--environment_options", "{timeout: 5}"]) == 2
    assert "--environment_options must be a JSON object" in capsys.readouterr().err
    assert main([*base, "--environment", "reward_plugins.code_sandbox:NoSuchEnvironment"]) == 2
    assert "NoSuchEnvironment" in capsys.readouterr().err


@pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")
def test_eval_cli_runs_tool_rollouts_with_a_trl_template(tiny_model_dir, tmp_path):
    from trl_rlvr.scripts.cli import main

    out = tmp_path / "out"
    assert main(["eval", str(tiny_model_dir), "--environment", "reward_plugins.code_sandbox:PythonEnvironment",
                 "--environment_options", '{"timeout": 5}', "--chat_template", "qwen2_5", "--num_questions", "2",
                 "--n", "2", "--max_new_tokens", "8", "--output_dir", str(out), "--no_progress", "--no_plot"]) == 0
    result = json.loads((out / "eval.json").read_text())["models"][Path(tiny_model_dir).name]
    assert result["tools"]["samples"] == 4 and result["tools"]["calls"] == 0  # the random model calls nothing
    assert result["tools"]["tool_call_rate"] == 0.0
    # a column of conversations (a system turn of one's own) is a tool loop's prompt as is
    data = tmp_path / "conversations.jsonl"
    system = {"role": "system", "content": "Use the python tool."}
    data.write_text("".join(json.dumps({"prompt": [system, {"role": "user", "content": f"What is {i} + 2?"}],
                                        "answer": str(i + 2)}) + "\n" for i in range(2)))
    assert main(["eval", str(tiny_model_dir), "--environment", "reward_plugins.code_sandbox:PythonEnvironment",
                 "--chat_template", "qwen2_5", "--dataset", str(data), "--prompt_column", "prompt", "--n", "2",
                 "--max_new_tokens", "8", "--output_dir", str(out), "--no_progress", "--no_plot"]) == 0
    result = json.loads((out / "eval.json").read_text())["models"][Path(tiny_model_dir).name]
    assert result["tools"]["samples"] == 4
