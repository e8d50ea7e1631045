"""``trl-rlvr rewards audit``: corpus schema, the runner's deadline and crash handling, the verdict rule, the naive
example rewards caught, the CLI."""

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trl_rlvr.audit import (
    KINDS,
    CorpusError,
    RewardStartError,
    audit_reward,
    builtin_corpus,
    load_corpus,
)
from trl_rlvr.audit.cases import parse_case
from trl_rlvr.scripts.audit import parse_reward_options


def _cases(tmp_path, rows, name="cases.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _row(id, completion, expected, cls="custom", **extra):
    return {"id": id, "class": cls, "completion": completion, "expected": expected, **extra}


# -- corpora ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_builtin_corpora_load_and_label_both_ways(kind):
    corpus = builtin_corpus(kind)
    assert corpus.name == kind and corpus.version >= 1
    classes = {c.cls for c in corpus.cases}
    assert "agreement" in classes and len(classes) >= 6
    agreement = [c for c in corpus.cases if c.cls == "agreement"]
    assert {c.expected for c in agreement} == {0, 1}  # right and wrong answers a checker must tell apart
    assert sum(c.expected for c in corpus.cases) >= 5


def test_code_corpus_has_every_class_beside_a_right_answer():
    cases = builtin_corpus("code").cases
    classes = {c.cls for c in cases}
    assert {"lying_objects", "exits", "output_forging", "checker_tampering", "planted_files", "raise_on_empty",
            "prompt_helpers", "resources", "runner_override", "infra_lookalike"} <= classes
    assert all(c.must_score for c in cases)  # every row has tests: a wrong program scored None escapes
    right_columns = [c.columns for c in cases if c.expected == 1]
    for c in cases:  # every wrong program targets tests that some right program passes
        if c.expected == 0 and c.columns.get("tests") != [] and c.columns.get("io_tests") != [] \
                and c.cls != "empty_tests":
            assert c.columns in right_columns, c.id


@pytest.mark.parametrize("line, message", [
    ("not json", "not valid JSON"),
    (json.dumps(_row("a", "x", 1) | {"gold": "3"}), "unknown key"),
    (json.dumps({"id": "a", "class": "c", "completion": "x"}), "missing key"),
    (json.dumps(_row("a", "x", True)), "'expected' must be 0"),
    (json.dumps(_row("a", "x", 2)), "'expected' must be 0"),
    (json.dumps(_row("a", "x", 1, cls="Has Space")), "'class'"),
    (json.dumps(_row("a", 3, 1)), "'completion'"),
    (json.dumps(_row("a", [{"repeat": "x", "times": -1}], 1)), "completion part 0"),
    (json.dumps(_row("a", "x", 1, columns={"prompt": "p"})), "use the key 'prompt'"),
    (json.dumps(_row("a", "x", 1, columns=[1])), "'columns'"),
    (json.dumps(_row("a", "x", 0, must_score=1)), "'must_score'"),
])
def test_bad_corpus_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps(_row("ok", "fine", 1)) + "\n\n" + line + "\n")
    with pytest.raises(CorpusError, match=message) as e:
        load_corpus(path)
    assert f"{path}:3" in str(e.value)


def test_duplicate_ids_and_empty_files(tmp_path):
    with pytest.raises(CorpusError, match="duplicate id 'a'.*:1"):
        load_corpus(_cases(tmp_path, [_row("a", "x", 1), _row("a", "y", 0)]))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(CorpusError, match="no cases"):
        load_corpus(tmp_path / "empty.jsonl")


def test_repeated_parts_build_long_completions():
    case = parse_case(_row("a", ["\\boxed{", {"repeat": "9", "times": 1000}, "}"], 0), "f:1")
    assert case.completion == "\\boxed{" + "9" * 1000 + "}"


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(row=st.one_of(_json, st.fixed_dictionaries(
    {"id": _json, "class": _json, "completion": _json, "expected": _json},
    optional={"columns": _json, "prompt": _json, "note": _json, "x": _json})))
def test_property_any_row_is_a_case_or_a_corpus_error(row):
    try:
        case = parse_case(row, "f:1")
    except CorpusError as e:
        assert str(e).startswith("f:1: ")
        return
    assert case.expected in (0, 1) and isinstance(case.completion, str) and isinstance(case.columns, dict)


def test_parse_reward_options():
    assert parse_reward_options(["--timeout", "2", "--answer_tag=answer", "--prefilled", "true", "--think-tag", "r"]) == {
        "timeout": 2, "answer_tag": "answer", "prefilled": True, "think_tag": "r"}
    for bad in (["stray"], ["--timeout"], ["--"]):
        with pytest.raises(ValueError):
            parse_reward_options(bad)


