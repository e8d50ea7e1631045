"""Multi-digit arithmetic word problems with held-out wordings, and cold-start traces that call a Python tool.

The task a 135M model cannot do in its head: ``347 * 28``, ``4821 + 3967``, ``7305 - 2849`` inside a short story.
Each operation has several *wordings* (templates); they are split three ways, so that the held-out evaluation asks
in words no training stage has seen:

* ``sft``: the few wordings of the cold-start traces (:func:`cold_start_traces`);
* ``rl``: those and more wordings for RL (:func:`word_problem_rows` with ``split="train"``);
* ``heldout``: wordings used only by the evaluation (``split="heldout"``);
* ``rl_extra``: three more RL wordings per operation, off by default (``extra_rl_wordings=True``; an experiment
  of the tool job, examples/README.md).

Operands of the held-out problems are drawn from their own seed and never asked in training. Every function is
pure and seeded: the same arguments give the same rows.

**Composed wordings** (:func:`composed_rows`, :func:`composed_cold_start_traces`): a question is built from parts,
an operation's *frame* (the story: ``{subj} collects {a} {obj} on Monday and {b} {obj} on Tuesday.``), a *question
form* (``What is the total number of {obj}?``), a *number format* (``4821`` or ``4,821``; for ``*``, ``52`` or ``fifty-two``), and fillers (a subject, a
countable object). A *wording* is one (operation, frame, form, format) combination: 5 x 4 x 2 = 40 per operation.
A quarter of the combinations (:func:`is_heldout_combination`, a Latin-square rule) is held out: every frame, form and
format is seen in training, but not in those combinations, so "unseen wording" asks the model to generalise to new
compositions of parts it knows, not to recognise one of a handful of sentences. The cold start uses two combinations
per operation (:data:`SFT_COMBINATIONS`), so RL has the other 28 training wordings to learn. Streams are operation-
and wording-balanced: row i has operation ``OPERATIONS[i % 3]``, and each operation's wordings come in seeded
rounds, every wording once per round.
"""

from __future__ import annotations

import random

#: Wordings per operation: (split, template). ``{a}``, ``{b}``: operands; ``{name}``, ``{item}``: fillers.
WORDINGS: dict[str, list[tuple[str, str]]] = {
    "*": [
        ("sft", "A farm has {a} rows of trees with {b} trees in each row. How many trees are there?"),
        ("sft", "{name} buys {a} packs of {item}. Each pack holds {b} {item}. How many {item} does {name} buy?"),
        ("rl", "A theater has {a} rows with {b} seats in each row. How many seats does it have?"),
        ("rl", "Each of {a} boxes contains {b} {item}. How many {item} are there altogether?"),
        ("rl", "{name} reads {b} pages a day for {a} days. How many pages does {name} read?"),
        ("heldout", "A truck carries {a} crates and every crate weighs {b} kilograms. What is the total weight in "
                    "kilograms?"),
        ("heldout", "{name} saves {b} dollars every week for {a} weeks. How many dollars has {name} saved?"),
        ("rl_extra", "There are {a} classrooms and each classroom has {b} desks. How many desks are there in total?"),
        ("rl_extra", "A printer prints {b} pages per minute. How many pages does it print in {a} minutes?"),
        ("rl_extra", "A baker makes {b} loaves every day for {a} days. How many loaves does the baker make?"),
    ],
    "+": [
        ("sft", "A library has {a} books and gets {b} new books. How many books does it have now?"),
        ("sft", "{name} has {a} {item} and finds {b} more. How many {item} does {name} have now?"),
        ("rl", "On Monday {a} people visited a museum and on Tuesday {b} people visited. How many visitors came "
               "on the two days?"),
        ("rl", "A school has {a} girls and {b} boys. How many students does it have?"),
        ("rl", "A shop sold {a} {item} in May and {b} {item} in June. How many {item} did it sell in both months?"),
        ("heldout", "A train carries {a} passengers and {b} more get on at the next station. How many passengers "
                    "are on the train?"),
        ("heldout", "{name} walked {a} meters in the morning and {b} meters in the evening. How many meters did "
                    "{name} walk that day?"),
        ("rl_extra", "{name} scored {a} points in the first game and {b} points in the second game. How many points "
                     "did {name} score in total?"),
        ("rl_extra", "A farm has {a} chickens and {b} ducks. How many birds are on the farm?"),
        ("rl_extra", "A pool holds {a} liters and {b} liters are poured in. How many liters are in the pool now?"),
    ],
    "-": [
        ("sft", "A tank holds {a} liters of water and {b} liters leak out. How many liters are left?"),
        ("sft", "{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?"),
        ("rl", "A store had {a} {item} and sold {b} of them. How many {item} does it have left?"),
        ("rl", "A road is {a} meters long and {b} meters are already paved. How many meters are not paved yet?"),
        ("rl", "A stadium has {a} seats and {b} of them are taken. How many seats are free?"),
        ("heldout", "A plane flies {a} kilometers and has already flown {b} kilometers. How many kilometers does "
                    "it still have to fly?"),
        ("heldout", "{name} had {a} dollars and spent {b} dollars on a bike. How many dollars does {name} have "
                    "now?"),
        ("rl_extra", "A bakery baked {a} cookies and {b} of them were eaten. How many cookies remain?"),
        ("rl_extra", "{name} needs {a} points to win and already has {b}. How many more points does {name} need?"),
        ("rl_extra", "A rope is {a} centimeters long and {b} centimeters are cut off. How many centimeters long is "
                     "the rope now?"),
    ],
}

