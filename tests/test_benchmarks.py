"""Every benchmark can be run in a smoke mode (.ci/run runs them all: `python -m benchmarks --smoke`) and ends with
an exit status that says whether its cases ran (benchmarks/_status.py)."""

import ast
from pathlib import Path

import pytest

from benchmarks.__main__ import benchmark_modules

ROOT = Path(__file__).resolve().parents[1]


def test_the_smoke_driver_sees_every_benchmark():
    on_disk = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_")}
    assert set(benchmark_modules()) == on_disk and "dynamic_sampling" in on_disk


@pytest.mark.parametrize("name", benchmark_modules())
def test_every_benchmark_has_a_smoke_mode_and_an_exit_status(name):
    source = (ROOT / "benchmarks" / f"{name}.py").read_text()
    tree = ast.parse(source)
    flags = {node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "attr", None) == "add_argument" and node.args
             and isinstance(node.args[0], ast.Constant)}
    assert "--smoke" in flags, f"benchmarks/{name}.py has no --smoke"
    main_block = next(node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))
    assert "sys.exit(" in ast.unparse(main_block), f"benchmarks/{name}.py does not exit with main()'s status"


def test_a_failing_case_fails_the_dynamic_sampling_benchmark():
    """A learner that crashes, or whose import breaks, is a failure; only a trainer the installed TRL lacks is
    'not run' (the benchmark used to report every learner NOT RUN and exit 0)."""
    from benchmarks.dynamic_sampling import failures

    ok = {"method": "a", "name": "x", "seeds": 1, "error": None, "skipped": False, "crashed_in_update_per_seed": [None]}
    assert failures([ok]) == []
    assert failures([{**ok, "seeds": 0, "error": "ModuleNotFoundError: No module named 'length_bias_toy'"}])
    assert failures([{**ok, "crashed_in_update_per_seed": [2], "error": "RuntimeError: boom"}])
    assert failures([{**ok, "method": "c", "seeds": 0, "error": "No module named 'trl.experimental...'",
                      "skipped": True}]) == []


def test_the_shared_cores_benchmark_compares_what_was_learned_not_how_long_it_took():
    """Two runs of a seeded job are 'the same' when every step's reward and every held-out metric agree; the
    seconds each took may differ (they are what the benchmark measures)."""
    from benchmarks.shared_cores import job_figures

    def r1zero(after_accuracy, seconds):
        return {"history": [{"reward": 0.5, "step_time": seconds}, {"loss": 0.1}],
                "before": None, "after": {"accuracy": after_accuracy, "format_rate": 1.0, "mean_length": 40.0,
                                          "seconds": seconds}}

    assert job_figures("r1zero", r1zero(0.2, 10.0)) == job_figures("r1zero", r1zero(0.2, 99.0))
    assert job_figures("r1zero", r1zero(0.2, 10.0)) != job_figures("r1zero", r1zero(0.22, 10.0))

    def tool(pass_at_1, rewards, seconds):
        return {"history": [{"reward": r} for r in rewards],
                "arms": {"cold start (tool)": {"pass@1": pass_at_1, "seconds": seconds}, "base (no tool)": None}}

    assert job_figures("tool_r1", tool(0.855, [1.5], 1.0)) == job_figures("tool_r1", tool(0.855, [1.5], 2.0))
    assert job_figures("tool_r1", tool(0.855, [1.5], 1.0)) != job_figures("tool_r1", tool(0.855, [1.75], 1.0))
    assert job_figures("tool_r1", tool(0.855, [1.5], 1.0)) != job_figures("tool_r1", tool(0.86, [1.5], 1.0))


def test_the_tool_job_smoke_says_it_is_a_smoke_and_removes_its_temporary_folder(monkeypatch, capsys):
    """`python -m benchmarks.tool_r1 --smoke`: the summary says its numbers are a tiny model's, and the temporary
    output folder (the tiny model, the job's metrics) is gone afterwards; an --output_dir is kept."""
    import json

    import benchmarks.tool_r1 as bench

    seen = []

    def fake_launch(script, job_args, busy):
        out = Path(job_args[job_args.index("--output_dir") + 1])
        seen.append(out)
        (out / "tool_r1_metrics.json").write_text(json.dumps(
            {"timings_s": {"total": 1.0}, "goals": None, "history": [],
             "arms": {"cold start (tool) ": {"pass@1": 0.0}}}))
        return {"exit_status": 0}

    monkeypatch.setattr(bench, "launch_job", fake_launch)
    monkeypatch.setattr(bench, "tool_job_smoke_args", lambda out: ["--smoke"])
    assert bench.main(["--smoke"]) == 0
    printed = capsys.readouterr().out
    assert "SMOKE RUN" in printed and "not the job's results" in printed
    assert seen and not seen[0].exists()