# -- the runner and the verdict --------------------------------------------------------------------------------
def test_a_reward_scoring_everything_zero_fails():
    report = audit_reward("tests.harness.audit_rewards:always_zero")
    assert report.kind == "format"  # declared by the function
    assert report.to_json()["false_positives"] == 0 and report.right_rate == 0.0
    assert not report.passed and any("right answers accepted" in r for r in report.reasons())


def test_a_reward_scoring_everything_one_fails_on_every_class():
    report = audit_reward("tests.harness.audit_rewards:always_one", kind="format")
    wrong_classes = {c.cls for c in builtin_corpus("format").cases if c.expected == 0}
    assert {r.name for r in report.classes() if r.false_positives} == wrong_classes
    assert not report.passed
    worst = report.worst_examples()
    assert worst and all(e["score"] == 1.0 for e in worst)


def test_hangs_raises_crashes_and_garbage_are_reported_and_the_audit_goes_on(tmp_path):
    words = ["right", "hang", "right", "raise", "exit", "die", "right", "print", "garbage", "two", "wrong", "right"]
    path = _cases(tmp_path, [_row(f"{k}-{w}", w, int(w in ("right", "print"))) for k, w in enumerate(words)])
    report = audit_reward("tests.harness.audit_rewards:misbehaving", cases=[path], builtin=False, deadline=2.0)
    got = {o.case.id.split("-", 1)[1]: (o.status, o.score) for o in report.outcomes}
    assert got["hang"] == ("timeout", None)
    assert got["raise"][0] == "error" and got["exit"][0] == "error" and got["garbage"][0] == "error"
    assert got["two"][0] == "error"
    assert got["die"][0] == "crash"
    assert got["print"] == ("scored", 1.0)  # the forged line on stdout never reached the channel
    assert got["wrong"] == ("scored", 0.0)
    assert [o.status for o in report.outcomes if o.case.completion == "right"] == ["scored"] * 4
    assert all(o.score == 1.0 for o in report.outcomes if o.case.completion == "right")
    j = report.to_json()
    assert (j["timeouts"], j["errors"]) == (1, 5)
    # a fresh process after each hang and death: in the call that held it, then alone (the call's order is seeded)
    assert not report.passed and len(report.startup_seconds) >= 3
    errors = {e["id"].split("-", 1)[1]: e["detail"] for e in j["error_cases"]}
    assert "ValueError: bad input" in errors["raise"] and "SystemExit" in errors["exit"]
    # alone: the completion repeated to a group (4), each under the deadline
    assert "exit status 7" in errors["die"] and "within 8 s" in errors["hang"]


def test_a_picklable_function_is_audited_in_the_child(tmp_path):
    from tests.harness.audit_rewards import misbehaving

    report = audit_reward(misbehaving, cases=[_cases(tmp_path, [_row("r", "right", 1), _row("w", "wrong", 0)])],
                          builtin=False)
    assert report.passed and report.reward == "misbehaving"
    with pytest.raises(ValueError, match="cannot be pickled"):
        audit_reward(lambda prompts, completions, **kw: [0.0], kind="format")


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=400))
def test_property_shown_completions_are_plain_ascii(text):
    from trl_rlvr.audit.scorecard import _snippet

    shown = _snippet(text)
    assert shown.isascii() and all(c.isprintable() for c in shown)
    if len(text) <= 160 and text.isascii() and text.isprintable():
        assert shown == text


def test_columns_are_renamed_for_a_reward_that_reads_another_name(tmp_path):
    cases = [_cases(tmp_path, [_row("r", "7", 1, columns={"solution": "7"}), _row("w", "8", 0, columns={"solution": "7"})])]
    plain = audit_reward("tests.harness.audit_rewards:reads_answer", cases=cases, builtin=False)
    assert [o.status for o in plain.outcomes] == ["error", "error"]  # no 'answer' keyword
    renamed = audit_reward("tests.harness.audit_rewards:reads_answer", cases=cases, builtin=False,
                           columns={"solution": "answer"})
    assert [o.score for o in renamed.outcomes] == [1.0, 0.0] and renamed.passed


