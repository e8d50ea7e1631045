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
    taken = {(r["a"], r["op"], r["b"]) for r in _problems(1000, heldout_seed, ("heldout",))}
    return _problems(n, seed, ("sft", "rl", "rl_extra") if extra_rl_wordings else ("sft", "rl"), exclude=taken)


def tool_code(row: dict) -> str:
    """The cell a cold-start trace runs: ``print(a op b)``."""
    return f"print({row['a']} {row['op']} {row['b']})"


def cold_start_traces(n: int, seed: int = 0, system_prompt: str | None = None) -> list[dict]:
    """``n`` conversations (``messages``) in the ``sft`` wordings: the question, one ``python`` tool call
    ``print(a op b)``, the tool's reply (the exact result, as the sandbox prints it) and ``\\boxed{result}``.
    Operands come from ``seed + 7`` and skip the held-out problems."""
    taken = {(r["a"], r["op"], r["b"]) for r in _problems(1000, seed + 1_000_003, ("heldout",))}
    rows = _problems(n, seed + 7, ("sft",), exclude=taken)
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
