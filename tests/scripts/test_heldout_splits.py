"""The tool job's dev and test splits: the dev set is today's held-out set, unchanged; the test split's three kinds
are new problems (by number and by text), and its novel wordings occur in no training stage."""

import re
from collections import Counter
from types import SimpleNamespace

import pytest

from tests.scripts.test_word_problems import numbers_in, skeleton
from trl_rlvr.tasks.heldout_splits import (
    NOVEL_FRAMES,
    NOVEL_QUESTION_FORMS,
    TEST_KINDS,
    novel_combinations,
    novel_rows,
    rows_of_test_split,
)
from trl_rlvr.tasks.word_problems import (
    FRAMES,
    NUMBER_FORMATS,
    OPERATIONS,
    QUESTION_FORMS,
    WORDINGS,
    composed_cold_start_traces,
    composed_rows,
    problems,
)


def job_rows(eval_split="dev", per_kind=128, seed=0):
    """The job's RL and held-out rows at its defaults (512 RL questions, 32 + 32 dev questions)."""
    from trl_rlvr.tasks.tool_arithmetic import question_rows

    args = SimpleNamespace(task="composed", dataset_seed=seed, num_train_samples=512, num_eval_samples=32,
                           num_eval_training_wordings=32, eval_split=eval_split, test_per_kind=per_kind)
    return question_rows(args)


def literal_pieces(template: str) -> list[str]:
    """The fixed text of a frame or form between its placeholders (pieces of 12 characters or more)."""
    return [p.strip() for p in re.split(r"\{\w+\}", template) if len(p.strip()) >= 12]


def test_dev_is_todays_held_out_set():
    train, dev = job_rows("dev")
    from trl_rlvr.tasks.word_problems import composed_new_questions

    assert train == composed_rows("train", 512, seed=0)  # the RL stream, as committed
    assert dev == [{**r, "wordings": "training"} for r in composed_new_questions(32, 0, train)] + \
        [{**r, "wordings": "unseen"} for r in composed_rows("heldout", 32, seed=0)]


@pytest.mark.parametrize("seed", [0, 3])
def test_the_test_split_is_new_problems_by_number_and_by_text(seed):
    train, dev = job_rows("dev", seed=seed)
    train_again, test = job_rows("test", seed=seed)
    assert train_again == train  # the test split changes no training question
    assert Counter(r["wordings"] for r in test) == dict.fromkeys(TEST_KINDS, 128)
    assert all(r["split"] == "test" for r in test) and test == job_rows("test", seed=seed)[1]
    cold = composed_rows("sft", 1000, seed=seed)
    seen = train + dev + cold
    # by number: no (a, op, b) of the RL stream, the cold start's pool, dev or another test question
    assert len(problems(test)) == len(test) and not problems(test) & problems(seen)
    # by text: no question is a training, cold-start or dev question
    traces = composed_cold_start_traces(24, seed=seed, system_prompt="S")
    texts = {r["question"] for r in seen} | {t["messages"][1]["content"] for t in traces}
    assert not {r["question"] for r in test} & texts
    for row in test:
        a, b = row["a"], row["b"]
        assert sorted(numbers_in(row["question"])) == sorted([a, b]), row["question"]
        assert row["answer"] == row["solution"] == str({"*": a * b, "+": a + b, "-": a - b}[row["op"]])
    # each kind's wordings: training ones, held-out combinations, novel ones
    train_skeletons = {skeleton(r["question"]) for r in train}
    kinds = {kind: {skeleton(r["question"]) for r in test if r["wordings"] == kind} for kind in TEST_KINDS}
    assert kinds["training"] <= {skeleton(r["question"]) for r in composed_rows("train", 4000, seed=seed)}
    assert not (kinds["unseen"] | kinds["novel"]) & train_skeletons


def test_each_kind_covers_every_number_format_and_operation():
    _, test = job_rows("test")
    for kind in TEST_KINDS:
        rows = [r for r in test if r["wordings"] == kind]
        assert {(r["op"], r["number_format"]) for r in rows} == {(op, f) for op in OPERATIONS
                                                                 for f in NUMBER_FORMATS[op]}
        assert Counter(r["op"] for r in rows) == {op: len(rows) // 3 + (i < len(rows) % 3)
                                                  for i, op in enumerate(OPERATIONS)}


