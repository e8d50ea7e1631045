"""Audit corpora: JSONL files of labelled cases, read against a strict schema.

A corpus file holds one JSON object per line. The first line may be a header,
``{"corpus": "math_answer", "version": 4, "description": "..."}``; every other line is a case::

    {"id": "hedge-two-boxes", "class": "hedging", "columns": {"solution": "3"},
     "completion": "\\boxed{3} \\boxed{4}", "expected": 0, "note": "two answers, one of them right"}

* ``id``: unique within the file; ``class``: lower-case name (letters, digits, ``_``) the report groups by;
* ``completion``: the model's text, a string or a list of parts, each a string or ``{"repeat": str, "times": n}``
  (so that a cost attack of megabytes is a short line); the joined text is at most :data:`MAX_COMPLETION_CHARS`;
* ``expected``: ``1`` when a correct checker must accept the completion, ``0`` when it must reject it;
* ``columns`` (optional): the dataset row the reward receives as keyword arguments (each value wrapped in a
  one-element list, as TRL does for a batch); ``prompt`` (optional): the prompt text; ``note``: free text;
* ``must_score`` (optional, ``true``/``false``; the header's value, else ``false``, when absent): the reward owes
  this case a number. ``None`` means "not applicable" (TRL leaves the completion out of its group's baseline and
  gives it no advantage), so a wrong answer scored ``None`` where a score is due escapes its penalty: the report
  counts it as ``escaped``, and the audit fails on it.

Any other key, a wrong type, a duplicate id or a line that is not JSON is a :class:`CorpusError` naming the
file and the line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

# the kinds a reward declares (``reward_kind``); a corpus ships for each
from trl_rlvr.rewards.contract import REWARD_KINDS as KINDS

MAX_COMPLETION_CHARS = 16 << 20
MAX_REPEAT = 10_000_000

_CASE_KEYS = {"id", "class", "completion", "expected", "columns", "prompt", "note", "must_score"}
_REQUIRED = ("id", "class", "completion", "expected")
_HEADER_KEYS = {"corpus", "version", "description", "must_score"}
_CLASS = re.compile(r"[a-z][a-z0-9_]*\Z")


class CorpusError(ValueError):
    """A corpus line that does not follow the schema (the message names the file and the line)."""


@dataclass(frozen=True)
class Case:
    """One labelled case: ``expected`` is 1 (a correct checker accepts it) or 0 (it must be rejected)."""

    id: str
    cls: str
    completion: str
    expected: int
    columns: dict[str, Any] = field(default_factory=dict)
    prompt: str | None = None
    note: str = ""
    source: str = ""  # "file:line"
    must_score: bool = False  # None is an escape for a wrong answer, not a rejection


@dataclass(frozen=True)
class Corpus:
    name: str
    version: int | None
    path: str
    cases: tuple[Case, ...]


def _completion(value: Any, where: str) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and value:
        parts = []
        for k, part in enumerate(value):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and set(part) == {"repeat", "times"} and isinstance(part["repeat"], str) \
                    and type(part["times"]) is int and 0 <= part["times"] <= MAX_REPEAT:
                parts.append(part["repeat"] * part["times"])
            else:
                raise CorpusError(f"{where}: completion part {k} must be a string or "
                                  f'{{"repeat": str, "times": 0..{MAX_REPEAT}}}, got {part!r:.80}')
            if sum(map(len, parts)) > MAX_COMPLETION_CHARS:
                break
        text = "".join(parts)
    else:
        raise CorpusError(f"{where}: 'completion' must be a string or a non-empty list of parts")
    if len(text) > MAX_COMPLETION_CHARS:
        raise CorpusError(f"{where}: the completion is longer than {MAX_COMPLETION_CHARS} characters")
    return text


def parse_case(row: Any, where: str, must_score: bool = False) -> Case:
    """One case from one decoded JSON line (``where`` is ``file:line``, for the error message); ``must_score``:
    the file's default (its header's)."""
    if not isinstance(row, dict):
        raise CorpusError(f"{where}: a case must be a JSON object, got {type(row).__name__}")
    unknown = sorted(set(row) - _CASE_KEYS)
    if unknown:
        raise CorpusError(f"{where}: unknown key(s) {unknown}; a case has {sorted(_CASE_KEYS)}")
    missing = [k for k in _REQUIRED if k not in row]
    if missing:
        raise CorpusError(f"{where}: missing key(s) {missing}")
    if not isinstance(row["id"], str) or not row["id"].strip():
        raise CorpusError(f"{where}: 'id' must be a non-empty string")
    if not isinstance(row["class"], str) or not _CLASS.match(row["class"]):
        raise CorpusError(f"{where}: 'class' must be a lower-case name (a-z, 0-9, _), got {row['class']!r}")
    if type(row["expected"]) is not int or row["expected"] not in (0, 1):
        raise CorpusError(f"{where}: 'expected' must be 0 (must be rejected) or 1 (must be accepted), "
                          f"got {row['expected']!r}")
    columns = row.get("columns", {})
    if not isinstance(columns, dict) or not all(isinstance(k, str) and k.isidentifier() for k in columns):
        raise CorpusError(f"{where}: 'columns' must be an object whose keys are column names")
    if "prompt" in columns or "completions" in columns or "prompts" in columns:
        raise CorpusError(f"{where}: 'columns' must not hold the prompt or completions (use the key 'prompt')")
    for key in ("prompt", "note"):
        if row.get(key) is not None and not isinstance(row[key], str):
            raise CorpusError(f"{where}: {key!r} must be a string")
    if not isinstance(row.get("must_score", False), bool):
        raise CorpusError(f"{where}: 'must_score' must be true or false")
    return Case(id=row["id"], cls=row["class"], completion=_completion(row["completion"], where),
                expected=row["expected"], columns=columns, prompt=row.get("prompt"), note=row.get("note") or "",
                source=where, must_score=row.get("must_score", must_score))


def load_corpus(path: str | Path, *, name: str | None = None) -> Corpus:
    """Every case of the JSONL file ``path``, validated (see the module docstring for the schema)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise CorpusError(f"{path}: cannot read the cases: {e}") from e
    header: dict = {}
    cases: list[Case] = []
    seen: dict[str, str] = {}
    for n, line in enumerate(lines, 1):
        where = f"{path}:{n}"
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusError(f"{where}: not valid JSON: {e.msg} (column {e.colno})") from None
        if isinstance(row, dict) and "corpus" in row:
            if cases or header:
                raise CorpusError(f"{where}: a header (key 'corpus') may only be the first line")
            bad = sorted(set(row) - _HEADER_KEYS)
            if bad or not isinstance(row["corpus"], str) or type(row.get("version", 0)) is not int \
                    or not isinstance(row.get("must_score", False), bool):
                raise CorpusError(f"{where}: a header is {{\"corpus\": str, \"version\": int, \"description\": str, "
                                  "\"must_score\": bool}")
            header = row
            continue
        case = parse_case(row, where, header.get("must_score", False))
        if case.id in seen:
            raise CorpusError(f"{where}: duplicate id {case.id!r} (first at {seen[case.id]})")
        seen[case.id] = where
        cases.append(case)
    if not cases:
        raise CorpusError(f"{path}: no cases")
    return Corpus(name=name or header.get("corpus") or path.stem, version=header.get("version"), path=str(path),
                  cases=tuple(cases))


def builtin_corpus(kind: str) -> Corpus:
    """The corpus shipped for ``kind`` (package data ``trl_rlvr/audit/corpus/<kind>.jsonl``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown reward kind {kind!r}: one of {', '.join(KINDS)}")
    with resources.as_file(resources.files("trl_rlvr.audit") / "corpus" / f"{kind}.jsonl") as path:
        return load_corpus(path, name=kind)
