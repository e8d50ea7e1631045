"""The main job's committed results (examples/results/r1zero_metrics.json) are what the code writes today, and the
READMEs quote them as the job's summary prints them.

- The schema: the file's fields, the evaluations' fields, every logged step's keys, the script's and the training
  arguments' names equal what a tiny run of the same code path writes (a tiny local model, 2 steps; the numbers of
  a 135M model are the committed run's, its fields are the code's).
- The quotes: each number examples/README.md and README.md quote is the JSON's, rounded as the job prints it
  (``trl_rlvr.evaluation.heldout.format_metric``; the sampled table: ``trl_rlvr.evaluation.report``).

Regenerate the committed files (one line, ~10-25 min on 2 CPU cores; docs/benchmarks.md has the timings):
``accelerate launch examples/r1zero.py && cp outputs/r1zero/r1zero_{metrics.json,curves.png,passk.png} examples/results/``
"""

import dataclasses
import io
import json
from pathlib import Path

import pytest

from tests.harness.recipes import R1ZeroArguments, r1zero_parser, run_example
from tests.harness.results_shape import METRICS_ADDED_SINCE_THE_RUN, fields
from trl_rlvr.evaluation.heldout import before_after_table, format_metric, history_mean
from trl_rlvr.presets import R1ZERO_ON_CPU

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "examples" / "results" / "r1zero_metrics.json"
REGENERATE = ("accelerate launch examples/r1zero.py && cp outputs/r1zero/r1zero_{metrics.json,curves.png,passk.png} "
              "examples/results/")


@pytest.fixture
def committed():
    return json.loads(COMMITTED.read_text())


def test_committed_arguments_are_the_code_defaults_names(committed):
    """script_args and training_args hold exactly the fields the parser has today (a field added or renamed since
    the file was written shows here), and the job ran with its own defaults (the README's command)."""
    script_args, training_args, _ = r1zero_parser().parse_args_and_config([])
    assert set(committed["script_args"]) == {f.name for f in dataclasses.fields(R1ZeroArguments)}
    assert committed["script_args"] == dataclasses.asdict(script_args)
    written = {k: v for k, v in training_args.to_dict().items() if isinstance(v, (int, float, str, bool, type(None), list, dict))}
    assert set(committed["training_args"]) == set(written)
    for name in R1ZERO_ON_CPU:  # the job's own settings, as the parser gives them with no arguments
        if name in written:
            assert committed["training_args"][name] == written[name], name


