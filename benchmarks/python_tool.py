"""Speed of the sandboxed Python tool (``PythonEnvironment``) beside an unsandboxed persistent Python subprocess.

    python -m benchmarks.python_tool [--calls 2000] [--resets 200] [--repeat 3] [--smoke] [--save out.json]

Measures, in one run and on the same cores:
* setup of a rollout batch: 16 environments constructed and reset, each answering its first cell, from a cold
  start (the sandboxed interpreter server is started inside this time);
* tool calls/s on one environment (TRL calls the tools of a batch one after another, in one thread) for a
  trivial cell (``x = 1``) and a typical one (a loop, a print, a last expression), sandboxed and baseline;
* resets/s: ``reset()`` followed by the first cell (the time until the new interpreter answers), sandboxed
  (a fork of the clean server) and baseline (a fresh ``python -I -S`` per rollout: the no-harness limit of a
  process-per-rollout design); and the host's cost of ``reset()`` alone;
* peak RSS of this process, and the RSS of the sandbox's processes at the end.

The baseline runs the same REPL (``interpreter.repl_loop``) over the same pipes and framing, without bubblewrap,
Landlock, seccomp or rlimits, so the difference is the price of the isolation. Calls are timed in alternating
chunks of 50 (sandbox, baseline, sandbox, ...) and the median chunk counts, so both see the same load on a shared
machine; each case runs ``--repeat`` times, and the median and the range of those are printed.
``--smoke``: few calls, seconds; exits non-zero if a reply is
not what the cell prints.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from reward_plugins.code_sandbox import PythonEnvironment, environment
from reward_plugins.code_sandbox.host import launcher
from reward_plugins.code_sandbox.sandbox import interpreter

CELLS = {
    "trivial": ("x = 1", "(no output)"),
    "typical": ("total = 0\nfor i in range(200):\n    total += i * i\nprint('sum', total)\ntotal % 7",
                f"sum {sum(i * i for i in range(200))}\n{sum(i * i for i in range(200)) % 7}\n"),
}  # fmt: skip
GOALS = {"calls_per_s": 200.0, "baseline_share": 0.5, "setup16_s": 1.0}


class Baseline:
    """A persistent, unsandboxed Python subprocess running the tool's REPL over the same pipes."""

    def __init__(self, code_dir: str, timeout: float = 10.0, max_chars: int = 4000):
        cell_r, self.cell_w = os.pipe()
        self.reply_r, reply_w = os.pipe()
        code = f"from {interpreter.__name__} import repl_loop; repl_loop({cell_r}, {reply_w}, {timeout!r}, {max_chars})"
        # the sandbox's interpreter and modules (``code_dir``: laid out as for the server; -c puts the cwd on the path)
        self.proc = subprocess.Popen([launcher.sandbox_python(), "-S", "-B", "-c", code], pass_fds=(cell_r, reply_w),
                                     cwd=code_dir, env={})  # fmt: skip
        os.close(cell_r)
        os.close(reply_w)
        os.set_blocking(self.cell_w, False)
        self.channel = environment.Interpreter(None, "baseline", self.cell_w, self.reply_r)

    def python(self, code: str) -> str:
        return self.channel.run(code, time.monotonic() + 30, 1 << 20)[1:]

    def close(self):
        os.close(self.cell_w)
        os.close(self.reply_r)
        self.proc.kill()
        self.proc.wait()


def setup16() -> tuple[float, list[PythonEnvironment]]:
    t = time.perf_counter()
    envs = [PythonEnvironment() for _ in range(16)]
    for e in envs:
        e.reset()
    for e in envs:
        _check(e.python("1"), "1\n")
    return time.perf_counter() - t, envs


FAILURES: list[str] = []


def _check(got: str, want: str) -> None:
    if got != want:
        FAILURES.append(f"reply {got[:200]!r}, wanted {want!r}")


