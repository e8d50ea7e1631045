"""The reward registry end to end: entry points, errors, options, resolve_reward_funcs, the example third-party
plugin installed into a temporary directory (no state left behind), and the CLI."""

import os
import pickle
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from trl_rlvr.rewards import registry as rewards
from trl_rlvr.rewards.registry import available_rewards, describe_reward, load_reward, resolve_reward_funcs

ROOT = Path(__file__).resolve().parents[2]
BUILTINS = {"boxed_math", "think_format", "overlong"}


def test_builtins_registered_through_entry_points():
    names = available_rewards()
    assert BUILTINS <= set(names)
    for name in BUILTINS:
        assert names[name] and not names[name].startswith("[unavailable]")
    specs = rewards.reward_specs()
    assert specs["boxed_math"].value == "reward_plugins.boxed_math:boxed_math"
    assert specs["boxed_math"].package == "trl-rlvr"


def test_registry_is_light():
    code = "import sys, trl_rlvr.rewards.registry, trl_rlvr.scripts.cli; print(any(m in sys.modules for m in ('torch', 'trl', 'sympy')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_load_reward_builds_named_picklable_functions():
    f = load_reward("think_format", answer_tag="answer")
    assert f.__name__ == "think_format"
    assert pickle.loads(pickle.dumps(f))(None, ["<think>a</think><answer>1</answer>"]) == [1.0]
    g = load_reward("overlong", max_completion_length=8, buffer_length=4)
    assert g(prompts=None, completions=["x"], completion_ids=[[0] * 8]) == [-1.0]  # TRL calls with keywords
    assert load_reward("boxed_math").__name__ == "boxed_math"


def test_unknown_name_lists_names_and_closest():
    with pytest.raises(ValueError) as e:
        load_reward("boxed_maths")
    msg = str(e.value)
    assert "Did you mean 'boxed_math'" in msg and "think_format" in msg and "overlong" in msg


def test_unknown_and_missing_options():
    with pytest.raises(ValueError, match=r"'boxed_math'.*'timout'.*did you mean 'timeout'"):
        load_reward("boxed_math", timout=3)
    with pytest.raises(ValueError, match=r"'overlong'.*max_completion_length"):
        load_reward("overlong")


def _fake_eps(monkeypatch, extra):
    real = rewards.entry_points

    def fake(group):
        return list(real(group=group)) + extra

    monkeypatch.setattr(rewards, "entry_points", fake)


def test_broken_plugin_does_not_break_others(monkeypatch):
    broken = EntryPoint("broken_one", "no_such_package_xyz.mod:factory", rewards.GROUP)
    _fake_eps(monkeypatch, [broken])
    names = available_rewards()
    assert names["broken_one"].startswith("[unavailable]")
    assert "no_such_package_xyz" in names["broken_one"]
    assert load_reward("think_format")(None, ["<think>a</think> b"]) == [1.0]
    with pytest.raises(rewards.RewardPluginError, match="broken_one.*no_such_package_xyz"):
        load_reward("broken_one")


def test_resolve_reward_funcs():
    def custom(prompts, completions, **kw):
        return [0.0] * len(completions)

    out = resolve_reward_funcs(
        ["boxed_math", "think_format", custom, "Qwen/some-reward-model"], {"think_format": {"answer_tag": "answer"}}
    )
    assert [getattr(f, "__name__", f) for f in out] == ["boxed_math", "think_format", "custom", "Qwen/some-reward-model"]
    assert out[1].answer_tag == "answer"
    assert out[2] is custom
    assert [f.__name__ for f in resolve_reward_funcs("think_format")] == ["think_format"]
    assert resolve_reward_funcs(custom) == [custom]
    with pytest.raises(ValueError, match="reward_options.*boxed_mat"):
        resolve_reward_funcs(["boxed_math"], {"boxed_mat": {}})
    with pytest.raises(ValueError, match="no option"):
        resolve_reward_funcs(["boxed_math"], {"boxed_math": {"nope": 1}})


@pytest.fixture(scope="module")
def example_plugin(tmp_path_factory):
    """examples/third_party_plugin installed with pip into a temporary target directory."""
    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    src = build / "src"
    import shutil

    shutil.copytree(ROOT / "examples" / "third_party_plugin", src)  # keep build artifacts out of the repo
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "--target", str(target), str(src)],
        check=True, capture_output=True, text=True,
    )
    return target


def test_third_party_plugin_found_by_name(example_plugin, monkeypatch):
    monkeypatch.syspath_prepend(str(example_plugin))
    names = available_rewards()
    assert "keyword" in names and "example third-party plugin" in names["keyword"]
    assert rewards.reward_specs()["keyword"].package == "rlvr-example-plugin"
    f = load_reward("keyword", word="because")
    assert f(None, ["Because it is.", [{"role": "assistant", "content": "no"}]]) == [1.0, 0.0]
    assert describe_reward("keyword")["options"]["word"]["default"] == "because"
    # logged under its registry name (the name success_reward and reward_options use), not its own keyword_x
    assert [g.__name__ for g in resolve_reward_funcs(["keyword", "think_format"], {"keyword": {"word": "x"}})] == [
        "keyword", "think_format"
    ]
    with pytest.raises(ValueError, match=r"'keyword'.*rlvr-example-plugin.*'wrod'"):
        load_reward("keyword", wrod="x")