def test_the_tool_job_keeps_an_output_dir_it_was_given(monkeypatch, tmp_path):
    import benchmarks.tool_r1 as bench

    monkeypatch.setattr(bench, "launch_job", lambda script, job_args, busy: {"exit_status": 1})
    monkeypatch.setattr(bench, "tool_job_smoke_args", lambda out: ["--smoke"])
    assert bench.main(["--smoke", "--output_dir", str(tmp_path)]) == 1  # the job failed: the benchmark fails
    assert tmp_path.is_dir()


def test_the_tool_job_runs_once_per_seed_and_summarizes_the_seeds(monkeypatch, tmp_path, capsys):
    """`python -m benchmarks.tool_r1 --seeds 42 1 2`: one run per seed (the job's --seed), each in its own folder,
    the measurements per seed and a summary (each arm's pass@1: per seed, mean, range); a failed seed fails it."""
    import json

    import benchmarks.tool_r1 as bench

    pass_at_1 = {"42": 0.5, "1": 0.75, "2": 1.0}
    calls = []

    def fake_launch(script, job_args, busy):
        out, seed = Path(job_args[job_args.index("--output_dir") + 1]), job_args[job_args.index("--seed") + 1]
        calls.append((out.name, seed))
        (out / "tool_r1_metrics.json").write_text(json.dumps(
            {"timings_s": {"total": 1.0}, "goals": None, "history": [{"step": 1}],
             "arms": {"cold start + tool RL": {"pass@1": pass_at_1[seed]}}}))
        return {"exit_status": 0 if seed != "2" else 3, "wall_s": 10.0 + int(seed)}

    monkeypatch.setattr(bench, "launch_job", fake_launch)
    save = tmp_path / "seeds.json"
    assert bench.main(["--seeds", "42", "1", "2", "--output_dir", str(tmp_path / "out"), "--save", str(save)]) == 1
    assert calls == [("seed42", "42"), ("seed1", "1"), ("seed2", "2")]
    saved = json.loads(save.read_text())
    assert list(saved["seeds"]) == ["42", "1", "2"] and "pass_at_1" not in saved["seeds"]["2"]  # the failed seed
    arm = saved["summary"]["pass_at_1"]["cold start + tool RL"]
    assert arm["per_seed"] == {"42": 0.5, "1": 0.75} and arm["mean"] == 0.625 and (arm["min"], arm["max"]) == (0.5, 0.75)
    assert "cold start + tool RL: 62.5% (50.0% to 75.0%" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "1", "--", "--seed", "2"])


def test_the_tool_job_table_marks_smoke_and_committed_columns():
    """The table of a smoke run: this run's columns `[smoke]`, the committed real-model ones `[committed]`, and the
    line above it says which is which; a real run's columns are unmarked."""
    from trl_rlvr.tasks import tool_arithmetic as module
    committed = {"model": "/cache/SmolLM2-135M-Instruct", "arms": {"R1-Zero (no tool)": {"pass@1": 0.0}}}
    arms = {"cold start (tool)": {"pass@1": 0.5}}
    shown, heading = module.shown_arms(arms, committed, smoke=True, model="/tmp/tiny")
    assert list(shown) == ["R1-Zero (no tool) [committed]", "cold start (tool) [smoke]"]
    assert heading.startswith("SMOKE RUN") and "/tmp/tiny" in heading and "SmolLM2-135M-Instruct's" in heading
    shown, heading = module.shown_arms(arms, committed, smoke=False, model="/cache/SmolLM2-135M-Instruct")
    assert list(shown) == ["R1-Zero (no tool) [committed]", "cold start (tool)"] and "SMOKE" not in heading
    assert module.shown_arms(arms, None, smoke=False, model="m")[0] == arms


