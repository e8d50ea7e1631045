"""Benchmark of the ``boxed_math`` reward: agreement with external labels, and throughput vs TRL.

    python benchmarks/rewards.py [--data DIR] [--skip-trl] [--repeats N]

* agreement on ``math_dev.jsonl`` (model answers to MATH problems, labels from their source project) and on
  ``mathverify_cases.jsonl`` (cases from math-verify's own tests; a ``pred`` without a box is boxed, and
  cases that need non-default math-verify options are reported apart);
* throughput on a GRPO-shaped batch (64 groups x 8 answers drawn from math_dev) of ``boxed_math`` against
  ``trl.rewards.accuracy_reward``, both called from the main thread.

``DIR`` defaults to ``../shared/data`` next to the repository (this is benchmark material, not test data).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reward_plugins.boxed_math import boxed_math  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _load(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _agreement(name: str, preds: list, labels: list[bool]) -> dict:
    n = len(labels)
    agree = sum((p == 1.0) == bool(lab) for p, lab in zip(preds, labels))
    fp = sum(p == 1.0 and not lab for p, lab in zip(preds, labels))
    fn = sum(p != 1.0 and lab for p, lab in zip(preds, labels))
    none = sum(p is None for p in preds)
    print(f"  {name:<58} n={n:4d}  agreement {100 * agree / max(n, 1):6.2f}%  false positives {fp}  false negatives {fn}"
          + (f"  None {none}" if none else ""))
    return {"n": n, "agreement": agree / max(n, 1), "false_positives": fp, "false_negatives": fn}


def agreement(data: Path, with_trl: bool) -> None:
    print("== agreement ==")
    rows = _load(data / "math_dev.jsonl")
    reward = boxed_math()
    boxed = [r for r in rows if r["has_boxed"]]
    preds = reward(None, [r["completion_text"] for r in boxed], answer=[r["gold_answer"] for r in boxed])
    _agreement("math_dev, answers with a box (boxed_math defaults)", preds, [r["expected_label"] for r in boxed])
    for r, p in zip(boxed, preds):
        if (p == 1.0) != r["expected_label"]:
            print(f"    disagree: id={r['id']} label={r['expected_label']} gold={r['gold_answer']!r} "
                  f"tail={r['completion_text'][-120:]!r}")
    line = boxed_math(answer_line=True)
    preds_all = line(None, [r["completion_text"] for r in rows], answer=[r["gold_answer"] for r in rows])
    _agreement("math_dev, all answers (answer_line=True)", preds_all, [r["expected_label"] for r in rows])
    if with_trl:
        from trl.rewards import accuracy_reward

        trl_preds = accuracy_reward([[{"role": "assistant", "content": r["completion_text"]}] for r in boxed],
                                    [r["gold_answer"] for r in boxed])
        _agreement("math_dev, answers with a box: trl.rewards.accuracy_reward", trl_preds,
                   [r["expected_label"] for r in boxed])

    cases = _load(data / "mathverify_cases.jsonl")
    plain = [c for c in cases if not c["extra_params"]]
    special = [c for c in cases if c["extra_params"]]
    boxed_cases = [c for c in plain if c["pred_has_boxed"]]
    bare = [c for c in plain if not c["pred_has_boxed"]]
    print("  (a pred without a box is put in one: boxed_math reads boxes, not free text; such cases that are")
    print("   sentences, e.g. 'Answer $9$', test math-verify's free-text extraction, which boxed_math does not do)")
    for label, subset in (("mathverify_cases, pred has a box", boxed_cases),
                          ("mathverify_cases, bare pred put in a box", bare),
                          ("mathverify_cases, need other options (precision, ...)", special)):
        completions = [c["pred"] if c["pred_has_boxed"] else "\\boxed{" + c["pred"] + "}" for c in subset]
        preds = reward(None, completions, answer=[c["gold"] for c in subset])
        _agreement(label, preds, [c["expected_equal"] for c in subset])
        if subset is not special:
            for c, p in zip(subset, preds):
                if (p == 1.0) != c["expected_equal"]:
                    print(f"    disagree: id={c['id']} expected={c['expected_equal']} gold={c['gold']!r} pred={c['pred']!r}")


def grpo_batch(data: Path, groups: int = 64, size: int = 8) -> tuple[list[str], list[str]]:
    rows = _load(data / "math_dev.jsonl")
    by_problem: dict[str, list[dict]] = {}
    for r in rows:
        by_problem.setdefault(r["problem"], []).append(r)
    problems = list(by_problem.values())
    completions, golds = [], []
    for g in range(groups):
        answers = problems[g % len(problems)]
        start = (g // len(problems)) * size
        for k in range(size):
            r = answers[(start + k) % len(answers)]
            completions.append(r["completion_text"])
            golds.append(r["gold_answer"])
    return completions, golds


def throughput(data: Path, repeats: int, with_trl: bool) -> None:
    from reward_plugins._pool import get_pool
    from reward_plugins.boxed_math import _PRELOAD

    print("== throughput: 64 groups x 8 answers from math_dev (the 17 problems repeat: golds repeat) ==")
    completions, golds = grpo_batch(data)
    reward = boxed_math()
    t = time.perf_counter()
    reward(None, completions[:16], answer=golds[:16])  # start-up: workers import and warm up math-verify
    print(f"  boxed_math first call (starts {get_pool('reward_plugins._math_check:check', None, _PRELOAD).num_workers} "
          f"workers, 16 answers): {time.perf_counter() - t:.2f} s")
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        reward(None, completions, answer=golds)
        best = min(best, time.perf_counter() - t)
    print(f"  boxed_math:                         {best:.3f} s / batch  ({len(completions) / best:7.1f} answers/s)")
    # the same checks with the in-batch de-duplication defeated: every answer goes to a worker
    tasks = []
    for c, g in zip(completions, golds):
        cands = reward.candidates(c)
        if not isinstance(cands, str):
            tasks.append((g, (g, cands)))
    pool = get_pool("reward_plugins._math_check:check", None, _PRELOAD)
    best_raw = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        pool.map(tasks, 5.0)
        best_raw = min(best_raw, time.perf_counter() - t)
    print(f"  boxed_math without in-batch dedupe: {best_raw:.3f} s / batch  ({len(tasks)} checks)")
    if with_trl:
        from trl.rewards import accuracy_reward

        conv = [[{"role": "assistant", "content": c}] for c in completions]
        best_trl = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            accuracy_reward(conv, golds)
            best_trl = min(best_trl, time.perf_counter() - t)
        print(f"  trl.rewards.accuracy_reward:        {best_trl:.3f} s / batch  ({len(completions) / best_trl:7.1f} answers/s)")
        print(f"  speed-up: {best_trl / best:.1f}x (without dedupe: {best_trl / best_raw:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with math_dev.jsonl, mathverify_cases.jsonl")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-trl", action="store_true", help="do not import TRL (its import takes ~15 s)")
    args = parser.parse_args()
    print("$ python " + " ".join(shlex.quote(a) for a in sys.argv))
    print(f"cores usable: {len(os.sched_getaffinity(0))}, load average: {os.getloadavg()[0]:.2f} (other jobs share the cores)")
    agreement(args.data, not args.skip_trl)
    throughput(args.data, args.repeats, not args.skip_trl)


if __name__ == "__main__":
    main()
