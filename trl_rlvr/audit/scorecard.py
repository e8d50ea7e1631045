"""The audit's verdict from the outcomes: per-class counts, the rule for passing, a rich table and JSON.

Definitions (``threshold`` is the score at or above which a case counts as accepted, 1.0 by default):

* false positive: a case labelled 0 (a correct checker rejects it) scored ``>= threshold``;
* false negative: a case labelled 1 (a correct checker accepts it) scored below it or ``None``;
* escaped: a case labelled 0 that must be scored (``must_score``: a row the reward can judge) scored ``None``; TRL
  leaves such a completion out of its group's baseline with no advantage, so a wrong answer escapes its penalty
  (a program that fakes an infrastructure failure, for a reward that scores those ``None``);
* error: the reward raised, returned something that is not one score, or its process died (a crash);
* timeout: no score within the per-case deadline (the reward's process is then killed);
* right-answer rate: the share of the cases labelled 1 that were accepted (errors and timeouts count as not).

The audit passes when there is no false positive, no escape, no error, no timeout, and the right-answer rate is at least
``min_right_rate`` (0.9 by default), so a reward that scores everything 0 fails it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trl_rlvr.audit.runner import Outcome

MIN_RIGHT_RATE = 0.9
WORST_PER_CLASS = 3


def _visible(text: str) -> str:
    return "".join(c if c.isascii() and c.isprintable() else ascii(c)[1:-1] for c in text)


def _snippet(text: str, limit: int = 160) -> str:
    """The completion as a reader can see it: escapes for invisible and non-ASCII characters, cut at ``limit``."""
    if len(text) <= limit:
        return _visible(text)
    return f"{_visible(text[: limit - 40])} ... [{len(text)} chars] ... {_visible(text[-30:])}"


@dataclass
class ClassRow:
    name: str
    cases: int = 0
    right: int = 0
    false_positives: int = 0
    false_negatives: int = 0
    escaped: int = 0
    errors: int = 0
    timeouts: int = 0
    slowest_seconds: float = 0.0


@dataclass
class AuditReport:
    """Everything ``trl-rlvr rewards audit`` prints and writes; :meth:`to_json` has the documented keys."""

    reward: str
    kind: str | None
    corpora: list[dict]
    outcomes: list[Outcome]
    threshold: float
    min_right_rate: float
    deadline: float
    options: dict = field(default_factory=dict)
    startup_seconds: list[float] = field(default_factory=list)
    calls: dict = field(default_factory=dict)  # how the cases were sent: seed, variants, group size, tokenizer

    def accepted(self, o: Outcome) -> bool:
        return o.status == "scored" and o.score is not None and o.score >= self.threshold

    @property
    def false_positives(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.case.expected == 0 and self.accepted(o)]

    @property
    def false_negatives(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.case.expected == 1 and o.status == "scored" and not self.accepted(o)]

    @property
    def escaped(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.case.expected == 0 and o.case.must_score and o.status == "scored"
                and o.score is None]

    @property
    def errors(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status in ("error", "crash")]

    @property
    def timeouts(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "timeout"]

    @property
    def right_answers(self) -> int:
        return sum(o.case.expected == 1 for o in self.outcomes)

    @property
    def right_rate(self) -> float:
        right = [o for o in self.outcomes if o.case.expected == 1]
        return sum(self.accepted(o) for o in right) / len(right) if right else 0.0

    @property
    def seconds(self) -> float:
        return sum(o.seconds for o in self.outcomes)

    def classes(self) -> list[ClassRow]:
        rows: dict[str, ClassRow] = {}
        for o in self.outcomes:
            row = rows.setdefault(o.case.cls, ClassRow(o.case.cls))
            row.cases += 1
            row.right += o.case.expected
            row.false_positives += o.case.expected == 0 and self.accepted(o)
            row.false_negatives += o.case.expected == 1 and o.status == "scored" and not self.accepted(o)
            row.escaped += o.case.expected == 0 and o.case.must_score and o.status == "scored" and o.score is None
            row.errors += o.status in ("error", "crash")
            row.timeouts += o.status == "timeout"
            row.slowest_seconds = max(row.slowest_seconds, o.seconds)
        return list(rows.values())

    def reasons(self) -> list[str]:
        """Why the audit fails (empty when it passes)."""
        out = []
        if self.false_positives:
            out.append(f"{len(self.false_positives)} wrong answer(s) accepted")
        if self.escaped:
            out.append(f"{len(self.escaped)} wrong answer(s) scored None where a score is due (no penalty in GRPO)")
        if self.errors:
            out.append(f"{len(self.errors)} case(s) made the reward raise or die")
        if self.timeouts:
            out.append(f"{len(self.timeouts)} case(s) ran past the {self.deadline:g} s deadline")
        if not self.right_answers:
            out.append("no case labelled as a right answer: nothing shows the reward accepts anything")
        elif self.right_rate < self.min_right_rate:
            out.append(f"only {self.right_rate:.0%} of the right answers accepted (at least "
                       f"{self.min_right_rate:.0%} needed)")
        return out

    @property
    def passed(self) -> bool:
        return not self.reasons()

    def worst_examples(self, per_class: int = WORST_PER_CLASS) -> list[dict]:
        """Per class, the highest-scored false positives (ties: corpus order)."""
        out, taken = [], {}
        for o in sorted(self.false_positives, key=lambda o: -(o.score or 0.0)):
            if taken.get(o.case.cls, 0) < per_class:
                taken[o.case.cls] = taken.get(o.case.cls, 0) + 1
                out.append(self._example(o))
        return out

    @staticmethod
    def _example(o: Outcome) -> dict:
        return {"id": o.case.id, "class": o.case.cls, "score": o.score, "status": o.status, "detail": o.detail,
                "expected": o.case.expected, "seconds": round(o.seconds, 4), "note": o.case.note, "source": o.case.source,
                "completion": _snippet(o.case.completion)}

    def to_json(self) -> dict[str, Any]:
        slowest = max(self.outcomes, key=lambda o: o.seconds, default=None)
        return {
            "reward": self.reward,
            "kind": self.kind,
            "passed": self.passed,
            "reasons": self.reasons(),
            "cases": len(self.outcomes),
            "false_positives": len(self.false_positives),
            "false_negatives": len(self.false_negatives),
            "escaped": len(self.escaped),
            "errors": len(self.errors),
            "timeouts": len(self.timeouts),
            "right_answers": self.right_answers,
            "right_rate": self.right_rate,
            "min_right_rate": self.min_right_rate,
            "threshold": self.threshold,
            "deadline_seconds": self.deadline,
            "options": self.options,
            "corpora": self.corpora,
            "calls": self.calls,
            "variant_cases": sum("~v" in o.case.id for o in self.outcomes),
            "classes": [vars(r) for r in self.classes()],
            "worst_examples": self.worst_examples(),
            "false_negative_cases": [self._example(o) for o in self.false_negatives],
            "escaped_cases": [self._example(o) for o in self.escaped],
            "error_cases": [self._example(o) for o in self.errors + self.timeouts],
            "case_results": [{"id": o.case.id, "class": o.case.cls, "expected": o.case.expected, "status": o.status,
                              "score": o.score, "seconds": round(o.seconds, 4)} for o in self.outcomes],
            "cost": {
                "seconds": self.seconds,
                "cases_per_second": len(self.outcomes) / self.seconds if self.seconds else None,
                "slowest_case": {"id": slowest.case.id, "seconds": slowest.seconds} if slowest else None,
                "startup_seconds": self.startup_seconds,
            },
        }

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=2)
            f.write("\n")

    def render(self, console=None) -> None:
        """The report as rich tables: one row per class, then the worst false positives and the other failures."""
        from rich.console import Console
        from rich.table import Table

        if console is None:
            console = Console()
            if not console.is_terminal:
                console = Console(width=120)  # a file or pipe: wide enough for the table, never wrapped
        corpora = ", ".join(f"{c['name']} v{c['version']}" if c.get("version") else c["name"] for c in self.corpora)
        how = (f"; seed {self.calls['seed']}, {self.calls['variants']} variants per case, groups of "
               f"{self.calls['group_size']}" if self.calls else "")
        table = Table(title=f"Audit of {self.reward} (kind: {self.kind or '-'}; corpus: {corpora}{how})")
        for col in ("class", "cases", "right answers", "false +", "false -", "escaped", "errors", "timeouts",
                    "slowest s"):
            table.add_column(col, justify="left" if col == "class" else "right", no_wrap=True)
        for r in self.classes():
            def red(n):
                return f"[bold red]{n}[/]" if n else "0"

            table.add_row(r.name, str(r.cases), str(r.right), red(r.false_positives), str(r.false_negatives),
                          red(r.escaped), red(r.errors), red(r.timeouts), f"{r.slowest_seconds:.2f}")
        console.print(table)
        worst = self.worst_examples()
        if worst:
            console.print("[bold]Wrong answers accepted (worst first):[/]")
            for e in worst:
                console.print(f"  {e['class']}/{e['id']} score={e['score']:g}: {e['completion']}", markup=False,
                              highlight=False)
        failures = self.errors + self.timeouts
        if failures:
            console.print("[bold]Errors and timeouts:[/]")
            for o in failures[:20]:
                console.print(f"  {o.case.cls}/{o.case.id} {o.status}: {o.detail}", markup=False, highlight=False)
            if len(failures) > 20:
                console.print(f"  ... and {len(failures) - 20} more (--json has them all)")
        if self.escaped:
            ids = ", ".join(f"{o.case.cls}/{o.case.id}" for o in self.escaped[:12])
            console.print(f"[bold]Wrong answers scored None where a score is due:[/] {ids}", highlight=False)
        if self.false_negatives:
            ids = ", ".join(f"{o.case.cls}/{o.case.id}" for o in self.false_negatives[:12])
            more = f" and {len(self.false_negatives) - 12} more" if len(self.false_negatives) > 12 else ""
            console.print(f"[bold]Right answers rejected:[/] {ids}{more}", highlight=False)
        j = self.to_json()["cost"]
        slow = j["slowest_case"]
        console.print(f"cost: {len(self.outcomes)} cases in {j['seconds']:.1f} s "
                      f"({j['cases_per_second'] or 0:.1f} cases/s), slowest {slow['id'] if slow else '-'} "
                      f"{slow['seconds'] if slow else 0:.2f} s; startup {sum(self.startup_seconds):.1f} s",
                      highlight=False)
        console.print(f"right answers accepted: {self.right_rate:.0%} of {self.right_answers} "
                      f"(at least {self.min_right_rate:.0%} needed)", highlight=False)
        if self.passed:
            console.print("[bold green]PASS[/]: no wrong answer accepted or escaped, no error, no timeout")
        else:
            console.print(f"[bold red]FAIL[/]: {'; '.join(self.reasons())}", highlight=False)