def calls_per_s(runs: dict, cell: str, want: str, n: int, chunk: int = 50) -> dict:
    """calls/s of each of ``runs`` (name -> python(code)), timed in alternating chunks of ``chunk`` calls so that
    both see the same load (the median chunk is taken: the machine is shared)."""
    times = {name: [] for name in runs}
    for _ in range(max(1, n // chunk)):
        for name, run in runs.items():
            t = time.perf_counter()
            for _ in range(chunk):
                _check(run(cell), want)
            times[name].append(time.perf_counter() - t)
    return {name: chunk / statistics.median(ts) for name, ts in times.items()}


def sandbox_resets_per_s(env: PythonEnvironment, n: int) -> tuple[float, float]:
    """(resets/s with the first cell answered, host seconds per reset() alone)."""
    t, host = time.perf_counter(), 0.0
    for _ in range(n):
        h = time.perf_counter()
        env.reset()
        host += time.perf_counter() - h
        _check(env.python("1"), "1\n")
    return n / (time.perf_counter() - t), host / n


def baseline_resets_per_s(code_dir: str, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        b = Baseline(code_dir)
        _check(b.python("1"), "1\n")
        b.close()
    return n / (time.perf_counter() - t)


def sandbox_rss_mb() -> float | None:
    """RSS of the sandbox's processes (server and interpreters; shared pages counted once per process)."""
    server = environment._SERVERS.get("bwrap")
    if server is None:
        return None
    uid = launcher.slot_uid(0, server.claim.id)
    if uid is None:
        return None
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def _med(xs):
    return statistics.median(xs), min(xs), max(xs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--resets", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--save")
    args = ap.parse_args(argv)
    if args.smoke:
        args.calls, args.resets, args.repeat = 100, 10, 1
    cold, envs = setup16()
    env = envs[0]
    code_dir = tempfile.mkdtemp(prefix="python_tool_baseline-")
    launcher.install_sandbox_code(code_dir, "interpreter")
    base = Baseline(code_dir)
    results: dict = {"setup16_s": cold, "cores": len(os.sched_getaffinity(0))}
    samples: dict = {}
    for _ in range(args.repeat):
        for name, (cell, want) in CELLS.items():
            rates = calls_per_s({"sandbox": env.python, "baseline": base.python}, cell, want, args.calls)
            for who, rate in rates.items():
                samples.setdefault(f"{who}_{name}", []).append(rate)
        rate, host = sandbox_resets_per_s(env, args.resets)
        samples.setdefault("sandbox_resets", []).append(rate)
        samples.setdefault("sandbox_reset_host_ms", []).append(host * 1e3)
        samples.setdefault("baseline_resets", []).append(baseline_resets_per_s(code_dir, max(5, args.resets // 4)))
    base.close()
    results.update({k: _med(v) for k, v in samples.items()})
    results["peak_rss_host_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results["rss_sandbox_mb_16_envs"] = sandbox_rss_mb()
    for e in envs:
        e._close()

    print(f"python -m benchmarks.python_tool {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    print(f"cores: {results['cores']}; median (min-max) of {args.repeat} run(s)")
    print(f"setup of 16 environments (cold: server start, 16 resets, 16 first cells): {cold:.3f} s")
    for name in CELLS:
        s, b = results[f"sandbox_{name}"], results[f"baseline_{name}"]
        print(f"{name:8s} cell  sandbox {s[0]:8.0f} calls/s ({s[1]:.0f}-{s[2]:.0f})   baseline {b[0]:8.0f} calls/s "
              f"({b[1]:.0f}-{b[2]:.0f})   share {s[0] / b[0]:.0%}")  # fmt: skip
    r, h, b = results["sandbox_resets"], results["sandbox_reset_host_ms"], results["baseline_resets"]
    print(f"resets   (reset + first cell)  sandbox {r[0]:6.0f}/s ({r[1]:.0f}-{r[2]:.0f}), host cost of reset() "
          f"{h[0]:.2f} ms   baseline (fresh subprocess) {b[0]:6.0f}/s ({b[1]:.0f}-{b[2]:.0f})")  # fmt: skip
    rss = results["rss_sandbox_mb_16_envs"]
    print(f"peak RSS: host {results['peak_rss_host_mb']:.0f} MB; sandbox processes at the end "
          f"{'n/a (not root)' if rss is None else f'{rss:.0f} MB (sum of RSS, shared pages counted per process)'}")
    worst = min(results[f"sandbox_{n}"][0] for n in CELLS)
    share = min(results[f"sandbox_{n}"][0] / results[f"baseline_{n}"][0] for n in CELLS)
    goals = {"calls_per_s": worst >= GOALS["calls_per_s"], "baseline_share": share >= GOALS["baseline_share"],
             "setup16_s": cold < GOALS["setup16_s"]}  # fmt: skip
    print("goals: " + ", ".join(f"{k} {'met' if ok else 'MISSED'}" for k, ok in goals.items()))
    if args.save:
        with open(args.save, "w") as f:
            json.dump({**results, "goals": goals, "failures": FAILURES}, f, indent=1)
    if FAILURES:
        print(f"{len(FAILURES)} wrong replies, e.g. {FAILURES[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