NAMES = ("Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ivy", "Jon", "Kim", "Leo", "Mia", "Ned")
ITEMS = ("apples", "pens", "cards", "stamps", "marbles", "stickers", "shells", "coins")
OPERATIONS = tuple(WORDINGS)
SPLITS = ("sft", "rl", "rl_extra", "heldout")


def operands(rng: random.Random, op: str) -> tuple[int, int]:
    """``*``: 3 digits by 2 digits; ``+``: two 4-digit numbers; ``-``: 4 digits minus 3 or 4 digits, positive."""
    if op == "*":
        return rng.randint(101, 999), rng.randint(12, 99)
    if op == "+":
        return rng.randint(1001, 9999), rng.randint(1001, 9999)
    a = rng.randint(2001, 9999)
    return a, rng.randint(101, a - 100)


def compute(a: int, op: str, b: int) -> int:
    return a * b if op == "*" else a + b if op == "+" else a - b


def problems(rows: list[dict]) -> set[tuple[int, str, int]]:
    """The ``(a, op, b)`` problems of ``rows``."""
    return {(r["a"], r["op"], r["b"]) for r in rows}


def wordings(splits: tuple[str, ...]) -> list[tuple[str, str]]:
    """(operation, template) of the wordings in ``splits``, in a fixed order."""
    return [(op, text) for op in OPERATIONS for split, text in WORDINGS[op] if split in splits]


def _problems(n: int, seed: int, splits: tuple[str, ...], exclude=frozenset()) -> list[dict]:
    rng = random.Random(seed)
    choices = wordings(splits)
    seen, rows = set(exclude), []
    while len(rows) < n:
        op, template = choices[rng.randrange(len(choices))]
        a, b = operands(rng, op)
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        question = template.format(a=a, b=b, name=rng.choice(NAMES), item=rng.choice(ITEMS))
        rows.append({"question": question, "answer": str(compute(a, op, b)), "solution": str(compute(a, op, b)),
                     "a": a, "op": op, "b": b})
    return rows


