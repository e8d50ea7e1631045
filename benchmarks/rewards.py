"""Benchmark of the ``boxed_math`` reward: agreement with external labels, and throughput vs TRL.

    python -m benchmarks.rewards [--data DIR] [--skip-trl] [--repeats N] [--smoke]

* agreement on ``math_dev.jsonl`` (model answers to MATH problems, labels from their source project) and on
  ``mathverify_cases.jsonl`` (cases from math-verify's own tests; a ``pred`` without a box is boxed, and
  cases that need non-default math-verify options are reported apart);
* throughput on a GRPO-shaped batch (64 groups x 8 answers drawn from math_dev) of ``boxed_math`` against
  ``trl.rewards.accuracy_reward``, both called from the main thread.

``DIR`` defaults to ``../shared/data`` next to the repository (this is benchmark material, not test data).

``--smoke`` (seconds): TRL left out, one repeat, a batch of 16 groups, on 12 built-in unambiguous cases written in
both files' formats (:func:`write_smoke_data`), which ``boxed_math`` must all score as labelled; a disagreement there
or a crash exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from benchmarks._status import finish  # noqa: E402
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


def agreement(data: Path, with_trl: bool) -> list[str]:
    """Print the agreement tables; returns the ids of the cases where boxed_math disagrees with the label."""
    print("== agreement ==")
    disagreements = []
    rows = _load(data / "math_dev.jsonl")
    reward = boxed_math()
    boxed = [r for r in rows if r["has_boxed"]]
    # the problem is the prompt, as in training: the judging reads the value forms and the precision it states
    preds = reward([r["problem"] for r in boxed], [r["completion_text"] for r in boxed],
                   answer=[r["gold_answer"] for r in boxed])
    _agreement("math_dev, answers with a box (boxed_math defaults)", preds, [r["expected_label"] for r in boxed])
    for r, p in zip(boxed, preds):
        if (p == 1.0) != r["expected_label"]:
            disagreements.append(f"math_dev id={r['id']}")
            print(f"    disagree: id={r['id']} label={r['expected_label']} gold={r['gold_answer']!r} "
                  f"tail={r['completion_text'][-120:]!r}")
    line = boxed_math(answer_line=True)
    preds_all = line([r["problem"] for r in rows], [r["completion_text"] for r in rows],
                     answer=[r["gold_answer"] for r in rows])
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
                    disagreements.append(f"mathverify_cases id={c['id']}")
                    print(f"    disagree: id={c['id']} expected={c['expected_equal']} gold={c['gold']!r} pred={c['pred']!r}")
    return disagreements


def grpo_batch(data: Path, groups: int = 64, size: int = 8, part: slice = slice(None)) -> tuple[list[str], list[str]]:
    """``groups`` x ``size`` answers from math_dev, cycling over the problems of ``part`` (17 problems in all)."""
    rows = _load(data / "math_dev.jsonl")
    by_problem: dict[str, list[dict]] = {}
    for r in rows:
        by_problem.setdefault(r["problem"], []).append(r)
    problems = list(by_problem.values())[part]
    completions, golds = [], []
    for g in range(groups):
        answers = problems[g % len(problems)]
        start = (g // len(problems)) * size
        for k in range(size):
            r = answers[(start + k) % len(answers)]
            completions.append(r["completion_text"])
            golds.append(r["gold_answer"])
    return completions, golds


def _time_one(data: Path, impl: str, repeats: int, groups: int = 64) -> None:
    """Runs in a fresh process. Warm-up: one batch on problems 0-7 (imports, worker start, sympy's lazy
    modules); then one pass over a batch on the other problems 8-16 ("steady": as in training, where a batch
    is new but the process is not) and the best of ``repeats`` passes over that same batch ("repeat")."""
    completions, golds = grpo_batch(data, groups, part=slice(8, None))
    warm_c, warm_g = grpo_batch(data, groups, part=slice(0, 8))
    if impl == "boxed_math":
        reward = boxed_math()
        t = time.perf_counter()
        reward(None, warm_c, answer=warm_g)
        startup = time.perf_counter() - t

        def run():
            reward(None, completions, answer=golds)
    elif impl == "boxed_math_nodedupe":
        from reward_plugins.boxed_math.math_check import check, warm
        from reward_plugins.boxed_math.pool import get_pool

        reward = boxed_math()
        t = time.perf_counter()
        reward(None, warm_c, answer=warm_g)
        startup = time.perf_counter() - t
        tasks = [(g, (g, c)) for g, c in ((g, reward.candidates(c)) for c, g in zip(completions, golds))
                 if not isinstance(c, str)]
        pool = get_pool(check, None, warmup=warm)

        def run():
            pool.map(tasks, 5.0)
    else:
        from trl.rewards import accuracy_reward

        conv = [[{"role": "assistant", "content": c}] for c in completions]
        t = time.perf_counter()
        accuracy_reward([[{"role": "assistant", "content": c}] for c in warm_c], warm_g)
        startup = time.perf_counter() - t

        def run():
            accuracy_reward(conv, golds)
    t = time.perf_counter()
    run()
    cold = time.perf_counter() - t
    warm_best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        warm_best = min(warm_best, time.perf_counter() - t)
    peak = 0
    if impl.startswith("boxed_math"):  # the workers' peak address space, against their memory bound
        pool = reward._pool()
        for pid in [w.pid for w in pool._workers]:
            try:
                with open(f"/proc/{pid}/status") as f:
                    peak = max([peak] + [int(x.split()[1]) // 1024 for x in f if x.startswith("VmPeak:")])
            except OSError:
                pass
    print(json.dumps({"impl": impl, "startup": startup, "steady": cold, "repeat": warm_best, "worker_vmpeak_mib": peak}))


def throughput(data: Path, repeats: int, with_trl: bool, groups: int = 64) -> None:
    import subprocess

    print(f"== throughput: {groups} groups x 8 answers from math_dev, called from the main thread ==")
    print("  each in a fresh process, warmed up on a batch of problems 0-7; steady = one pass over a batch of")
    print("  problems 8-16 (new to the process, as in training); repeat = best of repeated passes over it")
    impls = ["boxed_math", "boxed_math_nodedupe"] + (["trl"] if with_trl else [])
    res = {}
    for impl in impls:
        out = subprocess.run(
            [sys.executable, "-m", __spec__.name, "--data", str(data), "--repeats", str(repeats), "--_time", impl,
             "--_groups", str(groups)],
            capture_output=True, text=True, check=True,
        )
        res[impl] = json.loads(out.stdout.strip().splitlines()[-1])
        r = res[impl]
        label = {"boxed_math": "boxed_math", "boxed_math_nodedupe": "boxed_math, every answer checked",
                 "trl": "trl.rewards.accuracy_reward"}[impl]
        peak = f"; worker peak address space {r['worker_vmpeak_mib']} MiB" if r.get("worker_vmpeak_mib") else ""
        print(f"  {label:<34} steady {r['steady']:.3f} s  repeat {r['repeat']:.3f} s  ({groups * 8} answers; warm-up "
              f"{r['startup']:.2f} s{peak})")
    if with_trl:
        for impl in ("boxed_math", "boxed_math_nodedupe"):
            print(f"  speed-up of {impl:<20} steady {res['trl']['steady'] / res[impl]['steady']:.1f}x  "
                  f"repeat {res['trl']['repeat'] / res[impl]['repeat']:.1f}x")


#: (completion's box, gold, label): unambiguous for any correct checker; 10 problems, so both halves of a batch exist.
SMOKE_CASES = [("42", "42", True), ("41", "42", False), ("\\frac{1}{2}", "0.5", True), ("3", "\\sqrt{9}", True),
               ("x+1", "1+x", True), ("2x", "x+1", False), ("[-2,2]", "[-2,2]", True), ("(0,1)", "[0,1]", False),
               ("7", "-7", False), ("10", "10.0", True), ("\\pi", "\\pi", True), ("5", "6", False)]


def write_smoke_data(folder: Path) -> Path:
    """:data:`SMOKE_CASES` as ``math_dev.jsonl`` and ``mathverify_cases.jsonl`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    dev = [{"id": f"smoke{i}", "problem": f"problem {i % 10}", "completion_text": f"So the answer is \\boxed{{{box}}}.",
            "gold_answer": gold, "expected_label": label, "has_boxed": True}
           for i, (box, gold, label) in enumerate(SMOKE_CASES)]
    cases = [{"id": i, "gold": gold, "pred": f"\\boxed{{{box}}}", "pred_has_boxed": True, "expected_equal": label,
              "extra_params": None} for i, (box, gold, label) in enumerate(SMOKE_CASES)]
    for name, rows in (("math_dev.jsonl", dev), ("mathverify_cases.jsonl", cases)):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with math_dev.jsonl, mathverify_cases.jsonl")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-trl", action="store_true", help="do not import TRL (its import takes ~15 s)")
    parser.add_argument("--smoke", action="store_true", help="seconds: built-in cases, no TRL, 16 groups, 1 repeat")
    parser.add_argument("--_time", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_groups", type=int, default=64, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._time:
        _time_one(args.data, args._time, args.repeats, args._groups)
        return 0
    print("$ python " + " ".join(shlex.quote(a) for a in sys.argv))
    print(f"cores usable: {len(os.sched_getaffinity(0))}, load average: {os.getloadavg()[0]:.2f} (other jobs share the cores)")
    if not args.smoke:
        agreement(args.data, not args.skip_trl)
        throughput(args.data, args.repeats, not args.skip_trl)
        return 0
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rewards_smoke_") as tmp:
        data = write_smoke_data(Path(tmp))
        disagreements = agreement(data, with_trl=False)
        throughput(data, repeats=1, with_trl=False, groups=16)
    return finish("benchmarks.rewards", [f"boxed_math disagrees with the label of the built-in case {d}"
                                         for d in disagreements])


if __name__ == "__main__":
    sys.exit(main())