def test_errors_before_any_case_runs(tmp_path):
    with pytest.raises(RewardStartError, match="Did you mean 'boxed_math'"):
        audit_reward("boxed_mat")
    with pytest.raises(RewardStartError, match="cannot import"):
        audit_reward("tests.harness.audit_rewards:no_such_function")
    with pytest.raises(RewardStartError, match="names a reward model"):
        audit_reward("some-org/some-reward-model")
    with pytest.raises(RewardStartError, match="has no option 'nope'"):
        audit_reward("think_format", options={"nope": 1})
    with pytest.raises(ValueError, match="declares no reward_kind.*--kind"):
        audit_reward("tests.harness.audit_rewards:needs_kind")
    with pytest.raises(ValueError, match="unknown reward kind"):
        audit_reward("think_format", kind="maths")


@pytest.mark.parametrize("name, kind", [("boxed_math", "math_answer"), ("code_sandbox", "code"),
                                        ("think_format", "format"), ("accuracy_reward", "math_answer"),
                                        ("think_format_reward", "format")])
def test_rewards_declare_their_kind(name, kind):
    from trl_rlvr.rewards import import_reward_function, load_reward

    assert load_reward(name, **({"prestart": False} if name == "boxed_math" else {})).reward_kind == kind
    if name in ("boxed_math", "code_sandbox", "think_format"):  # the ready-made functions for TRL's own CLI
        assert import_reward_function(f"reward_plugins.{name}:reward").reward_kind == kind


def test_conversational_completions_for_trls_rewards(tmp_path):
    cases = _cases(tmp_path, [_row("r", "<think>r</think> 5", 1), _row("w", "5", 0)])
    report = audit_reward("think_format_reward", cases=[cases], builtin=False, messages=True)
    assert {(o.case.id.split("~")[0], o.status, o.score) for o in report.outcomes} == {("r", "scored", 1.0),
                                                                                     ("w", "scored", 0.0)}
    plain = audit_reward("think_format_reward", cases=[cases], builtin=False)  # TRL's reads completion[0]["content"]
    assert {o.status for o in plain.outcomes} == {"error"}


def test_builtin_think_format_accepts_every_right_answer():
    report = audit_reward("think_format")
    assert report.kind == "format"
    assert (report.false_negatives, report.errors, report.timeouts) == ([], [], [])


def test_builtin_think_format_accepts_no_wrong_answer():
    report = audit_reward("think_format")
    assert [o.case.id for o in report.false_positives] == []


# -- the naive example rewards -----------------------------------------------------------------------------------
def test_naive_math_reward_is_caught():
    report = audit_reward("examples.naive_rewards:naive_math_reward")
    flagged = {r.name for r in report.classes() if r.false_positives}
    assert {"hedging", "contains_gold", "bad_gold", "latex_tricks"} <= flagged
    assert not report.passed


def test_naive_code_reward_is_caught(tmp_path):
    picked = [c for c in builtin_corpus("code").cases
              if c.cls == "agreement" and c.columns.get("tests") or c.cls in ("lying_objects", "exits")]
    rows = [{"id": c.id, "class": c.cls, "completion": c.completion, "expected": c.expected, "columns": c.columns}
            for c in picked]
    report = audit_reward("examples.naive_rewards:naive_code_reward", cases=[_cases(tmp_path, rows)], builtin=False,
                          deadline=5.0)
    rows = {r.name: r for r in report.classes()}
    assert rows["lying_objects"].false_positives >= 4
    assert rows["exits"].errors >= 5  # SystemExit & co. escape it; os._exit ends its process
    assert any(o.status == "crash" for o in report.outcomes)
    assert rows["agreement"].false_negatives == 0 and not report.passed


# -- the command line (one subprocess) -----------------------------------------------------------------------------
def test_cli_runs_with_reward_options_own_cases_and_writes_json(tmp_path):
    cases = _cases(tmp_path, [_row("ok", "<think>r</think> <answer>5</answer>", 1),
                              _row("no-answer-tag", "<think>r</think> 5", 0, cls="answer_tag"),
                              _row("empty", "<think>r</think> <answer> </answer>", 0, cls="answer_tag")])
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "trl_rlvr.scripts.cli", "rewards", "audit", "think_format",
                           "--answer_tag", "answer", "--only_cases", "--cases", cases, "--json", str(out),
                           "--seed", "5", "--variants", "2"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout and "answer_tag" in proc.stdout
    report = json.loads(out.read_text())
    assert {"reward", "kind", "cases", "false_positives", "false_negatives", "errors", "timeouts", "classes"} <= set(report)
    assert report["reward"] == "think_format" and report["options"] == {"answer_tag": "answer"}
    # each case and up to 2 distinct variants of it
    assert report["cases"] == 3 + report["variant_cases"] and 3 <= report["variant_cases"] <= 6
    assert report["calls"]["seed"] == 5 and report["calls"]["variants"] == 2
    assert {c["name"]: c["false_positives"] for c in report["classes"]} == {"custom": 0, "answer_tag": 0}