def word_problem_rows(split: str, n: int, seed: int = 0, extra_rl_wordings: bool = False) -> list[dict]:
    """``n`` problems: ``split="train"`` in the ``sft`` and ``rl`` wordings (and ``rl_extra`` with
    ``extra_rl_wordings``), ``"heldout"`` in the held-out wordings (their operands drawn first, from their own seed,
    and excluded from training). Rows: ``question``, ``answer`` (= ``solution``, the integer as a string), and the
    problem ``a``, ``op``, ``b``."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    heldout_seed = seed + 1_000_003
    if split == "heldout":
        return _problems(n, heldout_seed, ("heldout",))
    taken = problems(_problems(1000, heldout_seed, ("heldout",)))
    return _problems(n, seed, ("sft", "rl", "rl_extra") if extra_rl_wordings else ("sft", "rl"), exclude=taken)


def tool_code(row: dict) -> str:
    """The cell a cold-start trace runs: ``print(a op b)``."""
    return f"print({row['a']} {row['op']} {row['b']})"


def cold_start_traces(n: int, seed: int = 0, system_prompt: str | None = None) -> list[dict]:
    """``n`` conversations (``messages``) in the ``sft`` wordings: the question, one ``python`` tool call
    ``print(a op b)``, the tool's reply (the exact result, as the sandbox prints it) and ``\\boxed{result}``.
    Operands come from ``seed + 7`` and skip the held-out problems."""
    taken = problems(_problems(1000, seed + 1_000_003, ("heldout",)))
    rows = _problems(n, seed + 7, ("sft",), exclude=taken)
    return _traces(rows, system_prompt)


# ------------------------------------------------------------------------------------------------ composed wordings
#: Frames per operation: the story around the operands. ``{a}``, ``{b}``: operands; ``{subj}``: a subject; ``{obj}``:
#: a countable object (plural).
FRAMES: dict[str, tuple[str, ...]] = {
    "+": (
        "{subj} has {a} {obj} and gets {b} more.",
        "{subj} collects {a} {obj} on Monday and {b} {obj} on Tuesday.",
        "There are {a} {obj} in one box and {b} {obj} in another box.",
        "{subj} buys {a} {obj} and then {b} more {obj}.",
        "A crate holds {a} {obj}, and {b} {obj} are added to it.",
    ),
    "-": (
        "{subj} has {a} {obj} and gives away {b} of them.",
        "A shop had {a} {obj} and sold {b} of them.",
        "{subj} packed {a} {obj}, then {b} {obj} were lost.",
        "There were {a} {obj} in a store room, and {b} {obj} were taken out.",
        "{subj} starts with {a} {obj} and uses {b} of them.",
    ),
    "*": (
        "{subj} buys {a} packs of {obj} with {b} {obj} in each pack.",
        "There are {a} boxes and each box holds {b} {obj}.",
        "{subj} collects {b} {obj} every day for {a} days.",
        "A shelf has {a} rows with {b} {obj} in each row.",
        "Each of {a} bags contains {b} {obj}.",
    ),
}
_TOTAL_FORMS = ("How many {obj} are there in total?", "What is the total number of {obj}?",
                "How many {obj} is that altogether?", "Find the number of {obj} in all.")
#: Question forms per operation (each fits every frame of its operation).
QUESTION_FORMS: dict[str, tuple[str, ...]] = {
    "+": _TOTAL_FORMS,
    "*": _TOTAL_FORMS,
    "-": ("How many {obj} are left?", "How many {obj} remain?", "What is the number of {obj} that are left?",
          "Find how many {obj} are still there."),
}
#: Number formats per operation: how the operands are written. ``comma``: a thousands separator (4,821); ``words``:
#: the two-digit factor spelled out (fifty-two); both change the text for every problem of their operation.
NUMBER_FORMATS: dict[str, tuple[str, ...]] = {"+": ("plain", "comma"), "-": ("plain", "comma"), "*": ("plain", "words")}
_ONES = ("", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
SUBJECTS = NAMES + ("the teacher", "a farmer", "the club", "a shopkeeper", "the coach")
OBJECTS = ITEMS + ("books", "bottles", "tickets", "buttons", "beads", "cups", "nails", "seeds")
#: The cold start's wordings, per operation: (frame, form, format).
SFT_COMBINATIONS = ((0, 0, 0), (1, 0, 0))
COMPOSED_SPLITS = ("sft", "train", "heldout")


def format_number(value: int, number_format: str) -> str:
    """``value`` as the question writes it: ``plain`` (4821), ``comma`` (4,821), ``words`` (1 to 99 spelled out,
    ``fifty-two``; larger values stay in digits)."""
    if number_format == "plain":
        return str(value)
    if number_format == "comma":
        return f"{value:,}"
    if number_format == "words":
        if not 0 < value < 100:
            return str(value)
        if value < 20:
            return _ONES[value]
        return _TENS[value // 10] + ("-" + _ONES[value % 10] if value % 10 else "")
    raise ValueError(f"number format must be 'plain', 'comma' or 'words', not {number_format!r}")


def is_heldout_combination(frame: int, form: int, number_format: int) -> bool:
    """Whether the (frame, form, format) combination of an operation is held out: ``(frame + form + format) % 4 ==
    3``, a quarter of them, with every frame, every form and every format in both sides."""
    return (frame + form + number_format) % 4 == 3


def combinations(split: str) -> list[tuple[str, int, int, int]]:
    """(operation, frame, form, format) of the wordings of ``split`` (``sft``, ``train``, ``heldout``), in a fixed
    order. ``train`` includes the ``sft`` ones."""
    if split not in COMPOSED_SPLITS:
        raise ValueError(f"split must be one of {COMPOSED_SPLITS}, got {split!r}")
    out = []
    for op in OPERATIONS:
        for frame in range(len(FRAMES[op])):
            for form in range(len(QUESTION_FORMS[op])):
                for fmt in range(len(NUMBER_FORMATS[op])):
                    held = is_heldout_combination(frame, form, fmt)
                    if (split == "heldout") == held and (split != "sft" or (frame, form, fmt) in SFT_COMBINATIONS):
                        out.append((op, frame, form, fmt))
    return out


def compose_question(op: str, frame: int, form: int, number_format: int, a: int, b: int, subject: str, obj: str) -> str:
    """One question from its parts (the first letter capitalised)."""
    fmt = NUMBER_FORMATS[op][number_format]
    fill = dict(a=format_number(a, fmt), b=format_number(b, fmt), subj=subject, obj=obj)
    text = FRAMES[op][frame].format(**fill) + " " + QUESTION_FORMS[op][form].format(**fill)
    return text[0].upper() + text[1:]


def _composed(n: int, seed: int, split: str, balanced: bool, exclude=frozenset()) -> list[dict]:
    rng = random.Random(seed)
    by_op = {op: [c for c in combinations(split) if c[0] == op] for op in OPERATIONS}
    queues: dict[str, list] = {op: [] for op in OPERATIONS}
    everything = combinations(split)
    seen, rows = set(exclude), []
    while len(rows) < n:
        if balanced:
            op = OPERATIONS[len(rows) % len(OPERATIONS)]
            if not queues[op]:  # a new round: every wording of the operation once, in a seeded order
                queues[op] = rng.sample(by_op[op], len(by_op[op]))
            combo = queues[op][-1]
        else:
            combo = everything[rng.randrange(len(everything))]
        op, frame, form, fmt = combo
        a, b = operands(rng, op)
        if (a, op, b) in seen:
            continue
        if balanced:
            queues[op].pop()
        seen.add((a, op, b))
        question = compose_question(op, frame, form, fmt, a, b, rng.choice(SUBJECTS), rng.choice(OBJECTS))
        rows.append(composed_row(question, a, op, b, frame, form, fmt))
    return rows


def composed_row(question: str, a: int, op: str, b: int, frame: int, form: int, fmt: int, kind: str = "") -> dict:
    """A composed question's row: its answer (also the solution), its problem, and its wording
    (``"[kind|]op|frame|form|number format"``)."""
    answer, number_format = str(compute(a, op, b)), NUMBER_FORMATS[op][fmt]
    return {"question": question, "answer": answer, "solution": answer, "a": a, "op": op, "b": b,
            "wording": f"{kind}{op}|{frame}|{form}|{number_format}", "frame": frame, "form": form,
            "number_format": number_format}


#: How many held-out problems' operands are drawn (from their own seed) to keep out of the other splits.
_HELDOUT_POOL = 1000


def composed_rows(split: str, n: int, seed: int = 0, balanced: bool = True, exclude=frozenset()) -> list[dict]:
    """``n`` composed problems in the wordings of ``split`` (``train``: every training combination, ``sft`` among
    them; ``heldout``: the held-out combinations; ``sft``: the cold start's). Rows: ``question``, ``answer`` (=
    ``solution``), ``a``, ``op``, ``b``, and the wording (``wording`` = ``"op|frame|form|format"``, ``frame``,
    ``form``, ``number_format``). ``balanced``: operations in turn and each operation's wordings in seeded rounds
    (else drawn uniformly at random). The held-out problems' operands (and the first 1000 of them) come from their
    own seed and are excluded from the other splits; so are the ``(a, op, b)`` problems in ``exclude`` (new
    questions in the training wordings: :func:`composed_new_questions`)."""
    if split not in COMPOSED_SPLITS:
        raise ValueError(f"split must be one of {COMPOSED_SPLITS}, got {split!r}")
    heldout_seed = seed + 1_000_003
    if split == "heldout":
        return _composed(n, heldout_seed, "heldout", balanced)
    taken = problems(_composed(_HELDOUT_POOL, heldout_seed, "heldout", balanced))
    return _composed(n, seed + (7 if split == "sft" else 0), split, balanced, exclude=taken | set(exclude))


#: How many cold-start problems are kept out of the held-out questions in the training wordings.
_COLD_START_POOL = 1000


def composed_new_questions(n: int, seed: int, rl_rows: list[dict]) -> list[dict]:
    """``n`` held-out questions in the training wordings: problems of the ``train`` combinations, from their own
    seed, none of them a problem of ``rl_rows`` (the RL stream), of the first 1000 cold-start problems (any cold
    start up to that size: a run and its control from the same cold start, ``sft_traces`` 0, get the same
    questions) or of the held-out pool. With the ``heldout`` split (unseen wordings), the two held-out columns of
    the tool job."""
    seen = problems(rl_rows) | problems(composed_rows("sft", _COLD_START_POOL, seed=seed))
    return composed_rows("train", n, seed=seed + 2_000_003, exclude=seen)


def _traces(rows: list[dict], system_prompt: str | None) -> list[dict]:
    traces = []
    for row in rows:
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages += [
            {"role": "user", "content": row["question"]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "python", "arguments": {"code": tool_code(row)}}}]},
            {"role": "tool", "name": "python", "content": row["answer"]},
            {"role": "assistant", "content": f"\\boxed{{{row['answer']}}}"},
        ]
        traces.append({"messages": messages, "question": row["question"], "answer": row["answer"]})
    return traces


def composed_cold_start_traces(n: int, seed: int = 0, system_prompt: str | None = None) -> list[dict]:
    """:func:`cold_start_traces` for the composed task: ``n`` traces in the ``sft`` combinations (operations in turn),
    operands skipping the held-out problems."""
    return _traces(composed_rows("sft", n, seed), system_prompt)
