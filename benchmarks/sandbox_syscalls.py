"""Which syscalls do the sandbox's filtered processes make? (How the seccomp allowlist was derived.)

    python -m benchmarks.sandbox_syscalls [--trace out.txt] -- COMMAND ...
    python -m benchmarks.sandbox_syscalls --parse out.txt
    python -m benchmarks.sandbox_syscalls --attach-cost 2000
    python -m benchmarks.sandbox_syscalls --smoke   # --attach-cost 20, and (root, strace) a trace of one sandbox run

Runs COMMAND under ``strace -f`` (as root: strace follows into bubblewrap), then keeps only the
processes that installed the seccomp filter (``prctl(PR_SET_SECCOMP)``: candidates, io programs,
testers), counted from that call on, and the threads they started. Prints, per syscall, in how
many such processes it was seen, the errors it returned, and for the calls the filter checks by
argument (ioctl request, fcntl command, futex op, pid arguments, ...) the argument values seen.
A process is a "tester" when it receives jobs (recvmsg), else "candidate" (values, call and io).

The allowlist in ``reward_plugins/code_sandbox/sandbox/layers.py`` is the union of what this prints for
    python -m benchmarks.sandbox_syscalls -- python -m benchmarks.sandbox --no-baseline --repeat 1 \
        --trivial 20 --mbpp /path/to/mbpp.jsonl
    python -m benchmarks.sandbox_syscalls -- python -m pytest -q -p no:cacheprovider \
        tests/reward_plugins/code_sandbox/test_sandbox_integrity_os.py -k stdlib
(MBPP's 974 reference solutions, HumanEval's 164 canonical ones on both verdict paths, and a
sample that imports and exercises the stdlib modules solutions use), with the syscalls that
a vDSO or libc fallback needs where this machine did not show them (see the comments there).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

_LINE = re.compile(r"^(\d+) +(?:<\.\.\. ([a-z0-9_]+) resumed>|([a-z0-9_]+)\()(.*)$")
_NEW_TID = re.compile(r"= \d+ /\* (\d+) in strace's PID NS \*/")
_ERR = re.compile(r"= -1 ([A-Z0-9]+) ")
# syscall -> index of the argument worth listing (the filter looks at it)
_ARG = {"ioctl": 1, "fcntl": 1, "futex": 1, "prctl": 0, "kill": 0, "tkill": 0, "tgkill": 0, "prlimit64": 0,
        "sched_getaffinity": 0, "sched_setaffinity": 0, "getpriority": 0, "madvise": 2, "clone": 1,
        "sched_getparam": 0, "sched_getscheduler": 0, "setsockopt": 1, "getsockopt": 1, "socket": 0}  # fmt: skip


def _arg(rest: str, k: int) -> str:
    depth, cur, args = 0, "", []
    for ch in rest:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
            continue
        cur += ch
    args.append(cur.strip())
    a = args[k] if k < len(args) else "?"
    return re.sub(r" /\*.*?\*/| <unfinished \.\.\.>", "", a)[:60]


def parse(path: str) -> dict:
    lines = open(path, errors="replace").read().splitlines()
    filtered_from: dict[str, int] = {}  # pid -> first line index counted
    for i, line in enumerate(lines):  # pass 1: filtered processes and their threads
        m = _LINE.match(line)
        if not m:
            continue
        pid, rest = m.group(1), line
        if "prctl(PR_SET_SECCOMP" in rest and pid not in filtered_from:
            filtered_from[pid] = i + 1
        elif pid in filtered_from and (m.group(2) or m.group(3)) in ("clone", "clone3"):
            t = _NEW_TID.findall(rest)  # a thread (fork is refused): its pid in strace's namespace
            if t:
                filtered_from.setdefault(t[-1], 0)
    role = {}
    for line in lines:
        m = _LINE.match(line)
        if m and m.group(1) in filtered_from and m.group(3) == "recvmsg":
            role[m.group(1)] = "tester"
    seen = collections.defaultdict(lambda: {"tester": set(), "candidate": set(), "errors": set(), "args": set()})
    for i, line in enumerate(lines):
        m = _LINE.match(line)
        if not m or m.group(1) not in filtered_from or i < filtered_from[m.group(1)]:
            continue
        pid = m.group(1)
        name = m.group(3) or m.group(2)
        if m.group(3):  # the call starts here
            rec = seen[name]
            rec[role.get(pid, "candidate")].add(pid)
            if name in _ARG:
                rec["args"].add(_arg(m.group(4), _ARG[name]))
        e = _ERR.search(line)
        if e and ("unfinished" not in line):
            seen[name]["errors"].add(e.group(1))
    return seen


def report(seen: dict) -> str:
    out = [f"{'syscall':22s} {'cand':>5s} {'test':>5s}  errors / arguments seen"]
    for name in sorted(seen):
        r = seen[name]
        extra = []
        if r["errors"]:
            extra.append("err=" + ",".join(sorted(r["errors"])))
        if r["args"]:
            extra.append("args=" + " | ".join(sorted(r["args"]))[:200])
        out.append(f"{name:22s} {len(r['candidate']):5d} {len(r['tester']):5d}  {'; '.join(extra)}")
    return "\n".join(out)


def attach_cost(n: int) -> str:
    """Microseconds a child spends installing the seccomp filter (prctl), against installing
    none: forked n times each, interleaved, timed inside the child. Run as any user."""
    import struct
    import time

    from reward_plugins.code_sandbox.sandbox import layers  # what the worker runs: stdlib only

    layers.no_new_privs()  # this process and its forks only
    layers.seccomp_prepare()
    r, w = os.pipe()
    times = {"no filter": [], f"allowlist ({len(layers.seccomp_filter_bytes()) // 8} instructions)": []}
    for _ in range(n):
        for name in times:
            pid = os.fork()
            if pid == 0:
                t = time.perf_counter_ns()
                if name != "no filter":
                    layers.apply_seccomp()
                os.write(w, struct.pack("q", time.perf_counter_ns() - t))
                os._exit(0)
            os.waitpid(pid, 0)
            times[name].append(struct.unpack("q", os.read(r, 8))[0] / 1000)
    rows = []
    for name, ts in times.items():
        ts.sort()
        rows.append(f"{name:32s} median {ts[len(ts) // 2]:7.1f} us   p10 {ts[len(ts) // 10]:7.1f} us")
    return "\n".join(rows) + f"\n(load average {os.getloadavg()[0]:.2f})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=None, help="keep strace's output here")
    ap.add_argument("--parse", default=None, help="only summarise an existing trace")
    ap.add_argument("--attach-cost", type=int, default=0, metavar="N", help="time installing the filter in N forks instead")
    ap.add_argument("--smoke", action="store_true", help="seconds: --attach-cost 20, then (as root, with strace) trace "
                    "`benchmarks.sandbox_flood --smoke` and fail unless filtered processes were seen")
    ap.add_argument("command", nargs="*")
    args = ap.parse_args(argv)
    if args.smoke:
        return smoke()
    if args.attach_cost:
        print(attach_cost(args.attach_cost))
        return
    path = args.parse
    if path is None:
        if not args.command:
            ap.error("a command to trace is needed")
        path = args.trace or tempfile.mkstemp(suffix=".strace")[1]
        cmd = ["strace", "-f", "-qq", "--decode-pids=pidns", "-s", "0", "-o", path, *args.command]
        rc = subprocess.call(cmd, env=os.environ)
        if rc:
            print(f"(the traced command exited with {rc})", file=sys.stderr)
    print(report(parse(path)))
    return 0


def smoke() -> int:
    import shutil

    from benchmarks._status import finish

    print(attach_cost(20))
    if shutil.which("strace") is None or os.geteuid() != 0:
        print("trace part not run: it needs strace and root (strace follows into bubblewrap only as root)")
        return 0
    path = tempfile.mkstemp(suffix=".strace")[1]
    traced = [sys.executable, "-m", "benchmarks.sandbox_flood", "--smoke"]
    rc = subprocess.call(["strace", "-f", "-qq", "--decode-pids=pidns", "-s", "0", "-o", path, *traced], env=os.environ)
    seen = parse(path)
    print(report(seen))
    os.unlink(path)
    return finish("benchmarks.sandbox_syscalls", [f"the traced run exited {rc}"] * bool(rc) + [
        "no process that installed the seccomp filter was found in the trace"] * (not seen))


if __name__ == "__main__":
    sys.exit(main())
