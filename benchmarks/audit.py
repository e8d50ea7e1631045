"""Benchmark of ``trl-rlvr rewards audit``: the whole audit of each reward, its time, cost and peak memory.

    python -m benchmarks.audit [--smoke] [--reward NAME ...] [--json PATH]

Default: every built-in (``boxed_math``, ``code_sandbox``, ``think_format``) and TRL's ``accuracy_reward`` and
``think_format_reward`` (conversational completions, as TRL reads them), each over its kind's whole corpus with the
default options. Per reward: cases, false positives / negatives, escapes (wrong answers scored None where a
score is due), errors, timeouts, wall seconds (startup included: the reward's process imports transformers and
TRL, builds the reward and the run's trainer, and scores its warm-up call),
cases/s, the slowest case, the peak RSS of the audit's process and of the largest child process it has waited for so
far (the reward's process; its own workers are not counted), and the machine's load average before and after.

``--smoke``: only the built-ins. It exits non-zero when a built-in accepts a wrong answer, rejects a right one, or a
case errs or times out. The 60 s goal for one built-in's whole audit is reported against the machine's load, not
enforced (a benchmark measures; a shared machine's load is no failure of the code).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import sys
import time

from trl_rlvr.audit import audit_reward

BUILTINS = ("boxed_math", "code_sandbox", "think_format")
TRL = ("accuracy_reward", "think_format_reward")
LIMIT_SECONDS = 60.0


def _rss_mib(who) -> float:
    return resource.getrusage(who).ru_maxrss / 1024


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def one(name: str, progress: bool) -> dict:
    t = time.monotonic()
    report = audit_reward(name, messages=name in TRL, progress=progress)
    seconds = time.monotonic() - t
    j = report.to_json()
    return {"reward": name, "kind": j["kind"], "cases": j["cases"], "false_positives": j["false_positives"],
            "false_negatives": j["false_negatives"], "escaped": j["escaped"], "errors": j["errors"],
            "timeouts": j["timeouts"], "tokenizer": j["calls"]["tokenizer"],
            "right_rate": j["right_rate"], "seconds": seconds, "startup_seconds": sum(j["cost"]["startup_seconds"]),
            "cases_per_second": j["cost"]["cases_per_second"], "slowest_case": j["cost"]["slowest_case"],
            "fp_classes": {c["name"]: c["false_positives"] for c in j["classes"] if c["false_positives"]},
            "fp_cases": [e["id"] for e in j["case_results"] if e["expected"] == 0 and e["status"] == "scored"
                         and (e["score"] or 0) >= j["threshold"]],
            "classes": j["classes"],
            "peak_rss_mib_audit": _rss_mib(resource.RUSAGE_SELF),
            "peak_rss_mib_largest_child": _rss_mib(resource.RUSAGE_CHILDREN)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="only the built-ins; non-zero exit on a failed check")
    p.add_argument("--reward", action="append", default=None, help="audit only these (repeatable)")
    p.add_argument("--json", default=None, help="write the rows as JSON")
    args = p.parse_args(argv)
    names = args.reward or (list(BUILTINS) if args.smoke else [*BUILTINS, *TRL])
    print("command:", shlex.join([sys.executable, "-m", "benchmarks.audit", *(argv if argv is not None else sys.argv[1:])]))
    print("load average before:", _load(), f"({os.cpu_count()} cores)")
    rows, failed = [], []
    for name in names:
        row = one(name, progress=sys.stderr.isatty())
        rows.append(row)
        slow = row["slowest_case"] or {}
        print(f"{name:<20} {row['kind']:<12} cases {row['cases']:4d}  false+ {row['false_positives']:3d}  "
              f"false- {row['false_negatives']:3d}  escaped {row['escaped']:2d}  errors {row['errors']:2d}  timeouts {row['timeouts']:2d}  "
              f"{row['seconds']:6.1f} s (startup {row['startup_seconds']:.1f} s)  {row['cases_per_second'] or 0:6.1f} "
              f"cases/s  slowest {slow.get('id')} {slow.get('seconds', 0):.2f} s  peak RSS {row['peak_rss_mib_audit']:.0f} "
              f"MiB (largest child {row['peak_rss_mib_largest_child']:.0f} MiB)")
        if row["fp_cases"]:
            print(f"{'':<20} false positives: {', '.join(row['fp_cases'])}")
        if name in BUILTINS:
            if row["seconds"] >= LIMIT_SECONDS:  # the goal, reported; a shared machine's load is not a failure
                print(f"{'':<20} over the {LIMIT_SECONDS:g} s goal: {row['seconds']:.1f} s at load {_load()}")
            if row["false_positives"] or row["escaped"] or row["errors"] or row["timeouts"] or row["false_negatives"]:
                failed.append(f"{name}: {row['false_positives']} wrong answers accepted, {row['escaped']} escaped, "
                              f"{row['errors']} errors, "
                              f"{row['timeouts']} timeouts, {row['false_negatives']} right answers rejected")
    print("load average after:", _load())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    for f in failed:
        print("FAILED:", f)
    return 1 if failed and args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
