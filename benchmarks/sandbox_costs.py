"""What one hostile sample costs the host: CPU on the value path, wall time on the io path.

    python -m benchmarks.sandbox_costs [--smoke] [--repeat 3]

* value path: a program that writes its own value record, of ``--record-mb`` MiB (the old default cap was
  8 MiB), to every fd it has, then exits. Reported: the host process's CPU time (all its threads; the sandbox's
  processes are not the host's) per sample, the median of ``--repeat`` runs, and the score (must be 0).
* io path: a program whose every one of ``--cases`` cases sleeps 0.9 x ``--timeout``. Reported: the wall time of
  the sample and its score (must be 0); a correct program on the same cases beside it must score 1.
* peak RSS of the host process (``ru_maxrss``) at the end.

Runs on whatever ``reward_plugins.code_sandbox`` is importable (so the same script measures an older checkout:
run it from there). ``--smoke``: small sizes, a few seconds; exits non-zero when a score is not as it must be.
"""

from __future__ import annotations

import argparse
import inspect
import resource
import statistics
import sys
import time

from reward_plugins.code_sandbox import code_sandbox

CORRECT = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2)", "assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
OWN_RECORD = """
import os
record = b'{"i":0,"v":[' + b",".join([b"0"] * %d) + b']}\\n{"i":1,"v":3}\\n{"i":2,"v":0}\\n'
for fd in range(3, 64):
    try:
        os.write(fd, record)
    except OSError:
        pass
os._exit(0)
"""
IO_MAIN = "a, b = map(int, input().split())\nprint(a + b)\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--record-mb", type=float, default=7.5)
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=2.0)
    a = ap.parse_args(argv)
    if a.smoke:
        a.repeat, a.record_mb, a.cases, a.timeout = 1, 1.0, 3, 0.5
    print("$ python -m benchmarks.sandbox_costs " + " ".join(sys.argv[1:] if argv is None else argv))
    options = inspect.signature(code_sandbox).parameters
    print("value-record cap:", options["max_value_bytes"].default if "max_value_bytes" in options else "none (old code)")
    f = code_sandbox(num_workers=2, timeout=a.timeout)
    failures = []
    try:
        f.pool.start()
        zeros = int(a.record_mb * (1 << 20) / 2)
        hostile = CORRECT + OWN_RECORD % zeros
        cpu, wall = [], []
        for _ in range(a.repeat):
            c0, w0 = time.process_time(), time.monotonic()
            got = f(completions=[hostile], tests=[TESTS])
            cpu.append(time.process_time() - c0)
            wall.append(time.monotonic() - w0)
            if got != [0.0]:
                failures.append(f"hostile value record scored {got}")
        ok = f(completions=[CORRECT], tests=[TESTS])
        if ok != [1.0]:
            failures.append(f"correct value-path sample scored {ok}")
        print(
            f"value path, own {a.record_mb:g} MiB record: host CPU {statistics.median(cpu) * 1000:.1f} ms/sample "
            f"(min {min(cpu) * 1000:.1f}, max {max(cpu) * 1000:.1f}), wall {statistics.median(wall) * 1000:.0f} ms, "
            f"score {got[0]}"
        )
        cases = [{"input": f"{k} {k}\n", "output": f"{2 * k}\n"} for k in range(a.cases)]
        slow = f"import time\ntime.sleep({0.9 * a.timeout!r})\n" + IO_MAIN
        walls = []
        for _ in range(a.repeat):
            w0 = time.monotonic()
            got = f(completions=[slow], io_tests=[cases])
            walls.append(time.monotonic() - w0)
            if got != [0.0]:
                failures.append(f"slow io sample scored {got}")
        ok = f(completions=[IO_MAIN], io_tests=[cases])
        if ok != [1.0]:
            failures.append(f"correct io sample scored {ok}")
        print(
            f"io path, {a.cases} cases x sleep {0.9 * a.timeout:g} s (timeout {a.timeout:g} s): sample wall "
            f"{statistics.median(walls):.2f} s (min {min(walls):.2f}, max {max(walls):.2f}), score {got[0]}"
        )
    finally:
        f.close()
    print(f"host peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    for msg in failures:
        print("FAIL:", msg)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
