"""The composed word problems: questions from parts, held-out combinations of parts, balanced seeded streams."""

import re
from collections import Counter

import pytest

from trl_rlvr.tasks.word_problems import (
    FRAMES,
    NUMBER_FORMATS,
    OBJECTS,
    OPERATIONS,
    QUESTION_FORMS,
    SUBJECTS,
    combinations,
    composed_cold_start_traces,
    composed_new_questions,
    composed_rows,
    format_number,
)

WORDS = {format_number(v, "words"): v for v in range(1, 100)}


def numbers_in(question: str) -> list[int]:
    """The operands as the question writes them, read back (digits with or without commas, or words)."""
    found = []
    for token in re.findall(r"[\d,]*\d|[a-z]+(?:-[a-z]+)?", question):
        if token[0].isdigit():
            found.append(int(token.replace(",", "")))
        elif token in WORDS and token not in ("one",):
            found.append(WORDS[token])
    return found


def skeleton(question: str) -> str:
    """The wording of a question: numbers (by their format), subject and object replaced by placeholders."""
    text = re.sub(r"\d{1,3}(?:,\d{3})+", "C", question)
    text = re.sub(r"\d+", "N", text)
    for word in sorted(WORDS, key=len, reverse=True):
        text = re.sub(rf"\b{word}\b", "W", text)
    for filler in sorted(SUBJECTS + OBJECTS, key=len, reverse=True):
        text = re.sub(rf"\b{re.escape(filler)}\b", "X", text, flags=re.IGNORECASE)
    return text


def test_rows_are_right_seeded_and_a_prefix_of_longer_streams():
    rows = composed_rows("train", 300, seed=5)
    assert rows == composed_rows("train", 300, seed=5) and composed_rows("train", 60, seed=5) == rows[:60]
    assert rows != composed_rows("train", 300, seed=6)
    for row in rows + composed_rows("heldout", 100, seed=5):
        a, b = row["a"], row["b"]
        assert sorted(numbers_in(row["question"])) == sorted([a, b]), row["question"]
        assert row["answer"] == row["solution"] == str({"*": a * b, "+": a + b, "-": a - b}[row["op"]])
        assert row["question"][0].isupper() and row["question"].endswith(("?", "."))


def test_unseen_wordings_are_new_combinations_of_seen_parts():
    train, heldout = combinations("train"), combinations("heldout")
    assert not set(train) & set(heldout) and set(combinations("sft")) <= set(train)
    for op in OPERATIONS:
        mine = [c for c in heldout if c[0] == op]
        total = len(FRAMES[op]) * len(QUESTION_FORMS[op]) * len(NUMBER_FORMATS[op])
        assert len(mine) == total // 4 and len([c for c in train if c[0] == op]) == total - total // 4
        for position, size in ((1, len(FRAMES[op])), (2, len(QUESTION_FORMS[op])), (3, len(NUMBER_FORMATS[op]))):
            seen = {c[position] for c in train if c[0] == op}
            assert seen == set(range(size)) == {c[position] for c in mine}  # every part on both sides
    # as text: no held-out question is worded like any training question
    train_text = {skeleton(r["question"]) for r in composed_rows("train", 900, seed=1)}
    held_text = {skeleton(r["question"]) for r in composed_rows("heldout", 300, seed=1)}
    assert len(train_text) >= len(train) and len(held_text) >= len(heldout)  # (a - with b < 1000: two skeletons)
    assert not train_text & held_text


def test_heldout_operands_are_never_asked_in_training():
    heldout = {(r["a"], r["op"], r["b"]) for r in composed_rows("heldout", 500, seed=2)}
    for split in ("train", "sft"):
        rows = composed_rows(split, 500, seed=2)
        assert not {(r["a"], r["op"], r["b"]) for r in rows} & heldout
        assert len({(r["a"], r["op"], r["b"]) for r in rows}) == len(rows)


def test_new_questions_in_training_wordings_are_problems_no_stage_saw():
    train, sft = composed_rows("train", 400, seed=4), composed_rows("sft", 1000, seed=4)
    new = composed_new_questions(60, seed=4, rl_rows=train)
    problems = {(r["a"], r["op"], r["b"]) for r in new}
    assert len(problems) == 60 and new == composed_new_questions(60, seed=4, rl_rows=train)
    assert not problems & {(r["a"], r["op"], r["b"]) for r in train + sft + composed_rows("heldout", 500, seed=4)}
    train_wordings = {f"{op}|{f}|{q}|{NUMBER_FORMATS[op][n]}" for op, f, q, n in combinations("train")}
    assert {r["wording"] for r in new} <= train_wordings
    assert [r["op"] for r in new[:3]] == list(OPERATIONS)  # balanced like the training stream


def test_streams_are_operation_and_wording_balanced():
    rows = composed_rows("train", 3 * 30 * 4, seed=3)  # four rounds of every wording of every operation
    assert [r["op"] for r in rows[:6]] == list(OPERATIONS) * 2
    assert set(Counter(r["op"] for r in rows).values()) == {120}
    assert set(Counter(r["wording"] for r in rows).values()) == {4}
    window = rows[:90]  # the first round: each wording once
    assert len({r["wording"] for r in window}) == 90
    unbalanced = composed_rows("train", 360, seed=3, balanced=False)
    assert len(set(Counter(r["wording"] for r in unbalanced).values())) > 1


def test_cold_start_traces_use_the_sft_wordings_only():
    sft = {f"{op}|{f}|{q}|{NUMBER_FORMATS[op][n]}" for op, f, q, n in combinations("sft")}
    rows = composed_rows("sft", 30, seed=0)
    assert {r["wording"] for r in rows} == sft
    traces = composed_cold_start_traces(30, seed=0, system_prompt="S")
    for trace, row in zip(traces, rows, strict=True):
        system, user, call, tool, final = trace["messages"]
        assert user["content"] == row["question"] and tool["content"] == row["answer"]
        assert call["tool_calls"][0]["function"]["arguments"]["code"] == f"print({row['a']} {row['op']} {row['b']})"
        assert final["content"] == f"\\boxed{{{row['answer']}}}"


def test_bad_split_and_format_are_named():
    with pytest.raises(ValueError, match="split"):
        composed_rows("rl", 3)
    with pytest.raises(ValueError, match="number format"):
        format_number(3, "roman")
    assert format_number(4821, "comma") == "4,821" and format_number(47, "words") == "forty-seven"
