"""examples/r1zero.py end to end on a tiny local model, plus its data, evaluation, parser and configs.

The entry point runs 2 training steps single-process and with QLoRA in this process (TRL is imported
once), and with 2 processes through ``accelerate launch`` (CPU, gloo).
"""

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.harness.launch import launch_on_cpu
from tests.harness.recipes import r1zero_parser, run_example

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "r1zero.py"


def _tiny_args(model_dir, out_dir, *extra):
    return [
        "--model_name_or_path", str(model_dir), "--output_dir", str(out_dir),
        "--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "4",
        "--max_completion_length", "16", "--overlong_buffer_length", "4",
        "--num_train_samples", "16", "--num_eval_samples", "8", "--eval_max_new_tokens", "8",
        *extra,
    ]


def _check_outputs(out_dir, steps=2):
    metrics = json.loads((out_dir / "r1zero_metrics.json").read_text())
    assert metrics["before"]["n"] == 8 and metrics["after"]["n"] == 8
    for key in ("accuracy", "format_rate", "truncated_frac"):
        assert 0.0 <= metrics["after"][key] <= 1.0
    assert [h["step"] for h in metrics["history"]] == list(range(1, steps + 1))
    for key in ("reward", "rlvr/accuracy", "rlvr/zero_signal_frac", "rewards/think_format/mean",
                "rewards/boxed_math/mean", "rewards/overlong/mean"):
        assert key in metrics["history"][-1], key
    assert metrics["wasted_group_share"] is not None
    assert (out_dir / "r1zero_curves.png").stat().st_size > 1000
    return metrics


# ------------------------------------------------------------------------------------------------ data
def test_arithmetic_dataset_is_deterministic_and_held_out():
    from trl_rlvr.scripts.data import arithmetic_dataset

    a = arithmetic_dataset(None, n_train=200, n_eval=100, seed=3)
    b = arithmetic_dataset(None, n_train=50, n_eval=100, seed=3)
    assert a["test"]["question"] == b["test"]["question"]  # held-out split independent of n_train
    assert a["train"]["question"][:50] == b["train"]["question"]  # same seed, same stream
    assert len(a["train"]) == 200 and len(a["test"]) == 100
    assert not set(a["train"]["question"]) & set(a["test"]["question"])
    for row in list(a["train"]) + list(a["test"]):
        nums = [int(n) for n in re.findall(r"\d+", row["question"])]
        op = "-" if re.search(r" - |gives away|takes out|lost", row["question"]) else "+"
        assert int(row["answer"]) == (nums[0] - nums[1] if op == "-" else nums[0] + nums[1]), row
        assert int(row["answer"]) >= 0 and row["solution"] == row["answer"]
        assert row["prompt"].endswith("User: " + row["question"] + "\nAssistant: <think>")  # no chat template


def test_prompt_styles(tiny_model_dir):
    from trl_rlvr.scripts.data import format_prompt
    from trl_rlvr.scripts.models import load_tokenizer

    tok = load_tokenizer(str(tiny_model_dir))
    p = format_prompt("What is 4 + 4?", tok, "chat_prefill")
    assert p.startswith("<user>") and p.endswith("<assistant><think>") and "\\boxed{5}" in p
    chat = format_prompt("What is 4 + 4?", tok, "chat")
    assert chat[0]["role"] == "user" and "What is 4 + 4?" in chat[0]["content"]
    assert format_prompt("Q?", None, "r1zero").endswith("User: Q?\nAssistant: <think>")
    with pytest.raises(ValueError):
        format_prompt("Q?", tok, "nope")


def test_extract_reference_gsm8k():
    from trl_rlvr.scripts.data import extract_reference

    assert extract_reference("Natalia sold 48/2 = 24 clips.\n#### 1,072") == "1072"
    assert extract_reference(" 42 ") == "42"


def test_load_qa_dataset_local_with_column_mapping(tmp_path):
    from trl_rlvr.scripts.data import load_qa_dataset

    rows = [{"problem": f"What is {i} + 1?", "final": f"work\n#### {i + 1}"} for i in range(30)]
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    ds = load_qa_dataset(str(tmp_path), None, question_column="problem", answer_column="final", test_split=None,
                         n_eval=10, prompt_style="r1zero")
    assert len(ds["test"]) == 10 and len(ds["train"]) == 20
    row = ds["train"][0]
    assert int(row["answer"]) == int(re.findall(r"\d+", row["question"])[0]) + 1
    assert row["prompt"].endswith("<think>")
    with pytest.raises(ValueError, match="question_column"):
        load_qa_dataset(str(tmp_path), None, question_column="question", answer_column="final")


# ------------------------------------------------------------------------------------------------ evaluation
def test_score_with_registry_plugins():
    from trl_rlvr.evaluation.evaluate import score_questions, summarize_sampled
    from trl_rlvr.rewards.registry import load_reward

    fmt = load_reward("think_format", prefilled=True)
    acc = load_reward("boxed_math", prefilled=True)
    rows = [{"prompt": "p<think>", "question": "q", "answer": "7"}] * 4
    comps = [
        ("3 + 4 = 7</think> \\boxed{7}", [1] * 10, True),  # right, formatted
        ("3 + 4 = 8</think> \\boxed{8}", [1] * 12, True),  # wrong, formatted
        ("3 + 4 = 7 \\boxed{7}", [1] * 20, False),  # no </think>: not formatted, truncated
        ("</think></think> \\boxed{5}", [1] * 6, True),  # malformed and wrong
    ]
    records = score_questions(rows, [[c] for c in comps], acc, fmt, [1], success_threshold=1.0, format_threshold=1.0)
    # prefilled: a box inside reasoning that never closed is no answer, so #3 is neither right nor formatted.
    assert [r["right"] for r in records] == [1, 0, 0, 0]
    assert [r["formatted"] for r in records] == [1, 1, 0, 0]
    res = summarize_sampled(records, 1, [1])
    assert res["mean@n"] == 0.25 and res["format_rate"] == 0.5
    assert res["length_right"] == 10 and res["length_wrong"] == pytest.approx(38 / 3)
    assert res["truncated_frac"] == 0.25 and res["questions"] == 4


