"""Speed of the sandboxed Python tool (``PythonEnvironment``) beside an unsandboxed persistent Python subprocess.

    python -m benchmarks.python_tool [--calls 2000] [--resets 200] [--repeat 3] [--rounds 16,64] [--smoke]
                                     [--save out.json]

Measures, in one run and on the same cores:
* setup of a rollout batch: 16 environments constructed and reset, each answering its first cell, from a cold
  start (the sandboxed interpreter server is started inside this time);
* tool calls/s on one environment (TRL calls the tools of a batch one after another, in one thread) for a
  trivial cell (``x = 1``) and a typical one (a loop, a print, a last expression), sandboxed and baseline;
* resets/s: ``reset()`` followed by the first cell (the time until the new interpreter answers), sandboxed
  (a fork of the clean server) and baseline (a fresh ``python -I -S`` per rollout: the no-harness limit of a
  process-per-rollout design); and the host's cost of ``reset()`` alone;
* peak RSS of this process, and the RSS of the sandbox's processes at the end;
* the host's wall time of one tool turn over 16 and 64 rollouts, each with one cell that sleeps 0.2 s or one
  that computes (~0.05 CPU-s), called one rollout after another as TRL 1.16 calls them ("sequential") and with
  the turn's cells sent ahead together (``trl_rlvr.rollouts.tool_turn``, what ``RLVRTrainer`` does: "dispatched");
* cleanup of a hostile rollout: one that left a directory chain ten times deeper than PATH_MAX and as many
  entries as its filesystem takes; the time until its interpreter (and with it its tmpfs) is gone after
  ``reset()``, and until the next interpreter answers.

The baseline runs the same REPL (``interpreter.repl_loop``) over the same pipes and framing, without bubblewrap,
Landlock, seccomp or rlimits, so the difference is the price of the isolation. Calls are timed in alternating
chunks of 50 (sandbox, baseline, sandbox, ...) and the median chunk counts, so both see the same load on a shared
machine; each case runs ``--repeat`` times, and the median and the range of those are printed.
``--smoke``: few calls, one round size (16), seconds; exits non-zero if a reply is not what the cell prints.
``--fairness``: only CPU between rollouts: a sibling's single-thread CPU cell alone and beside a cell of 64 C-level
threads, with and without per-interpreter cpu cgroups, and (as root) with the scheduler's autogroup on and off
(restored after).
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

from reward_plugins.code_sandbox import PythonEnvironment
from reward_plugins.code_sandbox.host import interpreter_server, launcher
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
        self.channel = interpreter_server.Interpreter(None, self.cell_w, self.reply_r, pidfd=-1)

    def python(self, code: str) -> str:
        self.channel.start(code, 30.0, 1 << 20)
        return interpreter_server.collect(self.channel)[0][1:]

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
    server = interpreter_server._SERVERS.get("bwrap")
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


ROUND_CELLS = {
    "sleep": ("import time\ntime.sleep(0.2)\n7", "7\n"),
    "compute": ("sum(i * i for i in range(300000)) % 7", f"{sum(i * i for i in range(300000)) % 7}\n"),
}


def tool_turn(envs: list[PythonEnvironment], cell: str, want: str, dispatched: bool) -> float:
    """Host wall seconds of one tool turn: every rollout's call, in TRL's order, over its sync tool dicts
    (with ``dispatched``, the turn's cells first sent ahead by ``trl_rlvr.rollouts.tool_turn``, as RLVRTrainer does)."""
    from trl_rlvr.rollouts.tool_turn import tool_turns

    tools = [{"python": e.python} for e in envs]
    completions = [[{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "python", "arguments": {"code": cell}}}]}] for _ in envs]  # fmt: skip
    t = time.perf_counter()
    with tool_turns(envs if dispatched else None, completions):
        for tool, messages in zip(tools, completions):  # TRL's loop: one rollout after another
            reply = tool["python"](**messages[-1]["tool_calls"][0]["function"]["arguments"])
            messages.append({"role": "tool", "name": "python", "content": reply})
            _check(reply, want)
    return time.perf_counter() - t