@pytest.mark.slow
def test_committed_results_have_the_fields_a_run_of_the_code_writes_today(committed, tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    run_example("r1zero", "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out), "--max_steps", "2",
                "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "16",
                "--overlong_buffer_length", "4", "--num_train_samples", "16", "--num_eval_samples", "8",
                "--eval_max_new_tokens", "8", "--eval_sampled_questions", "2", "--eval_num_samples", "2",
                "--save_model", "false")
    fresh = json.loads((out / "r1zero_metrics.json").read_text())
    step_keys = {frozenset(h) - METRICS_ADDED_SINCE_THE_RUN for h in fresh["history"]}
    assert step_keys == {frozenset(h) for h in committed["history"]}, "the logged keys changed: regenerate with " + REGENERATE
    for part in ("history", "script_args", "training_args", "timings_s", "train_metrics"):
        fresh.pop(part), committed.pop(part)
    assert fields(fresh) == fields(committed), "the file's fields changed: regenerate with " + REGENERATE
    assert list(fresh["sampled"]["results"]) == list(committed["sampled"]["results"]) == ["base", "trained"]


def _quotes(m: dict) -> dict[str, list[str]]:
    """What each README quotes from the committed run, rounded as examples/r1zero.py's summary prints it."""
    fmt = format_metric
    b, a, h = m["before"], m["after"], m["history"]
    first, last = h[0], h[-1]
    base, trained = m["sampled"]["results"]["base"], m["sampled"]["results"]["trained"]

    def pct(v):
        return fmt(v, True)

    passk = {k: f"pass@{k} {pct(base['pass@k'][k])} -> {pct(trained['pass@k'][k])}" for k in ("1", "2", "4", "8")}
    maj8 = f"maj@8 {pct(base['maj@k']['8'])} -> {pct(trained['maj@k']['8'])}"
    examples = [
        f"| format rate (`think_format`) | {pct(b['format_rate'])} | **{pct(a['format_rate'])}** |",
        f"| accuracy (`boxed_math`, `prefilled`: a box inside unclosed reasoning is no answer) | {pct(b['accuracy'])} | "
        f"**{pct(a['accuracy'])}** |",
        f"| truncated at 64 tokens | {pct(b['truncated_frac'])} | {pct(a['truncated_frac'])} |",
        f"| mean length of right / wrong answers (tokens) | {fmt(b['length_right'])} / {fmt(b['length_wrong'])} | "
        f"{fmt(a['length_right'])} / {fmt(a['length_wrong'])} |",
        f"reward {fmt(first['reward'], digits=2)} -> {fmt(last['reward'], digits=2)} (step 1 -> {last['step']})",
        f"format on the training samples {pct(first['rewards/think_format/mean'])} -> "
        f"{pct(last['rewards/think_format/mean'])}",
        f"training accuracy {pct(first['rlvr/accuracy'])} -> {pct(last['rlvr/accuracy'])}",
        f"wasted-group (zero-signal) share {pct(m['wasted_group_share'])} on average",
        f"predicted {pct(history_mean(h, 'rlvr/zero_signal_expected'))}",
        *passk.values(), maj8,
    ]
    readme = [
        f"format rate {pct(b['format_rate'])} -> **{pct(a['format_rate'])}**",
        f"accuracy {pct(b['accuracy'])} -> **{pct(a['accuracy'])}**",
        f"truncated {pct(b['truncated_frac'])} -> {pct(a['truncated_frac'])}",
        passk["1"], passk["8"], maj8,
    ]
    evaluation = [m["sampled"]["table"], f"accuracy {pct(b['accuracy'])} -> {pct(a['accuracy'])}, format "
                  f"{pct(b['format_rate'])} -> {pct(a['format_rate'])}"]
    return {"examples/README.md": examples, "README.md": readme, "docs/evaluation.md": evaluation}


def test_the_readmes_quote_the_committed_numbers_as_the_job_prints_them(committed):
    for page, quotes in _quotes(committed).items():
        text = " ".join((ROOT / page).read_text().split())
        missing = [q for q in quotes if " ".join(q.split()) not in text]
        assert not missing, f"{page} does not quote {COMMITTED.name} as the job prints it: {missing}"


def test_the_job_summary_prints_the_numbers_the_readmes_quote(committed):
    """The summary table of the committed run holds the same strings as the quotes (rewards with 2 decimals,
    percentages with 1)."""
    from rich.console import Console

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(before_after_table(committed["before"], committed["after"], committed["history"], {}))
    printed = console.export_text()
    h = committed["history"]
    for cell in (format_metric(h[0]["reward"], digits=2), format_metric(h[-1]["reward"], digits=2),
                 format_metric(h[-1]["rewards/think_format/mean"], True), format_metric(committed["after"]["format_rate"], True)):
        assert cell in printed, cell
    sampled_table = committed["sampled"]["table"]
    trained = committed["sampled"]["results"]["trained"]
    assert format_metric(trained["pass@k"]["8"], True) in sampled_table


def test_the_regenerating_command_is_documented():
    text = (ROOT / "examples" / "README.md").read_text()
    assert REGENERATE in text


def test_the_one_table_layout_rebuilds_the_committed_sampled_table_byte_for_byte(committed):
    """Every table (sampled, before/after, per arm) is laid out by ``metric_table.text_table``: the committed run's
    sampled table, printed by the layout code it replaced, comes out of it unchanged."""
    from trl_rlvr.evaluation.report import format_table

    assert format_table(committed["sampled"]["results"]) == committed["sampled"]["table"]
