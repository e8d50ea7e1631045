"""Verifiable question/answer datasets in the R1-Zero prompt format.

* ``arithmetic_dataset(seed, n_train, n_eval)``: small arithmetic word problems generated
  deterministically from a seed, with a disjoint held-out split. Ships with the package, needs no network.
* ``load_qa_dataset(name, ...)``: any Hugging Face dataset with a question column and an answer column
  (GSM8K-style ``... #### 42`` answers are reduced to the final number).

Both return ``datasets.Dataset`` rows (:data:`COLUMNS`) with ``prompt`` (what the policy sees), ``question`` and
``answer`` (the reference the reward checks; ``solution`` carries the same string for TRL's own
reward functions).

Prompt styles (``prompt_style``):

* ``"chat_prefill"`` (default): the tokenizer's chat template with one user turn -- the instruction
  plus a one-shot example -- and the assistant turn pre-filled with ``<think>``, as DeepSeek-R1 does.
  This is what made SmolLM2-135M-Instruct use the format at all on the first steps (with a bare
  instruction it never did: no reward, no signal). The prompt is a rendered string, so the
  completion starts *inside* the think block (rewards see ``... </think> \\boxed{..}``).
* ``"r1zero"``: DeepSeek-R1-Zero's plain-text template ("A conversation between User and
  Assistant ... Assistant: <think>"), for base models without a chat template (Qwen2.5-Math).
* ``"chat"``: a conversational prompt (list of messages) without prefill; TRL renders it.
"""

from __future__ import annotations

import random
import re

THINK_PREFILL = "<think>"
#: The columns of every dataset built here.
COLUMNS = ("prompt", "question", "answer", "solution")

INSTRUCTION = (
    "Solve the problem. Reason step by step inside <think> </think> tags, then write only the final "
    "answer as a number inside \\boxed{{}}.\n"
    "Example:\nQuestion: What is 2 + 3?\nAnswer: <think>2 + 3 = 5</think> \\boxed{{5}}\n\n"
    "Question: {question}"
)

R1ZERO_TEMPLATE = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with "
    "the answer. The reasoning process is enclosed within <think> </think> and the final answer is "
    "written inside \\boxed{{}}, i.e., <think> reasoning process here </think> \\boxed{{answer}}.\n"
    "User: {question}\nAssistant: <think>"
)

PROMPT_STYLES = ("chat_prefill", "r1zero", "chat")

_NAMES = ["Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ivy", "Jon", "Kim", "Leo", "Mia", "Ned"]
_ITEMS = ["apples", "books", "coins", "pens", "cards", "eggs", "shells", "stamps", "cups", "balls"]


def _problem(rng: random.Random, max_operand: int):
    """One (question, integer answer, key) triple. key identifies the underlying problem."""
    a = rng.randint(1, max_operand)
    b = rng.randint(1, max_operand)
    op = rng.choice("+-")
    if op == "-" and b > a:
        a, b = b, a
    answer = a + b if op == "+" else a - b
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(4)
    if kind == 0:
        question = f"What is {a} {op} {b}?"
    elif op == "+":
        question = [
            f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
            f"A box holds {a} {item}. Someone adds {b} {item}. How many {item} are in the box?",
            f"{name} found {a} {item} on Monday and {b} {item} on Tuesday. How many {item} in total?",
        ][kind - 1]
    else:
        question = [
            f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?",
            f"A box holds {a} {item}. Someone takes out {b} {item}. How many {item} are in the box?",
            f"{name} had {a} {item} and lost {b} of them. How many {item} are left?",
        ][kind - 1]
    return question, answer, (a, op, b)


def generate_arithmetic(n: int, seed: int = 0, max_operand: int = 20, exclude=()) -> list[dict]:
    """``n`` distinct problems (by operands and operator) from ``seed``; keys in ``exclude`` are skipped."""
    rng = random.Random(seed)
    seen = set(exclude) | {(2, "+", 3)}  # never ask the one-shot example itself
    rows = []
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise ValueError(f"cannot draw {n} distinct problems with max_operand={max_operand}")
        question, answer, key = _problem(rng, max_operand)
        if key in seen:
            continue
        seen.add(key)
        rows.append({"question": question, "answer": str(answer), "key": key})
    return rows


def format_prompt(question: str, tokenizer=None, prompt_style: str = "chat_prefill", system_prompt: str | None = None):
    """The policy's prompt for ``question`` in ``prompt_style`` (see the module docstring).

    ``system_prompt``: a system turn before the user's in the chat styles; in the plain-text ``r1zero`` style, a
    paragraph before the template."""
    if prompt_style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {prompt_style!r}")
    plain = (f"{system_prompt}\n\n" if system_prompt else "") + R1ZERO_TEMPLATE.format(question=question)
    if prompt_style == "r1zero":
        return plain
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": INSTRUCTION.format(question=question)})
    if prompt_style == "chat":
        return messages
    if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
        # No chat template to render: fall back to the plain-text R1-Zero template.
        return plain
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return rendered + THINK_PREFILL


#: Prompt styles whose prompt ends with ``<think>``: the completion starts inside the reasoning.
PREFILLED_STYLES = ("chat_prefill", "r1zero")