def test_novel_wordings_never_occur_in_training():
    everything_trained = [t for _, t in (p for op in WORDINGS for p in WORDINGS[op])]
    everything_trained += [t for op in OPERATIONS for t in FRAMES[op] + QUESTION_FORMS[op]]
    novel = [t for op in OPERATIONS for t in NOVEL_FRAMES[op] + NOVEL_QUESTION_FORMS[op]]
    assert not set(novel) & set(everything_trained)
    # no fixed piece of a novel frame or form is in an RL question (a large stream) or a cold-start trace
    rl = composed_rows("train", 4096, seed=0) + composed_rows("train", 1024, seed=5)
    traces = composed_cold_start_traces(1000, seed=0, system_prompt="S")
    trained_text = "\n".join([r["question"] for r in rl] + [m["content"] for t in traces for m in t["messages"]
                                                             if isinstance(m.get("content"), str)])
    pieces = [p for t in novel for p in literal_pieces(t)]
    assert len(pieces) >= len(novel)  # every frame and form has one piece to look for
    assert [p for p in pieces if p in trained_text] == []
    # the novel rows use every novel (frame, form) and nothing else
    rows = novel_rows(3 * 24 * 2, seed=1)
    assert {r["wording"] for r in rows} == {f"novel|{op}|{f}|{q}|{NUMBER_FORMATS[op][n]}"
                                            for op, f, q, n in novel_combinations()}
    assert not {skeleton(r["question"]) for r in rows} & {skeleton(r["question"]) for r in rl}


def test_bad_kinds_and_the_templates_task_are_named():
    with pytest.raises(ValueError, match="kinds"):
        rows_of_test_split(0, kinds=("training", "hard"))
    from trl_rlvr.tasks.tool_arithmetic import ToolR1Arguments

    with pytest.raises(ValueError, match="eval_split"):
        ToolR1Arguments(task="templates", eval_split="test", num_eval_training_wordings=0)
    with pytest.raises(ValueError, match="eval_split"):
        ToolR1Arguments(eval_split="final")


def test_the_table_names_each_kind_and_shows_intervals_and_number_formats():
    from trl_rlvr.tasks.tool_arithmetic import arm_summary, pass1_by, pass1_intervals, summary_table

    rows = [{"op": "+", "wordings": "novel", "number_format": "comma"},
            {"op": "*", "wordings": "unseen", "number_format": "words"},
            {"op": "+", "wordings": "unseen", "number_format": "plain"}]
    per_question = [{"index": 0, "right": 2, "right_flags": [1, 1]}, {"index": 1, "right": 0, "right_flags": [0, 0]},
                    {"index": 2, "right": 1, "right_flags": [1, 0]}]
    result = {"mean@n": 0.5, "n": 2, "questions": 3, "pass@k": {2: 0.67}, "format_rate": 1.0, "truncated_frac": 0.0,
              "length_right": 5.0, "length_wrong": 6.0, "pass@1_by_wordings": pass1_by(rows, per_question, "wordings"),
              "pass@1_by_number_format": pass1_by(rows, per_question, "number_format"),
              "pass@1_intervals": pass1_intervals(rows, per_question)}
    assert result["pass@1_intervals"]["novel"] == [1.0, 1.0] and result["pass@1_intervals"]["unseen"][0] == 0.0
    summary = arm_summary(result)
    assert summary["pass@1 format comma"] == 1.0 and summary["pass@1 format words"] == 0.0
    low, high = summary["pass@1 interval"]
    assert 0.0 <= low <= 0.5 <= high <= 1.0
    table = summary_table({"cold start (tool)": summary})
    for label in ("trained sentences, number format held out", "new story frames and question forms",
                  "95% interval (bootstrap over questions)", "thousands separators (4,821)",
                  "a factor in words (fifty-two)"):
        assert label in table
    assert "unseen wordings" not in table and "new questions, training wordings" not in table  # no such rows here


def test_problems_are_kept_out_even_when_a_stream_repeats_the_dev_one(monkeypatch):
    """Independent seeds rarely collide, so the exclusion is tested where they do: each test kind drawn from the dev
    stream of its wordings (the held-out combinations' seed; the RL stream's seed) still shares no problem."""
    from trl_rlvr.tasks import heldout_splits

    monkeypatch.setattr(heldout_splits, "TEST_SEEDS", {"training": 0, "unseen": 1_000_003, "novel": 1_000_003})
    train, dev = job_rows("dev")
    test = rows_of_test_split(0, train + dev, per_kind=64)
    assert len(problems(test)) == len(test) and not problems(test) & problems(train + dev)