def test_cli_exit_status(tmp_path, capsys):
    from trl_rlvr.scripts.cli import main

    cases = _cases(tmp_path, [_row("r", "right", 1), _row("w", "wrong", 0)])
    good, ones = "tests.harness.audit_rewards:misbehaving", "tests.harness.audit_rewards:always_one"
    assert main(["rewards", "audit", good, "--only_cases", "--cases", cases]) == 0
    assert main(["rewards", "audit", ones, "--only_cases", "--cases", cases]) == 1
    assert main(["rewards", "audit", ones, "--cases", cases]) == 1  # no kind: only these cases
    assert main(["rewards", "audit", ones]) == 2  # no kind, no cases
    assert "declares no reward_kind" in capsys.readouterr().err
    assert main(["rewards", "audit", "think_format", "--help"]) == 0
    assert "--min_right_rate" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    assert main(["rewards", "audit", "think_format", "--cases", str(bad)]) == 2
    assert f"{bad}:1" in capsys.readouterr().err


def test_a_wrong_answer_scored_none_where_a_score_is_due_escapes(tmp_path):
    """None is a rejection unless the case is owed a score (must_score, a file's header or the case): then a wrong
    answer scored None has escaped its penalty (GRPO gives it no advantage), and the audit fails."""
    rows = [_row("r", "right", 1), _row("w", "none", 0), _row("w2", "none", 0, must_score=False)]
    owed = _cases(tmp_path, [{"corpus": "c", "version": 1, "must_score": True}, *rows], "owed.jsonl")
    plain = _cases(tmp_path, rows, "plain.jsonl")
    report = audit_reward("tests.harness.audit_rewards:none_for_wrong", cases=[owed], builtin=False, kind="format",
                          variants=0, seed=1)
    assert [o.case.id for o in report.escaped] == ["w"] and not report.passed
    assert report.to_json()["escaped"] == 1 and "scored None where a score is due" in report.reasons()[0]
    assert {r.name: r.escaped for r in report.classes()} == {"custom": 1}
    assert audit_reward("tests.harness.audit_rewards:none_for_wrong", cases=[plain], builtin=False, kind="format",
                        variants=0, seed=1).passed
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"corpus": "c", "must_score": "yes"}) + "\n" + json.dumps(rows[0]) + "\n")
    with pytest.raises(CorpusError, match="a header is"):
        load_corpus(bad)


def test_the_2026_coding_hacks_catch_a_lenient_harness():
    """A grader built as the 2026 reviews found them (runner defined before the program, exit status 0 read as a
    pass, failures that read like the machinery's scored None): the new classes each catch it."""
    picked = [c for c in builtin_corpus("code").cases if c.cls in ("runner_override", "exits", "infra_lookalike")
              or c.cls == "agreement" and c.columns.get("tests")]
    rows = {c.cls for c in picked}
    assert rows == {"runner_override", "exits", "infra_lookalike", "agreement"}
    report = audit_reward("tests.harness.audit_rewards:lenient_code_harness", kind="code", variants=0, seed=2,
                          deadline=20.0, builtin=False, cases=[_corpus_file(picked)])
    by_class = {r.name: r for r in report.classes()}
    assert by_class["agreement"].false_negatives == 0 and by_class["agreement"].false_positives == 0
    assert by_class["runner_override"].false_positives >= 2  # run_tests()/check() redefined
    assert by_class["exits"].false_positives >= 5  # exit 0 before (or instead of) the tests
    assert by_class["infra_lookalike"].escaped >= 4  # a kill, a timeout or memory message: None, no penalty
    assert not report.passed


def _corpus_file(cases):
    import tempfile

    path = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
    with path as f:
        f.write(json.dumps({"corpus": "code-subset", "version": 1, "must_score": True}) + "\n")
        for c in cases:
            f.write(json.dumps({"id": c.id, "class": c.cls, "completion": c.completion, "expected": c.expected,
                                "columns": c.columns}) + "\n")
    return path.name


@pytest.mark.slow
def test_builtin_code_sandbox_accepts_no_wrong_answer_and_every_right_one():
    report = audit_reward("code_sandbox")
    assert report.kind == "code"
    assert [o.case.id for o in report.false_positives] == []
    assert (report.false_negatives, report.escaped, report.errors, report.timeouts) == ([], [], [], [])