# ------------------------------------------------------------------------------------------------ parser
def test_parser_defaults_yaml_and_cli(tmp_path):
    parser = r1zero_parser()
    script_args, train_args, model_args = parser.parse_args_and_config([])
    assert model_args.model_name_or_path is None  # -> SmolLM2 converted from the GGUF
    assert script_args.reward_funcs == ["think_format", "boxed_math"] and script_args.dataset_name is None
    assert train_args.loss_normalization == "per_batch_token" and train_args.loss_type == "dapo"
    assert (train_args.epsilon, train_args.epsilon_high) == (0.2, 0.28)
    assert train_args.dynamic_sampling and train_args.overlong_buffer_length == 16
    assert train_args.beta == 0.0 and not train_args.activation_checkpointing
    assert not train_args.bf16  # CPU here
    assert train_args.success_reward == "boxed_math"

    cfg = tmp_path / "c.yaml"
    cfg.write_text("learning_rate: 1.0e-6\nnum_generations: 4\nmax_operand: 9\nlora_r: 8\n")
    script_args, train_args, model_args = r1zero_parser().parse_args_and_config(
        ["--config", str(cfg), "--num_generations", "2", "--epsilon_high", "0.3"]
    )
    assert train_args.learning_rate == 1e-6 and train_args.num_generations == 2  # CLI beats YAML
    assert train_args.epsilon_high == 0.3 and script_args.max_operand == 9 and model_args.lora_r == 8


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "examples" / "recipes").glob("*.yaml")))
def test_recipes_parse(recipe, tmp_path):
    path = ROOT / "examples" / "recipes" / recipe
    raw = yaml.safe_load(path.read_text())
    # Parse without the GPU-only switches so that the check runs on a CPU.
    raw = {k: v for k, v in raw.items() if k not in ("bf16", "fp16", "use_vllm", "vllm_mode")}
    cfg = tmp_path / recipe
    cfg.write_text(yaml.safe_dump(raw))
    script_args, train_args, model_args = r1zero_parser().parse_args_and_config(["--config", str(cfg)])
    assert train_args.num_generations >= 2
    if recipe.startswith("dapo"):
        assert train_args.num_generations == 16 and train_args.dynamic_sampling
        assert (train_args.epsilon, train_args.epsilon_high, train_args.beta) == (0.2, 0.28, 0.0)
        assert train_args.loss_normalization == "per_batch_token" and train_args.overlong_buffer_length
    if recipe.startswith("dr_grpo"):
        assert train_args.loss_normalization == "constant" and train_args.scale_rewards == "none"


def test_accelerate_configs_are_valid():
    configs = sorted((ROOT / "examples" / "accelerate").glob("*.yaml"))
    names = {p.stem for p in configs}
    assert {"ddp", "deepspeed_zero2", "deepspeed_zero3", "fsdp", "multi_node", "qlora_single_gpu",
            "vllm_colocate", "vllm_server"} <= names
    for p in configs:
        cfg = yaml.safe_load(p.read_text())
        assert cfg["compute_environment"] == "LOCAL_MACHINE"
        assert cfg["distributed_type"] in ("NO", "MULTI_GPU", "DEEPSPEED", "FSDP"), p
        assert "Usage" in p.read_text() or "usage" in p.read_text(), f"{p.name}: no usage comment"


# ------------------------------------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_main_single_process(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    trainer = run_example("r1zero", *_tiny_args(tiny_model_dir, out))["trainer"]
    assert trainer.state.global_step == 2
    metrics = _check_outputs(out)
    # the example parses its command line as the tests' parser (tests.harness.recipes) does
    script_args, training_args, _ = r1zero_parser().parse_args_and_config(_tiny_args(tiny_model_dir, out))
    assert metrics["script_args"] == json.loads(json.dumps(dataclasses.asdict(script_args)))
    assert metrics["training_args"]["learning_rate"] == training_args.learning_rate == 3e-5
    assert (out / "model.safetensors").exists()


@pytest.mark.slow
def test_main_qlora(tiny_model_dir, tmp_path):
    pytest.importorskip("bitsandbytes")
    import bitsandbytes as bnb
    from peft import PeftModel

    out = tmp_path / "out"
    trainer = run_example("r1zero", *_tiny_args(tiny_model_dir, out, "--load_in_4bit", "--use_peft", "--lora_r", "4",
                                                "--lora_target_modules", "q_proj", "v_proj"))["trainer"]
    assert isinstance(trainer.model, PeftModel)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in trainer.model.modules())
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    _check_outputs(out)
    assert (out / "adapter_config.json").exists()


@pytest.mark.slow
def test_main_two_processes(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    launch_on_cpu(SCRIPT, *_tiny_args(tiny_model_dir, out), cwd=ROOT)
    metrics = _check_outputs(out)
    assert metrics["num_processes"] == metrics["script_num_processes"] == 2
