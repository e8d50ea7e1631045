"""The tool job's held-out questions in two splits: **dev**, on which settings are chosen, and **test**, reported only
in the final table.

* **dev** is the job's held-out set as it always was (:func:`trl_rlvr.tasks.tool_arithmetic.question_rows`): 32 new
  questions in the training wordings and 32 in held-out combinations of (frame, form, number format).
* **test** (:func:`rows_of_test_split`): three kinds, each drawn from its own seed, none of whose problems ``(a, op, b)`` is a
  problem of the RL stream, the cold start, the dev set or another test kind:

  - ``training``: new questions in the training wordings (``composed_rows("train", ...)``);
  - ``unseen``: held-out combinations of the Latin-square rule
    (:func:`trl_rlvr.tasks.word_problems.is_heldout_combination`). Every such sentence (frame + question form) is
    trained with its other number format, so this kind holds out **a number format per sentence**, not the
    sentence; the key keeps the job's committed name, the table says what it holds;
  - ``novel``: story frames and question forms written for the test only (:data:`NOVEL_FRAMES`,
    :data:`NOVEL_QUESTION_FORMS`, kept here, apart from the generator's), in every number format: language no
    training stage saw.

Every row of a kind carries ``number_format`` (``plain``, ``comma``, ``words``), so pass@1 is also reported per number
format. Everything is pure and seeded.
"""

from __future__ import annotations

import random

from trl_rlvr.tasks.word_problems import (
    _HELDOUT_POOL,
    NUMBER_FORMATS,
    OBJECTS,
    OPERATIONS,
    SUBJECTS,
    _composed,
    composed_row,
    composed_rows,
    format_number,
    operands,
    problems,
)

#: Story frames no training stage uses, per operation (``{a}``, ``{b}``: operands; ``{subj}``, ``{obj}``: fillers).
NOVEL_FRAMES: dict[str, tuple[str, ...]] = {
    "+": (
        "{subj} counted {a} {obj} in the morning, and by the evening another {b} {obj} had arrived.",
        "The first delivery brought {a} {obj} and the second delivery brought {b} {obj}.",
        "A warehouse keeps {a} {obj} on the ground floor and {b} {obj} upstairs.",
        "Last year {subj} owned {a} {obj}; this year {subj} added {b} {obj} to the collection.",
    ),
    "-": (
        "A cupboard held {a} {obj} until {b} of them were handed out.",
        "{subj} ordered {a} {obj}, but {b} {obj} arrived broken and were thrown out.",
        "Out of {a} {obj} in a warehouse, {b} {obj} were shipped away.",
        "{subj} brought {a} {obj} to a fair and sold {b} {obj} there.",
    ),
    "*": (
        "{subj} fills {a} crates, putting {b} {obj} into every crate.",
        "Over {a} weeks, {subj} gathers {b} {obj} each week.",
        "A garden has {a} beds, and {b} {obj} sit in each bed.",
        "A hall is set up with {a} tables, each carrying {b} {obj}.",
    ),
}
_NOVEL_TOTAL_FORMS = ("What is the combined count of {obj}?", "Give the overall count of {obj}.",
                      "Counting all of them, how many {obj} are there?")
#: Question forms no training stage uses, per operation.
NOVEL_QUESTION_FORMS: dict[str, tuple[str, ...]] = {
    "+": _NOVEL_TOTAL_FORMS,
    "*": _NOVEL_TOTAL_FORMS,
    "-": ("How many {obj} does that leave?", "What count of {obj} is still left over?",
          "After that, how many {obj} are there?"),
}
#: Questions per kind of the test split (at least 128 each: a column's 95% interval is then about +-6 points).
TEST_PER_KIND = 128
TEST_KINDS = ("training", "unseen", "novel")
#: How many RL-stream problems are kept out of the test split (any RL stream up to that size: a run with more RL
#: questions passes its own rows to :func:`rows_of_test_split`).
RL_POOL = 4096
#: Seeds of the test kinds, offsets of the dataset seed (the dev set uses 0, +7, +1_000_003 and +2_000_003).
TEST_SEEDS = {"training": 3_000_017, "unseen": 4_000_037, "novel": 5_000_011}


