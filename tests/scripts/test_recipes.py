"""`trl-rlvr train`: every recipe and every preset, parsed and run for 2 steps on the tiny model.

The recipes name hub models and data and GPU switches; the command line overrides them (as a user would on a
laptop): the tiny local model, a local GSM8K-style file, CPU, tiny budgets. In-process through
``trl_rlvr.scripts.train.main`` (the function ``trl-rlvr train`` calls), plus one real ``trl-rlvr`` subprocess."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trl_rlvr.presets import PRESET_FIELDS, PRESETS, preset_values

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "examples" / "recipes").glob("*.yaml"))


@pytest.fixture(scope="module")
def gsm8k_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "gsm8k_like.jsonl"
    rows = [{"question": f"What is {i} + {i + 1}?", "answer": f"{i} + {i + 1}\n#### {2 * i + 1}"} for i in range(24)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def tiny_overrides(model_dir, data_file, out_dir):
    return [
        "--model_name_or_path", str(model_dir), "--dtype", "float32", "--dataset_name", str(data_file),
        "--dataset_config", "none", "--num_eval_samples", "4", "--use_vllm", "false", "--bf16", "false",
        "--use_cpu", "true", "--output_dir", str(out_dir), "--max_steps", "2", "--per_device_train_batch_size", "4",
        "--num_generations", "4", "--max_completion_length", "16", "--activation_checkpointing", "false",
        "--save_strategy", "no", "--logging_steps", "1", "--report_to", "none", "--warmup_steps", "0",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_runs_two_steps(recipe, tiny_model_dir, gsm8k_file, tmp_path):
    from trl_rlvr.scripts.train import main

    extra = ["--overlong_buffer_length", "4"] if yaml.safe_load(recipe.read_text()).get("overlong_buffer_length") else []
    if yaml.safe_load(recipe.read_text()).get("environment_factory"):  # the tiny tokenizer cannot call tools:
        extra += ["--environment_factory", "none", "--environment_options", "null"]  # tests/rollouts/test_tool_rollouts.py
    trainer = main(["--config", str(recipe), *tiny_overrides(tiny_model_dir, gsm8k_file, tmp_path), *extra])
    assert trainer.state.global_step == 2
    named = yaml.safe_load(recipe.read_text())["reward_funcs"]  # the recipe's rewards, then the overlong penalty
    assert trainer.reward_func_names[: len(named)] == named
    assert (tmp_path / "model.safetensors").exists()
    recipe_values = yaml.safe_load(recipe.read_text())
    expected = preset_values(recipe_values["preset"], {"max_completion_length": 16}) if "preset" in recipe_values else {}
    expected.update({k: v for k, v in recipe_values.items() if k in ("loss_normalization", "epsilon", "beta",
                     "scale_rewards", "dynamic_sampling", "learning_rate", "max_sampling_rounds")})
    expected.update({"overlong_buffer_length": 4} if extra else {})
    assert {k: getattr(trainer.args, k) for k in expected} == expected


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_runs_two_steps(preset, tiny_model_dir, gsm8k_file, tmp_path):
    from trl_rlvr.scripts.train import main

    trainer = main(["--preset", preset, *tiny_overrides(tiny_model_dir, gsm8k_file, tmp_path)])
    assert trainer.state.global_step == 2
    expected = preset_values(preset, {"max_completion_length": 16})
    assert {k: getattr(trainer.args, k) for k in expected} == expected


def test_precedence_defaults_preset_yaml_cli(tmp_path):
    from trl_rlvr.scripts.train import make_parser

    cfg = tmp_path / "r.yaml"
    cfg.write_text("preset: dapo\nepsilon_high: 0.3\nmax_completion_length: 100\nuse_cpu: true\n")
    parser = make_parser(defaults={"beta": 0.5, "learning_rate": 1e-3, "bf16": False})
    recipe, args, _ = parser.parse_args_and_config(["--config", str(cfg), "--dynamic_sampling", "false"])
    assert recipe.preset == "dapo"
    assert args.beta == 0.0  # the preset beats the script's default
    assert args.learning_rate == 1e-3  # not a preset field: the script's default stays
    assert args.epsilon_high == 0.3  # the YAML beats the preset
    assert args.dynamic_sampling is False  # the command line beats the preset
    assert args.overlong_buffer_length == 20  # DAPO's buffer: a fifth of the YAML's budget


def test_from_preset_sets_exactly_the_papers_switches():
    from trl_rlvr import RLVRConfig

    for name in PRESETS:
        config = RLVRConfig.from_preset(name, use_cpu=True, max_completion_length=500)
        for key, value in preset_values(name, {"max_completion_length": 500}).items():
            assert getattr(config, key) == value, (name, key)
        assert set(PRESETS[name].values) >= set(PRESET_FIELDS), name
    dapo = RLVRConfig.from_preset("dapo", use_cpu=True, epsilon_high=0.3, max_completion_length=500)
    assert (dapo.epsilon_high, dapo.overlong_buffer_length, dapo.loss_type) == (0.3, 100, "dapo")
    dr = RLVRConfig.from_preset("dr_grpo", use_cpu=True)
    assert (dr.loss_type, dr.scale_rewards, dr.beta) == ("dr_grpo", "none", 0.0)


def test_build_trainer_leaves_the_parsed_arguments_alone(tiny_model_dir, gsm8k_file, tmp_path, monkeypatch):
    """What the trainer gets set differently (the options the rewards were built with, the model's loading
    arguments, a success_reward that names none of the rewards) goes into a copy; the parsed arguments stay as
    parsed (they were changed in place: reward_options emptied, model_init_kwargs and success_reward rewritten)."""
    import copy

    import trl_rlvr.trainer as trainer_module
    from trl_rlvr.scripts.train import build_trainer, make_parser

    recipe, args, model_args = make_parser().parse_args_and_config([
        *tiny_overrides(tiny_model_dir, gsm8k_file, tmp_path), "--reward_funcs", "think_format", "boxed_math",
        "--reward_options", '{"boxed_math": {"timeout": 2}}', "--success_reward", "boxed_math",
    ])
    parsed = copy.deepcopy(args.to_dict())
    received = {}

    class Recorder:
        def __init__(self, **kwargs):
            received.update(kwargs)

    monkeypatch.setattr(trainer_module, "RLVRTrainer", Recorder)
    build_trainer(recipe, args, model_args)
    assert args.to_dict() == parsed
    given = received["args"]
    assert given is not args and given.model_init_kwargs["dtype"] == "float32"
    assert given.reward_options == {"boxed_math": {"timeout": 2, "prefilled": True}, "think_format": {"prefilled": True}}
    assert given.success_reward == "boxed_math"
    recipe.reward_funcs = ["think_format"]  # the recipe's success_reward names none of them: the first verifier decides
    args.reward_options = None
    build_trainer(recipe, args, model_args)
    assert received["args"].success_reward is None and args.success_reward == "boxed_math"


def test_every_preset_sets_every_preset_field_and_only_those():
    """The fields a preset may set are listed once (PRESET_FIELDS, the base's keys); every preset sets each of them,
    so choosing a preset fixes the whole algorithm (DAPO's overlong_penalty_factor was set by one preset only)."""
    import dataclasses

    from trl_rlvr import RLVRConfig

    fields = {f.name for f in dataclasses.fields(RLVRConfig)}
    assert set(PRESET_FIELDS) <= fields and len(set(PRESET_FIELDS)) == len(PRESET_FIELDS)
    for name in PRESETS:
        assert set(preset_values(name, {"max_completion_length": 500})) == set(PRESET_FIELDS), name


def test_a_preset_lists_only_its_differences_from_the_base():
    from trl_rlvr.presets import BASE, Preset

    for name, preset in PRESETS.items():
        repeated = {k for k, v in preset.differences.items() if not callable(v) and BASE[k] == v}
        assert not repeated, (name, repeated)
    with pytest.raises(ValueError, match=r"\['loss_typo'\], which are not preset fields"):
        Preset("a paper", {"loss_typo": "dapo"})


@pytest.mark.trl_contract
@pytest.mark.parametrize("budget", [None, 100, 4096])
def test_dapo_buffer_is_a_fifth_of_the_runs_budget(budget, tmp_path):
    """Set or left to TRL's default (read from the built config, so a new TRL default cannot slip past), the
    buffer is DAPO's share of the budget: 4096 of 20480 tokens."""
    from trl_rlvr import RLVRConfig
    from trl_rlvr.scripts.train import make_parser

    overrides = {} if budget is None else {"max_completion_length": budget}
    config = RLVRConfig.from_preset("dapo", use_cpu=True, **overrides)
    assert config.overlong_buffer_length == config.max_completion_length // 5
    assert config.max_completion_length == (budget or RLVRConfig.__dataclass_fields__["max_completion_length"].default)
    cfg = tmp_path / "r.yaml"
    cfg.write_text("preset: dapo\nuse_cpu: true\n" + ("" if budget is None else f"max_completion_length: {budget}\n"))
    for parser in (make_parser(), make_parser(defaults=overrides)):
        _, args, _ = parser.parse_args_and_config(["--config", str(cfg)])
        assert args.overlong_buffer_length == args.max_completion_length // 5
    _, args, _ = make_parser(defaults={"max_completion_length": 250}).parse_args_and_config(["--config", str(cfg)])
    assert args.overlong_buffer_length == (budget or 250) // 5  # the script's default budget counts too


def test_an_explicit_loss_type_in_a_recipe_is_a_choice(tmp_path):
    """TRL's default loss_type ('dapo') written in the YAML or on the command line is the user's choice: it beats
    the preset's normalization (precedence), and conflicts with an explicit loss_normalization."""
    from trl_rlvr.scripts.train import make_parser

    cfg = tmp_path / "r.yaml"
    cfg.write_text("preset: grpo\nuse_cpu: true\nloss_type: dapo\n")
    _, args, _ = make_parser().parse_args_and_config(["--config", str(cfg)])
    assert (args.loss_type, args.loss_normalization) == ("dapo", "per_batch_token")
    _, args, _ = make_parser().parse_args_and_config(["--preset", "grpo", "--use_cpu", "true", "--loss_type", "dapo"])
    assert (args.loss_type, args.loss_normalization) == ("dapo", "per_batch_token")
    with pytest.raises(ValueError, match="loss_normalization='per_answer' conflicts with loss_type='dapo'"):
        make_parser().parse_args_and_config(["--config", str(cfg), "--loss_normalization", "per_answer"])
    with pytest.raises(ValueError, match="loss_normalization='per_answer' conflicts with loss_type='dapo'"):
        make_parser().parse_args_and_config(["--use_cpu", "true", "--loss_type", "dapo",
                                             "--loss_normalization", "per_answer"])
    _, args, _ = make_parser().parse_args_and_config(["--preset", "grpo", "--use_cpu", "true"])
    assert (args.loss_type, args.loss_normalization) == ("grpo", "per_answer")
    from trl_rlvr import RLVRConfig

    config = RLVRConfig.from_preset("grpo", use_cpu=True, bf16=False, loss_type="dapo")
    assert (config.loss_type, config.loss_normalization) == ("dapo", "per_batch_token")
    with pytest.raises(ValueError, match="loss_normalization='per_answer' conflicts with loss_type='dapo'"):
        RLVRConfig.from_preset("grpo", use_cpu=True, bf16=False, loss_type="dapo", loss_normalization="per_answer")


def test_unknown_preset_and_unknown_keys_are_named(tmp_path):
    from trl_rlvr import RLVRConfig
    from trl_rlvr.scripts.train import make_parser

    with pytest.raises(ValueError, match="Unknown preset 'dapoo'; presets: 'grpo'"):
        RLVRConfig.from_preset("dapoo")
    with pytest.raises(ValueError, match="Unknown preset 'ppo'"):
        make_parser().parse_args_and_config(["--preset", "ppo", "--use_cpu", "true"])
    cfg = tmp_path / "r.yaml"
    cfg.write_text("learning_rate: 1.0e-6\nepsilon_hi: 0.28\nprompt_styl: r1zero\n")
    with pytest.raises(ValueError, match=r"'epsilon_hi' in .*r\.yaml \(did you mean 'epsilon_high'\?\)") as err:
        make_parser().parse_args_and_config(["--config", str(cfg), "--use_cpu", "true"])
    assert "'prompt_styl'" in str(err.value) and "did you mean 'prompt_style'" in str(err.value)
    with pytest.raises(ValueError, match="'lora_rank' on the command line"):
        make_parser().parse_args_and_config(["--use_cpu", "true", "--lora_rank", "8"])


@pytest.mark.slow
def test_trl_rlvr_train_command(tiny_model_dir, gsm8k_file, tmp_path):
    """The real command line, in a subprocess: a recipe, a preset and overrides."""
    recipe = ROOT / "examples" / "recipes" / "dr_grpo.yaml"
    cmd = [sys.executable, "-m", "trl_rlvr.scripts.cli", "train", "--config", str(recipe),
           *tiny_overrides(tiny_model_dir, gsm8k_file, tmp_path), "--reward_funcs", "boxed_math", "think_format"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "model.safetensors").exists()
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