def rounds(sizes: list[int], repeat: int) -> dict:
    out = {}
    for n in sizes:
        envs = [PythonEnvironment(rollout_timeout=600.0) for _ in range(n)]
        for e in envs:
            e.reset()
            _check(e.python("1"), "1\n")
        for name, (cell, want) in ROUND_CELLS.items():
            for how in ("sequential", "dispatched"):
                out[f"round{n}_{name}_{how}"] = _med([tool_turn(envs, cell, want, how == "dispatched")
                                                      for _ in range(repeat)])  # fmt: skip
        for e in envs:
            e._close()
    return out


HOSTILE_LEFTOVERS = (
    "import os\nname, fd = 'd' * 250, os.open('.', os.O_RDONLY)\nfor _ in range(160):\n"
    "    os.mkdir(name, dir_fd=fd); new = os.open(name, os.O_RDONLY, dir_fd=fd); os.close(fd); fd = new\n"
    "os.close(fd)\nn = 0\ntry:\n    while True:\n        os.mkdir(f'e{n}'); n += 1\nexcept OSError:\n    pass\nn"
)


def hostile_cleanup() -> dict:
    """Seconds from ``reset()`` of a rollout that left a chain of 160 directories (~40000 path characters) and a
    full inode table, until its interpreter is gone (its tmpfs with it), and until the next interpreter answers."""
    import select

    env = PythonEnvironment(timeout=60.0, rollout_timeout=600.0)
    env.reset()
    entries = int(env.python(HOSTILE_LEFTOVERS).strip())
    pidfd = os.dup(env._interpreter.pidfd)
    t = time.perf_counter()
    env.reset()
    select.select([pidfd], [], [], 60)  # readable when the process is gone
    gone = time.perf_counter() - t
    os.close(pidfd)
    _check(env.python("import os\nos.listdir('.')"), "[]\n")
    answered = time.perf_counter() - t
    env._close()
    return {"hostile_entries": entries, "hostile_gone_s": gone, "hostile_next_answer_s": answered}


SIBLING_CELL = ("import time\nc, w = time.process_time(), time.monotonic()\nsum(i * i for i in range(3_000_000)) % 7\n"
                "round(time.monotonic() - w, 3), round(time.process_time() - c, 3)")  # fmt: skip
HOSTILE_THREADS = (
    "import hashlib, threading, time\nbuf = bytes(1 << 22)\nstop = time.monotonic() + {seconds}\n"
    "def burn():\n    while time.monotonic() < stop:\n        hashlib.sha256(buf).digest()\n"
    "ts = [threading.Thread(target=burn) for _ in range({threads})]\n[t.start() for t in ts]\n[t.join() for t in ts]"
)


def _autogroup(value: str | None) -> str | None:
    """Read (``value`` None) or set the kernel's scheduler autogroup switch -> what it was; None where not writable."""
    path = "/proc/sys/kernel/sched_autogroup_enabled"
    try:
        old = open(path).read().strip()
        if value is not None:
            with open(path, "w") as f:
                f.write(value)
        return old
    except OSError:
        return None