def novel_combinations() -> list[tuple[str, int, int, int]]:
    """(operation, novel frame, novel form, number format) of the ``novel`` kind, in a fixed order."""
    return [(op, frame, form, fmt) for op in OPERATIONS for frame in range(len(NOVEL_FRAMES[op]))
            for form in range(len(NOVEL_QUESTION_FORMS[op])) for fmt in range(len(NUMBER_FORMATS[op]))]


def compose_novel_question(op: str, frame: int, form: int, number_format: int, a: int, b: int, subject: str,
                           obj: str) -> str:
    """:func:`trl_rlvr.tasks.word_problems.compose_question` over the novel frames and forms."""
    fmt = NUMBER_FORMATS[op][number_format]
    fill = dict(a=format_number(a, fmt), b=format_number(b, fmt), subj=subject, obj=obj)
    text = NOVEL_FRAMES[op][frame].format(**fill) + " " + NOVEL_QUESTION_FORMS[op][form].format(**fill)
    return text[0].upper() + text[1:]


def novel_rows(n: int, seed: int, exclude=frozenset()) -> list[dict]:
    """``n`` questions in the novel wordings, balanced as the training stream (operations in turn, each operation's
    combinations in seeded rounds), no problem of ``exclude`` and no problem twice; the columns of
    :func:`~trl_rlvr.tasks.word_problems.composed_rows` (``wording`` = ``"novel|op|frame|form|format"``)."""
    rng = random.Random(seed)
    by_op = {op: [c for c in novel_combinations() if c[0] == op] for op in OPERATIONS}
    queues: dict[str, list] = {op: [] for op in OPERATIONS}
    seen, rows = set(exclude), []
    while len(rows) < n:
        op = OPERATIONS[len(rows) % len(OPERATIONS)]
        if not queues[op]:
            queues[op] = rng.sample(by_op[op], len(by_op[op]))
        _, frame, form, fmt = queues[op][-1]
        a, b = operands(rng, op)
        if (a, op, b) in seen:
            continue
        queues[op].pop()
        seen.add((a, op, b))
        question = compose_novel_question(op, frame, form, fmt, a, b, rng.choice(SUBJECTS), rng.choice(OBJECTS))
        rows.append(composed_row(question, a, op, b, frame, form, fmt, kind="novel|"))
    return rows


def kept_out(seed: int, used_rows=()) -> set[tuple[int, str, int]]:
    """The problems no test question may be: ``used_rows`` (the run's RL and dev rows), the first :data:`RL_POOL`
    of the RL stream, the first 1000 of the cold start's and of the held-out combinations' streams."""
    return (problems(list(used_rows)) | problems(composed_rows("train", RL_POOL, seed=seed))
            | problems(composed_rows("sft", 1000, seed=seed))
            | problems(composed_rows("heldout", _HELDOUT_POOL, seed=seed)))


def rows_of_test_split(seed: int = 0, used_rows=(), per_kind: int = TEST_PER_KIND, kinds=TEST_KINDS) -> list[dict]:
    """The test split: ``per_kind`` questions of each of ``kinds`` (``training``, ``unseen``, ``novel``: the module's
    docstring), kind after kind, each from its own seed (:data:`TEST_SEEDS`), none a problem of
    :func:`kept_out` or of an earlier kind. Rows carry ``wordings`` (the kind) and ``split="test"``."""
    unknown = [k for k in kinds if k not in TEST_KINDS]
    if unknown:
        raise ValueError(f"test kinds must be among {TEST_KINDS}, got {unknown}")
    taken = kept_out(seed, used_rows)
    out = []
    for kind in kinds:
        kind_seed = seed + TEST_SEEDS[kind]
        if kind == "novel":
            rows = novel_rows(per_kind, kind_seed, exclude=taken)
        else:  # the generator's own streams, from the kind's seed, with the problems taken so far left out
            rows = _composed(per_kind, kind_seed, "train" if kind == "training" else "heldout", True, exclude=taken)
        taken |= problems(rows)
        out += [{**r, "wordings": kind, "split": "test"} for r in rows]
    return out