def with_prefilled_options(options: dict, reward_names, prompt_style: str) -> dict:
    """``options`` (``{reward: {option: value}}``, updated in place and returned) with ``prefilled=True`` for each
    registered reward in ``reward_names`` that has a ``prefilled`` option (it reads the reasoning/answer split:
    ``think_format``, ``boxed_math``), when ``prompt_style`` pre-fills ``<think>``; an option set explicitly is kept.
    An answer then exists only after ``</think>``."""
    if prompt_style not in PREFILLED_STYLES:
        return options
    from trl_rlvr.rewards.registry import describe_reward, reward_specs

    registered = reward_specs()
    for name in reward_names:
        if name in registered and "prefilled" in describe_reward(name)["options"]:
            options.setdefault(name, {}).setdefault("prefilled", True)
    return options


def heldout_arithmetic(n: int, seed: int = 0, max_operand: int = 20) -> list[dict]:
    """The held-out problems of :func:`arithmetic_dataset` with this ``seed`` (drawn first, from their own seed)."""
    return generate_arithmetic(n, seed=seed + 1_000_003, max_operand=max_operand)


def _to_dataset(rows: list[dict], tokenizer, prompt_style: str, system_prompt: str | None = None):
    from datasets import Dataset

    return Dataset.from_list([
        {"prompt": format_prompt(r["question"], tokenizer, prompt_style, system_prompt), "question": r["question"],
         "answer": r["answer"], "solution": r["answer"]}
        for r in rows
    ])


def arithmetic_dataset(tokenizer=None, n_train: int = 256, n_eval: int = 100, seed: int = 0,
                       max_operand: int = 20, prompt_style: str = "chat_prefill", system_prompt: str | None = None):
    """``{"train": Dataset, "test": Dataset}`` of arithmetic word problems; the splits share no problem.

    The held-out split is drawn first from ``seed``, so it stays the same when ``n_train`` changes.
    """
    from datasets import DatasetDict

    test = heldout_arithmetic(n_eval, seed, max_operand)
    train = generate_arithmetic(n_train, seed=seed, max_operand=max_operand, exclude={r["key"] for r in test})
    return DatasetDict(train=_to_dataset(train, tokenizer, prompt_style, system_prompt),
                       test=_to_dataset(test, tokenizer, prompt_style, system_prompt))


_FINAL_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.S)


def extract_reference(answer) -> str:
    """Reference answer as a string; GSM8K's ``reasoning #### 42`` becomes ``42``."""
    text = str(answer)
    m = _FINAL_ANSWER.search(text)
    if m:
        return m.group(1).replace(",", "").strip()
    return text.strip()


#: File suffix -> the ``datasets`` builder that reads it (a local file given as ``dataset_name``).
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


def load_raw_qa(name: str, *, config: str | None = None, train_split: str = "train",
                question_column: str = "question", answer_column: str = "answer"):
    """The dataset ``name`` as it is (a ``DatasetDict``): a hub id, a local folder, or a local file (.json, .jsonl,
    .csv, .parquet; its rows are the ``train`` split). Raises ``ValueError`` naming the split or column that is
    missing, before anything else is loaded."""
    import os

    from datasets import DatasetDict, load_dataset

    builder = _FILE_BUILDERS.get(os.path.splitext(name)[1].lower()) if os.path.isfile(name) else None
    raw = load_dataset(builder, data_files={"train": name}) if builder else load_dataset(name, config)
    if not isinstance(raw, DatasetDict):
        raw = DatasetDict(train=raw)
    if train_split not in raw:
        raise ValueError(f"dataset {name!r} has no split {train_split!r} (dataset_train_split); splits: {list(raw)}")
    columns = raw[train_split].column_names
    for field_name, col in (("question_column", question_column), ("answer_column", answer_column)):
        if col not in columns:
            raise ValueError(f"column {col!r} ({field_name}) is not in dataset {name!r}; its columns: {columns}")
    return raw


def load_qa_dataset(name: str, tokenizer=None, *, config: str | None = None, train_split: str = "train",
                    test_split: str | None = "test", question_column: str = "question",
                    answer_column: str = "answer", prompt_style: str = "chat_prefill",
                    n_train: int | None = None, n_eval: int | None = None, seed: int = 0,
                    system_prompt: str | None = None, raw=None):
    """Load a hub (or local) dataset with a question and an answer column into the R1-Zero format.

    Without a ``test_split`` (or if the dataset has none) the held-out split is carved out of train. ``raw``: the
    result of :func:`load_raw_qa` when already loaded.
    """
    from datasets import DatasetDict

    if raw is None:
        raw = load_raw_qa(name, config=config, train_split=train_split, question_column=question_column,
                          answer_column=answer_column)
    train = raw[train_split]
    if test_split and test_split in raw:
        test = raw[test_split]
    else:
        parts = train.train_test_split(test_size=n_eval or 0.1, seed=seed)
        train, test = parts["train"], parts["test"]

    def convert(row):
        q = str(row[question_column])
        ref = extract_reference(row[answer_column])
        prompt = format_prompt(q, tokenizer, prompt_style, system_prompt)
        return {"prompt": prompt, "question": q, "answer": ref, "solution": ref}

    out = {}
    for split, ds, n in (("train", train, n_train), ("test", test, n_eval)):
        if n is not None:
            ds = ds.shuffle(seed=seed).select(range(min(n, len(ds))))
        out[split] = ds.map(convert, remove_columns=ds.column_names)
    return DatasetDict(out)