def fairness(repeat: int, threads: int = 64, seconds: float = 6.0) -> dict:
    """A sibling's single-thread CPU cell (its wall time, as the tool charges it) alone and beside a rollout whose
    cell runs ``threads`` C-level threads (hashing without the GIL) for ``seconds``; with each interpreter in a cpu
    cgroup of its own (the default as root) and without (the fallback: what the kernel does), and with the
    scheduler's autogroup on and off (as root; it is restored whatever happens)."""
    out: dict = {}
    server = interpreter_server.shared_server("bwrap")
    cpu_dir = server.cpu_dir
    autogroups = ["1", "0"] if _autogroup(None) is not None and os.geteuid() == 0 else [None]
    saved = _autogroup(None)
    try:
        for ag in autogroups:
            if ag is not None:
                _autogroup(ag)
            for how in ("cgroup", "none") if cpu_dir else ("none",):
                server.cpu_dir = cpu_dir if how == "cgroup" else None  # interpreters spawned from here on
                sibling = PythonEnvironment(timeout=120.0, rollout_timeout=600.0)
                hostile = PythonEnvironment(timeout=120.0, rollout_timeout=600.0, memory_mb=4096)
                alone, beside = [], []
                for _ in range(repeat):
                    sibling.reset()
                    hostile.reset()
                    _check(sibling.python("1"), "1\n")
                    _check(hostile.python("1"), "1\n")
                    alone.append(_charged(sibling, SIBLING_CELL))
                    hostile._dispatch_call("python", {"code": HOSTILE_THREADS.format(seconds=seconds, threads=threads)})
                    time.sleep(0.3)  # its threads are up
                    beside.append(_charged(sibling, SIBLING_CELL))
                    hostile.python(HOSTILE_THREADS.format(seconds=seconds, threads=threads))
                out[f"fair_autogroup{ag or '_as_is'}_{how}"] = {"alone": _med(alone), "beside": _med(beside)}
                sibling._close()
                hostile._close()
    finally:
        server.cpu_dir = cpu_dir
        if saved is not None:
            _autogroup(saved)
    return out


def _charged(env: PythonEnvironment, code: str) -> float:
    before = env._spent
    reply = env.python(code)
    if not reply.startswith("("):
        FAILURES.append(f"sibling cell: {reply[:200]!r}")
    return env._spent - before


def _med(xs):
    return statistics.median(xs), min(xs), max(xs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--resets", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", default="16,64", help="batch sizes of the tool-round measurement ('' to skip)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--save")
    ap.add_argument("--fairness", action="store_true", help="only the CPU fairness measurement (see fairness())")
    args = ap.parse_args(argv)
    if args.fairness:
        return fairness_main(args, argv)
    if args.smoke:
        args.calls, args.resets, args.repeat, args.rounds = 100, 10, 1, "16"
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
    sizes = [int(x) for x in args.rounds.split(",") if x.strip()]
    results.update(rounds(sizes, args.repeat))
    results.update(hostile_cleanup())
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
    for n in sizes:
        for name in ROUND_CELLS:
            seq, dis = results[f"round{n}_{name}_sequential"], results[f"round{n}_{name}_dispatched"]
            print(f"tool turn of {n:3d} rollouts, {name:7s} cells: sequential {seq[0]:6.2f} s   "
                  f"dispatched {dis[0]:6.2f} s ({dis[1]:.2f}-{dis[2]:.2f})")  # fmt: skip
    print(f"hostile rollout ({results['hostile_entries']} entries and a 160-deep chain of 250-char names): gone "
          f"{results['hostile_gone_s']:.3f} s after reset(), next interpreter answered at "
          f"{results['hostile_next_answer_s']:.3f} s")  # fmt: skip
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


def fairness_main(args, argv) -> int:
    results = fairness(args.repeat)
    print(f"python -m benchmarks.python_tool {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    print(f"cores: {len(os.sched_getaffinity(0))}; load average {os.getloadavg()[0]:.1f} at the end; a sibling's "
          f"single-thread CPU cell, charged wall seconds, median (min-max) of {args.repeat}")  # fmt: skip
    for key, r in results.items():
        a, b = r["alone"], r["beside"]
        print(f"{key:32s} alone {a[0]:6.2f} s ({a[1]:.2f}-{a[2]:.2f})   beside 64 C-level threads "
              f"{b[0]:6.2f} s ({b[1]:.2f}-{b[2]:.2f})   x{b[0] / a[0]:.1f}")  # fmt: skip
    if args.save:
        with open(args.save, "w") as f:
            json.dump({**results, "failures": FAILURES}, f, indent=1)
    if FAILURES:
        print(f"{len(FAILURES)} wrong replies, e.g. {FAILURES[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