def test_the_tool_rl_throughput_benchmark_counts_tokens_to_eos_and_bounds_by_the_slower_resource():
    import torch

    from benchmarks.tool_rl_throughput import model_limits, new_tokens

    out = torch.tensor([[9, 9, 1, 2, 0, 5], [9, 9, 1, 1, 1, 1]])  # prompt of 2; EOS = 0
    assert new_tokens(out, 2, {0}) == 3 + 4
    model = torch.nn.Linear(1000, 1000, bias=False)  # 1e6 fp32 parameters: 4e6 bytes
    machine = {"matmul_flops": 1e11, "copy_bandwidth_bytes": 1e10}
    lim = model_limits(model, machine, batch=16, activation_checkpointing=False)
    assert lim["gen_tokens_s_memory_bound"] == 16 * 1e10 / 4e6 and lim["gen_tokens_s_compute_bound"] == 1e11 / 2e6
    assert lim["gen_tokens_s_limit"] == min(40_000, 50_000) and lim["train_tokens_s_limit"] == 1e11 / 6e6
    assert model_limits(model, machine, 16, True)["train_tokens_s_limit"] == 1e11 / 8e6


def test_the_imitation_arms_take_the_rl_stages_budget_from_its_run():
    """RFT's budget: the model tokens the RL stage generated (mean length x rollouts, summed over steps); the
    more-traces arm's: the tokens RL passed through the policy (TRL's cumulative num_tokens)."""
    import json
    from types import SimpleNamespace

    from benchmarks.imitation_arms import COMMITTED_RL, budget_of, rl_budget

    metrics = json.loads(COMMITTED_RL.read_text())
    budget = rl_budget(metrics)
    logged = [h for h in metrics["history"] if "completions/mean_length" in h]
    assert budget["steps"] == 18 and budget["estimated_steps"] == 18 - len(logged) and budget["rollouts_per_step"] == 32
    per_step = 32 * sum(h["completions/mean_length"] for h in logged) / len(logged)
    # the steps that logged no length are estimated from their num_tokens: within 10% of the logged steps' mean
    assert budget["generated_tokens"] == pytest.approx(18 * per_step, rel=0.1)
    assert budget["generated_tokens"] > 32 * sum(h["completions/mean_length"] for h in logged)
    assert budget["trained_tokens"] == round(metrics["history"][-1]["num_tokens"]) > budget["generated_tokens"]
    given = SimpleNamespace(rl_metrics="nowhere.json", generated_tokens=5, trained_tokens=None)
    with pytest.raises(ValueError, match="nowhere.json"):
        budget_of(given)
    assert budget_of(SimpleNamespace(rl_metrics=str(COMMITTED_RL), generated_tokens=5, trained_tokens=None)) == \
        {**budget, "generated_tokens": 5, "source": str(COMMITTED_RL)}


def test_the_more_traces_arm_takes_the_fewest_traces_that_reach_the_budget(tmp_path):
    from types import SimpleNamespace

    from benchmarks.imitation_arms import tool_schemas, traces_for_tokens
    from trl_rlvr.tasks.tool_arithmetic import SYSTEM_PROMPT, TEMPLATE, tool_tokenizer
    from trl_rlvr.tasks.word_problems import composed_cold_start_traces
    from trl_rlvr.testing import build_tiny_chatml_model

    tokenizer = tool_tokenizer(str(build_tiny_chatml_model(tmp_path / "m")), str(TEMPLATE))
    args = SimpleNamespace(dataset_seed=0, system_prompt=SYSTEM_PROMPT, sft_traces=24, sft_epochs=2.0)
    lengths = [len(tokenizer.apply_chat_template(t["messages"], tools=tool_schemas(), tokenize=True, return_dict=False))
               for t in composed_cold_start_traces(60, seed=0, system_prompt=SYSTEM_PROMPT)]
    assert traces_for_tokens(tokenizer, args, 0) == (24, sum(lengths[:24]))
    extra = 2.0 * sum(lengths[24:40])  # 16 more traces' tokens, over two epochs
    assert traces_for_tokens(tokenizer, args, extra) == (40, sum(lengths[:40]))
    assert traces_for_tokens(tokenizer, args, extra + 1)[0] == 41
    with pytest.raises(ValueError, match="1000 cold-start traces"):
        traces_for_tokens(tokenizer, args, 10**9)
