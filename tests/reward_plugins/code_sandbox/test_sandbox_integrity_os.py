"""Reward integrity, OS layer: classes closed by design, each with a hostile sample, a
correct one beside it that must still score 1.0, and a later sample on the same worker that must
be scored correctly.

* seccomp default-deny allowlist: no syscall reaches another process (prlimit64, scheduling,
  priority, signals, ...), and the stdlib modules solutions use still work on every path;
* a worker cannot be poisoned silently: it checks its own and its tester's limits, affinity and
  priority after every job, and a child that dies before its lockdown is an internal error;
* uids, cgroups and scratch dirs are unique per pool (a random id claimed exclusively, never the
  pid), and what a SIGKILLed host left behind is reclaimed at the next start;
* the cleanup of a file flood is bounded: a sample that leaves more than can be removed in time
  costs its worker (replaced, counted as an error), never the next sample's time.
"""

import os
import sys
from pathlib import Path

import pytest

from reward_plugins.code_sandbox import code_sandbox
from tests.harness import stdlib_probe

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

CORRECT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]


@pytest.fixture(scope="module")
def one_worker():
    """One worker, so that "the next sample" runs where the hostile one ran."""
    f = code_sandbox(num_workers=1, timeout=3.0)
    f.pool.start()
    yield f
    f.close()


def _probe_jobs(reward):
    prog = stdlib_probe.PROGRAM
    asserts = [f"assert step({s!r})" for s in stdlib_probe.STEPS]
    values = reward.job(prog, 0, {"tests": [asserts]})
    tester = reward.job(prog, 0, {"tests": [asserts], "test_setup_code": ["SETUP = 1"]})
    io = reward.job(prog, 0, {"io_tests": [[{"input": s, "output": f"{s} True"} for s in stdlib_probe.STEPS]]})
    assert (values.mode, tester.mode, io.mode) == ("values", "call", "io")
    return {"values": values, "tester": tester, "io": io}


def test_stdlib_modules_solutions_use_work_on_every_path(one_worker):
    """Threads with a big stack, clocks, randomness, files, mmap, signals to itself, rlimits of its
    own, polling, the pure-Python modules: each step is one test, on the value path, the tester path
    and the io path; and what no solution needs (sockets, processes, other pids) stays refused."""
    jobs = _probe_jobs(one_worker)
    outs = one_worker.pool.run(list(jobs.values()))
    failed = {path: [s for s, ok in zip(stdlib_probe.STEPS, out.passed) if not ok] for path, out in zip(jobs, outs)}
    assert failed == {"values": [], "tester": [], "io": []}
    assert [o.error for o in outs] == [None, None, None]
    assert one_worker(prompts=[""], completions=[CORRECT], tests=[TESTS]) == [1.0]


# ---------------------------------------------------------------- class 3: no syscall reaches another process
OTHER_PROCESS_ATTACK = r'''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
me = os.getpid()
tiny = (ctypes.c_uint64 * 2)(32 << 20, 32 << 20)
one_fd = (ctypes.c_uint64 * 2)(3, 3)
out = (ctypes.c_uint64 * 8)()
cpu0 = ctypes.c_uint64(1)
prio = ctypes.c_int(0)
attr = (ctypes.c_uint32 * 14)(56, 5)  # struct sched_attr: size 56, SCHED_IDLE
hits = []
for pid in range(1, 80):
    if pid == me:
        continue
    for name, nr, args in (
        ("prlimit64 AS", 302, (pid, 9, ctypes.byref(tiny), None)),
        ("prlimit64 NOFILE", 302, (pid, 7, ctypes.byref(one_fd), None)),
        ("prlimit64 read", 302, (pid, 7, None, ctypes.byref(out))),
        ("sched_setaffinity", 203, (pid, 8, ctypes.byref(cpu0))),
        ("sched_getaffinity", 204, (pid, 8, ctypes.byref(out))),
        ("sched_setparam", 142, (pid, ctypes.byref(prio))),
        ("sched_setscheduler", 144, (pid, 5, ctypes.byref(prio))),
        ("sched_setattr", 314, (pid, ctypes.byref(attr), 0)),
        ("setpriority", 141, (0, pid, 19)),
        ("getpriority", 140, (0, pid)),
        ("ioprio_set", 251, (1, pid, 3 << 13)),
        ("kill", 62, (pid, 0)), ("tkill", 200, (pid, 0)), ("tgkill", 234, (pid, pid, 0)),
        ("rt_sigqueueinfo", 129, (pid, 0, ctypes.byref(out))),
        ("get_robust_list", 274, (pid, ctypes.byref(out), ctypes.byref(out, 8))),
        ("migrate_pages", 256, (pid, 64, ctypes.byref(cpu0), ctypes.byref(cpu0))),
        ("move_pages", 279, (pid, 1, ctypes.byref(out), None, ctypes.byref(out, 16), 0)),
        ("process_vm_readv", 310, (pid, ctypes.byref(out), 1, ctypes.byref(out), 1, 0)),
        ("pidfd_open", 434, (pid, 0)), ("ptrace attach", 101, (16, pid, 0, 0)), ("kcmp", 312, (me, pid, 0, 0, 0)),
        ("fcntl F_SETOWN", 72, (1, 8, pid)),
    ):
        if libc.syscall(nr, *args) >= 0:
            hits.append((name, pid))
'''
ATTACK_ADD = OTHER_PROCESS_ATTACK + "def add(a, b):\n    return a + b if hits else a - b\n"  # right only if something got through
ATTACK_IO = OTHER_PROCESS_ATTACK + "print('reached' if hits else 'refused')\n"