def _cli(*args, extra_path=None):
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "trl_rlvr.scripts.cli", *args], capture_output=True, text=True, cwd=ROOT, env=env)


def test_cli_list_and_show(example_plugin):
    out = _cli("rewards", "list", extra_path=example_plugin)
    assert out.returncode == 0, out.stderr
    for name in (*BUILTINS, "keyword"):
        assert name in out.stdout
    assert "rlvr-example-plugin" in out.stdout and "trl-rlvr" in out.stdout
    show = _cli("rewards", "show", "boxed_math")
    assert show.returncode == 0, show.stderr
    assert "timeout" in show.stdout and "answer_line" in show.stdout and "= 5.0" in show.stdout
    bad = _cli("rewards", "show", "boxed_mat")
    assert bad.returncode == 2 and "Did you mean 'boxed_math'" in bad.stderr
    version = _cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"trl-rlvr {__import__('trl_rlvr').__version__}"


@pytest.mark.slow
def test_vanilla_grpo_trainer_with_registered_rewards(tiny_model_dir, tmp_path):
    """The plugins are plain TRL reward functions: a vanilla GRPOTrainer trains with them, one step."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from trl_rlvr.testing import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    dataset = Dataset.from_dict({"prompt": ["1+1=", "2+2="] * 2, "answer": ["2", "4"] * 2})
    funcs = resolve_reward_funcs(
        ["think_format", "boxed_math", "overlong"],
        {"boxed_math": {"timeout": 2.0}, "overlong": {"max_completion_length": 8, "buffer_length": 4}},
    )
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
        max_steps=1, logging_steps=1, report_to=[], bf16=False, use_cpu=True, activation_checkpointing=False,
        save_strategy="no",
    )
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    logged = {k for entry in trainer.state.log_history for k in entry}
    for name in ("think_format", "boxed_math", "overlong"):
        assert f"rewards/{name}/mean" in logged, sorted(logged)
    assert "boxed_math/no_box" in logged  # reported through TRL's log_metric


def test_builtins_are_not_entry_points_and_cannot_be_shadowed(monkeypatch, caplog):
    """The built-ins are imported directly; a third-party entry point with a built-in's name is ignored, with a
    warning naming its package."""
    from importlib.metadata import EntryPoint

    assert f'[project.entry-points."{rewards.GROUP}"]' not in (ROOT / "pyproject.toml").read_text()
    impostor = EntryPoint("boxed_math", "evil_pkg.rewards:always_one", rewards.GROUP)
    monkeypatch.setattr(rewards, "entry_points", lambda group: [impostor])
    with caplog.at_level("WARNING"):
        specs = rewards.reward_specs()
    assert specs["boxed_math"].value == rewards.BUILTIN_REWARDS["boxed_math"] and specs["boxed_math"].package == "trl-rlvr"
    assert "has the name of a built-in reward and is ignored" in caplog.text


def test_plain_clone_without_installed_metadata(monkeypatch, tiny_model_dir):
    """A clone used without `pip install -e .` has no entry-point metadata: the built-ins still resolve, and the
    trainer's `overlong_buffer_length` switch works (it failed with "none installed")."""
    monkeypatch.setattr(rewards, "entry_points", lambda group: [])
    assert set(rewards.reward_specs()) == set(rewards.BUILTIN_REWARDS)
    assert rewards.reward_specs()["overlong"].package == "trl-rlvr"
    from tests.harness.loss_harness import make_trainer

    trainer = make_trainer(tiny_model_dir, reward_funcs=["think_format"], overlong_buffer_length=4)
    assert trainer.reward_func_names == ["think_format", "overlong"]
    assert trainer.reward_funcs[1](prompts=None, completions=["x"], completion_ids=[[0] * 64]) == [-1.0]


def test_import_reward_function_names_what_is_wrong():
    from trl_rlvr.rewards.registry import import_reward_function

    fn = import_reward_function("reward_plugins.think_format:reward")
    assert fn is import_reward_function("reward_plugins.think_format.reward") and callable(fn)
    for spec, message in [("nodots", "reward 'nodots' is not a module.name"),
                          ("no_such_module_xyz.fn", "cannot import 'fn' from 'no_such_module_xyz'"),
                          ("reward_plugins.think_format.nope", "cannot import 'nope'"),
                          ("trl_rlvr.rewards.registry.__name__", "is not callable")]:
        with pytest.raises(ValueError, match=message):
            import_reward_function(spec)
