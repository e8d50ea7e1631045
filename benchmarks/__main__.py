"""Run every benchmark once in its smoke mode: ``python -m benchmarks --smoke`` (what ``.ci/run`` does).

Each module under benchmarks/ (not ``_private`` ones) runs as ``python -m benchmarks.NAME --smoke`` in its own
process, one after the other, with a time bound. Prints one line per benchmark (passed / SKIPPED with its reason /
FAILED with its exit status), its wall time and peak RSS, and the total; exits 1 if any failed. A benchmark that
cannot run on this machine (no GPU) exits 77 and says why: reported as skipped, not as passed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks._status import SKIPPED

HERE = Path(__file__).resolve().parent


def benchmark_modules() -> list[str]:
    """The benchmarks: every public module of this package."""
    return sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_"))


def run_smoke(name: str, timeout: float) -> tuple[int | str, int]:
    """(exit status or "timed out ...", peak RSS in KiB of the benchmark's process and the processes it waited
    for), from ``wait4`` on that one process."""
    proc = subprocess.Popen([sys.executable, "-m", f"benchmarks.{name}", "--smoke"], cwd=HERE.parent,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, start_new_session=True)
    timed_out = threading.Event()

    def kill():
        timed_out.set()
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the benchmark's children go too

    timer = threading.Timer(timeout, kill)
    timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return (f"timed out after {timeout:.0f} s" if timed_out.is_set() else proc.returncode), usage.ru_maxrss


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", required=True, help="run every benchmark's --smoke")
    parser.add_argument("--only", nargs="+", choices=benchmark_modules(), help="these benchmarks only")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per benchmark (default 300)")
    args = parser.parse_args(argv)
    print("$ python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else argv), flush=True)
    results, started = [], time.perf_counter()
    for name in args.only or benchmark_modules():
        t = time.perf_counter()
        rc, peak_kib = run_smoke(name, args.timeout)
        wall = time.perf_counter() - t
        status = "passed" if rc == 0 else "SKIPPED" if rc == SKIPPED else f"FAILED ({rc})"
        results.append((name, status, wall, peak_kib))
        print(f"[benchmarks] {name}: {status} in {wall:.1f} s", flush=True)
    total = time.perf_counter() - started
    print(f"\n{'benchmark':20s} {'status':18s} {'wall s':>7s} {'peak RSS MiB':>13s}")
    for name, status, wall, peak in results:
        print(f"{name:20s} {status:18s} {wall:7.1f} {peak / 1024:13.0f}")
    load = os.getloadavg()
    print(f"total {total:.1f} s on {len(os.sched_getaffinity(0))} cores, load average {load[0]:.2f} at the end")
    return 1 if any(status.startswith("FAILED") for _, status, _, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