def _pool_processes(pool):
    """{pid: role} of the pool's sandboxed processes seen from the host: per worker bwrap ->
    fork server -> tester, all as the slot's uid."""
    uids, owner = set(pool.uids), {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                owner[pid] = (os.stat(f"/proc/{pid}").st_uid, open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    ours = {p for p, (uid, _) in owner.items() if uid in uids}
    depth = {}
    for p in ours:
        d, q = 0, p
        while owner.get(q, (None, None))[1] in ours:
            d, q = d + 1, owner[q][1]
        depth[p] = d
    return {p: ("bwrap", "worker", "tester")[min(d, 2)] for p, d in depth.items()}


def _os_state(pid):
    """What the host sees of a process: its limits, CPU affinity, nice value and policy."""
    try:
        stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return open(f"/proc/{pid}/limits").read(), sorted(os.sched_getaffinity(int(pid))), stat[16], stat[38]
    except OSError:
        return "gone"


@pytest.mark.parametrize("path", ["values", "tester", "io"])
def test_no_syscall_reaches_another_process(one_worker, path):
    """A sample tries every syscall that names a process against every other pid of its
    namespace (the fork server, the tester): each is refused, nothing about those processes
    changes, and the worker goes on scoring correctly (the old deny list let prlimit64,
    sched_setaffinity, sched_setparam, ... through, and every later sample scored 0)."""
    procs = _pool_processes(one_worker.pool)
    assert sorted(procs.values()) == ["bwrap", "tester", "worker"]
    before = {p: _os_state(p) for p in procs}
    if path == "io":
        io = [[{"input": "", "output": "reached"}]] * 2
        r = one_worker(prompts=[""] * 2, completions=[ATTACK_IO, "print('reached')"], io_tests=io)
    else:
        kw = {"tests": [TESTS, TESTS]} if path == "values" else {"tests": [TESTS, TESTS], "test_setup_code": ["S = 1"] * 2}
        r = one_worker(prompts=[""] * 2, completions=[ATTACK_ADD, CORRECT], **kw)
    assert r == [0.0, 1.0]
    after = {p: _os_state(p) for p in before}
    retired = {p for p, v in after.items() if procs[p] == "tester" and v == "gone"}  # a tester may retire between jobs
    assert {p: v for p, v in after.items() if p not in retired} == {p: v for p, v in before.items() if p not in retired}
    assert one_worker.pool.restarts == 0
    assert one_worker(prompts=[""] * 2, completions=[CORRECT, WRONG], tests=[TESTS] * 2) == [1.0, 0.0]


# ---------------------------------------------------------------- a worker cannot be poisoned silently
def _poison(pool, role):
    """Change what no job may change, from outside, as the sandbox's own uid (as a hole in the
    filter would let a sample do): the fork server's address-space limit (every child inherits
    it), or the tester's nice value."""
    import subprocess

    (pid,) = [int(p) for p, r in _pool_processes(pool).items() if r == role]
    if role == "worker":
        code = f"import resource; resource.prlimit({pid}, resource.RLIMIT_AS, (256 << 20, 256 << 20))"
    else:
        code = f"import os; os.setpriority(os.PRIO_PROCESS, {pid}, 10)"
    uid = pool.uids[0]
    ids = dict(user=uid, group=uid, extra_groups=[]) if uid is not None else {}
    subprocess.run([pool.python, "-I", "-c", code], check=True, timeout=30, cwd="/", **ids)


RESERVED_EXITS = [
    "import os\nos._exit(70)\n" + WRONG,
    "import ctypes\nctypes.CDLL(None).syscall(231, 256 + 71)\n" + WRONG,
    "import ctypes, threading\nctypes.CDLL(None).syscall(60, 70)\n" + WRONG,  # the main thread alone: exit()
]


@pytest.mark.parametrize("role", ["worker", "tester"])
def test_a_poisoned_worker_is_replaced_logged_and_counted(role, caplog):
    """A worker whose own or whose tester's limits or priority changed under it (or whose child
    died before its lockdown) answers the job with an internal error: the reason is logged and a fresh
    worker takes the sample again (it scores what it is: the machinery's failure is not a wrong answer); the old
    code went on with the poisoned worker and every later sample scored 0 without an error. A
    program cannot fake that error: the exit statuses it means are refused to sandboxed code."""
    import logging

    f = code_sandbox(num_workers=1, timeout=3.0)
    try:
        f.pool.start()
        m = {}
        assert f(prompts=[""], completions=[CORRECT], tests=[TESTS]) == [1.0]
        _poison(f.pool, role)
        with caplog.at_level(logging.WARNING, logger="reward_plugins.code_sandbox"):
            r = f(prompts=[""] * 2, completions=[CORRECT] * 2, tests=[TESTS] * 2, log_metric=m.__setitem__)
        # the poisoned worker's sample runs again on a fresh worker: the machinery's failure costs it nothing
        assert r == [1.0, 1.0] and m["code_sandbox/errors"] == 0.0 and f.pool.restarts == 1
        assert m["code_sandbox/infra_errors"] == 0.0
        want = "RLIMIT_AS" if role == "worker" else "nice 0 -> 10"
        assert f"the {role}'s limits, affinity or priority changed" in caplog.text and want in caplog.text
        if role == "worker":  # its candidate could not set its own (higher) limit: it died before its lockdown
            assert "exited with 70 before its lockdown was complete" in caplog.text
        r = f(prompts=[""] * 4, completions=[*RESERVED_EXITS, CORRECT], tests=[TESTS] * 4, log_metric=m.__setitem__)
        assert r == [0.0, 0.0, 0.0, 1.0] and m["code_sandbox/errors"] == 0.0 and f.pool.restarts == 1
    finally:
        f.close()


# ---------------------------------------------------------------- class 5 (OS): per-pool ids, reclaiming, bounded cleanup
HOST = r'''
import json, os, sys
from reward_plugins.code_sandbox import code_sandbox
f = code_sandbox(num_workers=2, timeout=3.0)
f.pool.start()
score = f(prompts=[""], completions=["def add(a, b):\n    return a + b\n"], tests=[["assert add(1, 2) == 3"]])
workers = [slot[1] for slot in f.pool._idle.queue]
print(json.dumps({"pid": os.getpid(), "uids": f.pool.uids, "cgroups": [d for w in workers for d in w.cgroups],
                  "claim": getattr(getattr(f.pool, "claim", None), "cgroups", []), "dir": f.pool._dir, "score": score}),
      flush=True)
sys.stdin.read()  # hold the pool until told to go
f.close()
'''


def _host(*prefix):
    """A trainer process with its own pool (``prefix``: e.g. a new PID namespace) -> (process, what it holds)."""
    import json
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    p = subprocess.Popen([*prefix, sys.executable, "-c", HOST], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    assert line, "the host process did not start its pool"
    return p, json.loads(line)


def _done(p):
    p.stdin.close()
    assert p.wait(timeout=60) == 0


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/unshare"), reason="PID namespaces: root and unshare(1)")
def test_pools_of_two_hosts_that_are_both_pid_1_share_nothing():
    """Two trainers in their own PID namespaces are both pid 1: their sandbox uids, cgroups and
    code dirs must still differ (the old code derived uids and cgroup names from the pid)."""
    ns = ("/usr/bin/unshare", "--pid", "--fork", "--kill-child")
    (a, ia), (b, ib) = _host(*ns), _host(*ns)
    try:
        assert ia["pid"] == ib["pid"] == 1 and ia["score"] == ib["score"] == [1.0]
        assert not set(ia["uids"]) & set(ib["uids"])
        assert not set(ia["cgroups"] + ia["claim"]) & set(ib["cgroups"] + ib["claim"])
        assert ia["dir"] != ib["dir"]
        if os.path.isdir("/sys/fs/cgroup/pids"):
            assert len(ia["cgroups"]) == len(ib["cgroups"]) == 4  # memory and pids, two workers
    finally:
        _done(a)
        _done(b)
    assert not any(os.path.exists(d) for d in ia["cgroups"] + ib["cgroups"] + [ia["dir"], ib["dir"]])


def test_what_a_sigkilled_host_left_is_reclaimed_at_the_next_start_and_nothing_of_a_live_one():
    """A host killed with SIGKILL leaves its cgroups and code dir; the next pool to start removes
    them (their lock is free: provably dead), and leaves those of a live host alone."""
    import signal

    victim, iv = _host()
    keeper, ik = _host()
    try:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        left = iv["cgroups"] + iv["claim"] + [iv["dir"]]
        assert all(os.path.exists(d) for d in left)  # what the old code left for good
        f = code_sandbox(num_workers=1, timeout=3.0)
        try:
            assert f(prompts=[""], completions=[CORRECT], tests=[TESTS]) == [1.0]
            assert [d for d in left if os.path.exists(d)] == []
            assert all(os.path.exists(d) for d in ik["cgroups"] + ik["claim"] + [ik["dir"]])
        finally:
            f.close()
    finally:
        _done(keeper)
    assert not any(os.path.exists(d) for d in ik["cgroups"] + ik["claim"] + [ik["dir"]])


FLOOD = "import os\ni = 0\nwhile True:\n    os.mkdir('d%d' % i)\n    i += 1\n"  # the slowest kind to remove
LOOKS_FOR_LEFTOVERS = "import os\nleft = os.listdir('.')\ndef add(a, b):\n    return a + b if not left else a - b\n"


@pytest.mark.parametrize("path", ["values", "io"])
def test_a_file_flood_costs_its_worker_not_the_next_samples_time(path):
    """A sample that fills its scratch dir until its timeout: the cleanup stops at its budget, the
    worker is replaced (the kernel drops its tmpfs at once) and the sample counts as an error; the
    host's time for it stays near the timeout (the old cleanup took several times the timeout), and
    the samples after it, on the same slot, are scored correctly in a clean dir."""
    import time

    timeout = 1.5
    f = code_sandbox(num_workers=1, timeout=timeout)
    try:
        f.pool.start()
        m = {}
        t = time.monotonic()
        if path == "io":
            r = f(prompts=[""], completions=[FLOOD], io_tests=[[{"input": "", "output": ""}] * 2], log_metric=m.__setitem__)
        else:
            r = f(prompts=[""], completions=[FLOOD], tests=[TESTS], log_metric=m.__setitem__)
        took = time.monotonic() - t
        # its worker is replaced, the sample run again on a fresh one (which it floods again), then the control
        # sample passes: a sample that breaks its worker, a wrong answer (plugin.attribute)
        assert r == [0.0] and m["code_sandbox/errors"] == 1.0 and m["code_sandbox/infra_errors"] == 0.0
        assert f.pool.restarts == 2
        budget = 2 * (timeout * (2 if path == "io" else 1) + 2 * 0.5) + 1.0  # twice: timeouts, cleanup budgets; slack
        assert took < budget, took
        r = f(prompts=[""] * 3, completions=[LOOKS_FOR_LEFTOVERS, WRONG, CORRECT], tests=[TESTS] * 3)
        assert r == [1.0, 0.0, 1.0] and f.pool.restarts == 2
    finally:
        f.close()
