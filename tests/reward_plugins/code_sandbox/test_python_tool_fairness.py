"""What one rollout of the Python tool can and cannot do to another: time, CPU, every other limit, and the metrics.

* Time: the host's I/O loop reads every interpreter's reply as it arrives, so a rollout that forges a reply frame,
  keeps its main thread busy and then sends a cell larger than the pipe (which its interpreter never reads) costs
  only its own cell its own time: honest siblings dispatched in the same round, before or after it, and a later
  rollout are charged their own cells' time and get their replies (the tester's scenario, with ``timeout=2,
  rollout_timeout=10``); a spawn the zygote does not answer costs only its own rollout's cell; a forked host gets an
  I/O loop of its own; and a property over cell sizes (past the pipe's 64 KiB) and sleeps, beside hostile rollouts.
* CPU (as root, with a cgroup v1 cpu controller): each interpreter runs in a cpu cgroup of its own from before its
  first cell, with the default weight and a one-core quota, so the threads of one rollout together get at most
  one core, however many it starts.
* Every limit is per rollout (as root, with cgroup v1 pids and memory controllers): each interpreter has pids and
  memory cgroups of its own, outside the server's; a rollout holding every thread it may, or (three of them, beside a
  server whose own cgroup takes less than their sum) all their memory and files, leaves a sibling, a later rollout and
  its own next rollout theirs; without cgroups, the documented fallback (threads shared by the uid; a reset waits
  for the killed interpreter); and a ``hypothesis`` property: any sequence of cells that each take all of one limit
  (threads, memory, disk, fds, CPU), then an honest probe using each limit at once, in the same round and after.
* Metrics: a refused call is counted once in ``stats``, through ``python`` alone and through the trainer's
  dispatch path.
"""

import os
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

from reward_plugins.code_sandbox import PythonEnvironment  # noqa: E402
from reward_plugins.code_sandbox.host import interpreter_server, launcher  # noqa: E402
from trl_rlvr.rollouts.tool_turn import tool_turns  # noqa: E402

PIPE = 1 << 16  # a pipe's default capacity on Linux
SLACK = 0.35  # a cell's charged time past its own sleep: its start, the reply's way back (2 shared, busy cores)

# The attack: the cell finds its interpreter's reply pipe, writes a whole reply frame the host takes for the
# cell's reply (the host stops the interpreter on it), then disarms its alarm and spins: when the rollout's next
# cell comes, its interpreter is resumed still spinning in this one and never reads the new cell.
FORGE_AND_SPIN = (
    "import os, signal, sys\n"
    "f = sys._getframe()\n"
    "while f.f_code.co_name != 'repl_loop':\n"
    "    f = f.f_back\n"
    "body = b'oforged\\n'\n"
    "os.write(f.f_locals['reply_fd'], len(body).to_bytes(4, 'big') + body)\n"
    "signal.setitimer(signal.ITIMER_REAL, 0)\n"
    "while True:\n"
    "    pass\n"
)


def big_cell(chars: int, tail: str = "1") -> str:
    """A cell of about ``chars`` characters (a string literal), ending in ``tail``."""
    return f"pad = '{'p' * max(0, chars - 40)}'\n{tail}"


def sleep_cell(seconds: float, chars: int, value: int) -> tuple[str, str]:
    """A cell that sleeps ``seconds`` and is ``chars`` long -> (code, its reply)."""
    return big_cell(chars, f"import time\ntime.sleep({seconds!r})\n{value}"), f"{value}\n"


@pytest.fixture()
def envs():
    made = []

    def make(**kw):
        e = PythonEnvironment(**{"memory_mb": 512, **kw})
        made.append(e)
        e.reset()
        return e

    yield make
    for e in made:
        e._close()


def trl_round(batch):
    """One tool turn as RLVRTrainer runs it: every rollout's pending call sent ahead by the turn's first call
    (``tool_turns``), then TRL's calls one rollout after another -> [(reply, seconds into the round)]."""
    tool_dicts = [{"python": e.python} for e, _ in batch]
    completions = [[{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}]}] for _, code in batch]  # fmt: skip
    t = time.monotonic()
    out = []
    with tool_turns([e for e, _ in batch], completions):
        for tools, messages in zip(tool_dicts, completions):
            call = messages[-1]["tool_calls"][0]["function"]
            reply = tools[call["name"]](**call["arguments"])
            out.append((reply, time.monotonic() - t))
            messages.append({"role": "tool", "name": "python", "content": reply})
    return out


def arm(hostile) -> None:
    """The hostile rollout's first call: its forged reply comes back at once, its interpreter left spinning."""
    spent = hostile._spent
    assert hostile.python(FORGE_AND_SPIN) == "forged\n"
    assert hostile._spent - spent < SLACK


# ------------------------------------------------------------------------------------------------ time
@pytest.mark.parametrize("where,rounds", [
    ("last", 1),
    pytest.param("last", 4, marks=pytest.mark.slow),
    pytest.param("first", 4, marks=pytest.mark.slow),
    pytest.param("middle", 4, marks=pytest.mark.slow),
])  # fmt: skip
def test_a_stalled_rollout_costs_its_siblings_and_a_later_rollout_nothing(envs, where, rounds):
    """The tester's scenario: ``timeout=2, rollout_timeout=10``; each victim's cells sleep 0.5 s a round (2.0 s in
    all over 4 rounds); the hostile rollout stalls its interpreter every round with a cell past the pipe's capacity,
    sent after, before or between the victims' cells."""
    options = dict(timeout=2.0, rollout_timeout=10.0, max_code_chars=4 * PIPE)
    victims = [envs(**options) for _ in range(3)]
    hostile = envs(**{**options, "rollout_timeout": 60.0})  # its own budget outlasts its four stalls
    for v in victims:
        assert v.python("n = 0") == "(no output)"
    for k in range(rounds):
        arm(hostile)
        cells = [(v, f"import time\ntime.sleep(0.5)\nn += 1\n{10 * k + i} + n") for i, v in enumerate(victims)]
        at = {"last": len(cells), "first": 0, "middle": 1}[where]
        cells.insert(at, (hostile, big_cell(2 * PIPE)))
        spent = [v._spent for v in victims]
        out = trl_round(cells)
        hostile_reply, _ = out.pop(at)
        assert "timed out after 2 s; the interpreter was restarted" in hostile_reply  # its own cell: its own time
        assert [r for r, _ in out] == [f"{10 * k + i + k + 1}\n" for i in range(len(victims))]
        for v, before in zip(victims, spent):
            assert 0.5 <= v._spent - before < 0.5 + SLACK, f"charged {v._spent - before:.2f} s for a 0.5 s cell"
        if where == "last":  # answered in TRL's order before the hostile one: nobody waited on its stall
            assert out[-1][1] < 0.5 + 2 * SLACK
    for v in victims:  # 0.5 s of cells a round: with 4 rounds, 8 s of the 10 s budget are left, not "used up"
        assert v._spent < 0.5 * rounds + rounds * SLACK
        assert v.python("n") == f"{rounds}\n"
        assert v.stats == {"calls": rounds + 2, "errors": 0, "timeouts": 0, "restarts": 0, "printed_errors": 0}
    later = envs(**options)  # a later rollout, on the same server
    assert later.python("import time\ntime.sleep(0.2)\n6 * 7") == "42\n" and later._spent < 0.2 + SLACK
    hostile.reset()  # and the hostile instance's own next rollout
    assert hostile.python("6 * 7") == "42\n"


def test_a_rollout_that_never_reads_its_cell_is_charged_its_own_deadline(envs):
    """The stalled rollout's cell is its own time, cut at its deadline; its budget runs out, nobody else's."""
    e = envs(timeout=1.0, rollout_timeout=4.0, max_code_chars=4 * PIPE)
    arm(e)
    t = time.monotonic()
    reply = e.python(big_cell(3 * PIPE))
    assert "timed out after 1 s" in reply and 2.0 <= e._spent < 2.0 + SLACK
    assert time.monotonic() - t < 2.0 + SLACK and e.stats["restarts"] == 1


def test_a_spawn_the_zygote_does_not_answer_costs_only_its_own_cell(envs):
    """The zygote stopped (from outside: a stand-in for one slowed down) while a rollout's fresh interpreter waits for
    it: that rollout's first cell ends at its own deadline; a sibling's cell in the same round, before or after it,
    is read and charged as it arrives."""
    import signal

    sibling = envs(timeout=1.0, rollout_timeout=30.0)
    assert sibling.python("1") == "1\n"
    pid = launcher.pidfd_pid(sibling._interpreter.pidfd)
    zygote = int(next(line.split()[1] for line in open(f"/proc/{pid}/status") if line.startswith("PPid:")))
    os.kill(zygote, signal.SIGSTOP)
    try:
        fresh = envs(timeout=1.0, rollout_timeout=30.0)  # its spawn request waits in the stopped zygote's socket
        before = sibling._spent
        out = trl_round([(fresh, "1"), (sibling, "import time\ntime.sleep(0.3)\n2")])
        assert out[1][0] == "2\n" and 0.3 <= sibling._spent - before < 0.3 + SLACK
        assert "restarted" in out[0][0] and 2.0 <= fresh._spent < 2.0 + SLACK  # its own deadline, timeout + 1 s
    finally:
        os.kill(zygote, signal.SIGCONT)
    assert fresh.python("6 * 7") == "42\n" and sibling.python("3") == "3\n"


FORKED_HOST = r'''
import os, sys
from reward_plugins.code_sandbox import PythonEnvironment
from reward_plugins.code_sandbox.host import interpreter_server
e = PythonEnvironment(timeout=2.0)
e.reset()
e._dispatch_call("python", {"code": "import time\ntime.sleep(0.5)\n1"})  # the loop thread has a cell in flight
pid = os.fork()
if pid == 0:  # a forked host (a dataloader worker): the parent's loop thread is not here
    c = PythonEnvironment(timeout=2.0)
    c.reset()
    ok = c.python("import time\ntime.sleep(0.2)\n2 + 2") == "4\n" and c._spent < 0.2 + 0.35
    ok = ok and interpreter_server._io_loop().pid == os.getpid()
    c._close()
    interpreter_server._close_servers()
    os._exit(0 if ok else 1)
reply = e.python("import time\ntime.sleep(0.5)\n1")
_, status = os.waitpid(pid, 0)
print(reply == "1\n" and e._spent < 0.5 + 0.35, os.waitstatus_to_exitcode(status), flush=True)
'''


def test_a_forked_host_gets_its_own_io_loop_and_the_parents_cells_go_on():
    import subprocess
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    out = subprocess.run([sys.executable, "-c", FORKED_HOST], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["True", "0"], out.stdout + out.stderr[-2000:]


@pytest.fixture(scope="module")
def crowd():
    """Three honest rollouts and a hostile one, reused across examples (reset per example)."""
    options = dict(timeout=1.0, rollout_timeout=600.0, memory_mb=2048, max_code_chars=5 * PIPE)
    made = [PythonEnvironment(**options) for _ in range(4)]
    yield made
    for e in made:
        e._close()


C_THREADS = (  # threads that compute in C without the GIL (hashing a large buffer), for ``seconds`` of wall time
    "import hashlib, threading, time\nbuf = bytes(1 << 22)\nstop = time.monotonic() + {seconds}\n"
    "def burn():\n    while time.monotonic() < stop:\n        hashlib.sha256(buf).digest()\n"
    "ts = [threading.Thread(target=burn) for _ in range({n})]\nc0, w0 = time.process_time(), time.monotonic()\n"
    "[t.start() for t in ts]\n[t.join() for t in ts]\nround((time.process_time() - c0) / (time.monotonic() - w0), 2)"
)


# What the hostile rollout of the property does in the round -> (its cell, a check of its own reply). Its cells run
# under the crowd's ``timeout=1.0``.
FLOOD_FRAME = (  # a reply frame header claiming 1 GiB, then as much as the pipe takes, then a spin
    "import os, signal, sys\nf = sys._getframe()\nwhile f.f_code.co_name != 'repl_loop':\n    f = f.f_back\n"
    "fd = f.f_locals['reply_fd']\nos.set_blocking(fd, False)\ntry:\n    os.write(fd, (1 << 30).to_bytes(4, 'big'))\n"
    "    while True:\n        os.write(fd, b'x' * 65536)\nexcept OSError:\n    pass\n"
    "signal.setitimer(signal.ITIMER_REAL, 0)\nwhile True:\n    pass\n"
)
HOSTILE_ROUND = {
    "stall": (big_cell(2 * PIPE), lambda r: "timed out after 1 s" in r),  # after ``arm``: never reads this cell
    "threads": (C_THREADS.format(seconds=0.6, n=64), lambda r: r.strip().replace(".", "", 1).isdigit()),
    "flood": (FLOOD_FRAME, lambda r: "broke its reply channel" in r),
}


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cells=st.lists(st.tuples(st.sampled_from([0.0, 0.05, 0.2, 0.4]),
                             st.sampled_from([10, 1000, PIPE - 100, PIPE + 1, 3 * PIPE, 4 * PIPE + 17])),
                   min_size=1, max_size=3),
    hostile=st.none() | st.tuples(st.sampled_from(sorted(HOSTILE_ROUND)), st.integers(0, 3)),
)  # fmt: skip
def test_each_cell_is_charged_its_own_time_whatever_its_size_and_its_siblings(crowd, cells, hostile):
    """Honest cells of any size and sleep, in one dispatched round with or without a hostile rollout at any place
    (stalling its interpreter, running 64 threads in C, or flooding its reply pipe): each honest cell's reply is its
    own and its charge its own sleep."""
    *honest, bad = crowd
    batch = []
    for i, (seconds, chars) in enumerate(cells):
        honest[i].reset()
        code, want = sleep_cell(seconds, chars, i)
        batch.append((honest[i], code, want, seconds))
    if hostile is not None:
        kind, at = hostile
        bad.reset()
        if kind == "stall":
            arm(bad)
        code, ok = HOSTILE_ROUND[kind]
        batch.insert(min(at, len(batch)), (bad, code, ok, None))
    out = trl_round([(e, code) for e, code, _, _ in batch])
    for (e, _, want, seconds), (reply, _) in zip(batch, out):
        if callable(want):
            assert want(reply), reply
            continue
        assert reply == want
        assert seconds <= e._spent < seconds + SLACK, f"charged {e._spent:.2f} s for {seconds} s"


# ------------------------------------------------------------------------------------------------ CPU
def _cgroups_here(*controllers: str) -> bool:
    return os.geteuid() == 0 and all(os.path.isdir(launcher.cgroup_base(c)) for c in controllers)


def _cpu_cgroups_here() -> bool:
    return _cgroups_here("cpu")


def own_cgroup(env, parent: str) -> str:
    """``env``'s interpreter's cgroup in the controller whose per-interpreter cgroups are made in ``parent``."""
    (path,) = [d for d in env._interpreter.cgroups if os.path.dirname(d) == parent]
    return path


@pytest.mark.skipif(not _cpu_cgroups_here(), reason="needs root and a cgroup v1 cpu controller")
def test_each_interpreter_runs_in_a_cpu_cgroup_of_its_own_from_before_its_first_cell(envs):
    a, b = envs(), envs()
    for e in (a, b):
        assert e.python("1") == "1\n"
    server = interpreter_server._SERVERS["bwrap"]
    ca, cb = (own_cgroup(e, server.cpu_dir) for e in (a, b))
    assert ca and cb and ca != cb
    for e, cg in ((a, ca), (b, cb)):
        pid = launcher.pidfd_pid(e._interpreter.pidfd)
        assert open(os.path.join(cg, "cgroup.procs")).read().split() == [str(pid)]
        assert open(os.path.join(cg, "cpu.shares")).read().strip() == "1024"
        quota = int(open(os.path.join(cg, "cpu.cfs_quota_us")).read())
        period = int(open(os.path.join(cg, "cpu.cfs_period_us")).read())
        assert quota == interpreter_server.CPU_QUOTA_CORES * period
    # threads a cell starts are in it too (the whole thread group moved before any cell ran)
    a.python("import threading, time\nts = [threading.Thread(target=time.sleep, args=(2,)) for _ in range(4)]\n"
             "[t.start() for t in ts]")  # fmt: skip
    tids = open(os.path.join(ca, "tasks")).read().split()
    assert len(tids) == 5
    old = list(a._interpreter.cgroups)
    a.reset()  # the old interpreter is killed; its cgroups go once it has exited (at a later spawn or close)
    deadline = time.monotonic() + 5
    while any(os.path.isdir(d) for d in old) and time.monotonic() < deadline:
        time.sleep(0.05)
        envs()._close()
    assert not any(os.path.isdir(d) for d in old)


TOOL_HOST = r'''
import json, sys
from reward_plugins.code_sandbox import PythonEnvironment
envs = [PythonEnvironment() for _ in range(2)]
for e in envs:
    e.reset()
    assert e.python("1") == "1\n"
print(json.dumps([d for e in envs for d in e._interpreter.cgroups]), flush=True)
sys.stdin.read()
'''


@pytest.mark.skipif(not _cpu_cgroups_here(), reason="needs root and a cgroup v1 cpu controller")
def test_a_sigkilled_hosts_interpreter_cgroups_are_reclaimed_at_the_next_start():
    import json
    import signal
    import subprocess
    import tempfile
    from pathlib import Path

    from reward_plugins.code_sandbox.host.claim import reclaim_stale

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    p = subprocess.Popen([sys.executable, "-c", TOOL_HOST], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=env)  # fmt: skip
    try:
        left = json.loads(p.stdout.readline())
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    assert len(left) >= 2 and all(os.path.isdir(d) for d in left)
    reclaim_stale(tempfile.gettempdir())  # what every pool's start runs first (``PoolClaim.acquire``)
    assert not any(os.path.isdir(d) for d in left)



@pytest.mark.slow
@pytest.mark.skipif(not _cpu_cgroups_here() or (os.cpu_count() or 1) < 2,
                    reason="needs root, a cgroup v1 cpu controller and 2 cores")  # fmt: skip
def test_a_rollouts_threads_together_get_at_most_its_quota_of_the_cores(envs):
    """8 threads hashing without the GIL would use every free core; the interpreter's quota holds them to one
    (where other load leaves less than a core free, the bound holds trivially)."""
    e = envs(timeout=5.0)
    cores = float(e.python(C_THREADS.format(seconds=1.5, n=8)))
    assert 0.1 < cores <= interpreter_server.CPU_QUOTA_CORES * 1.1, f"{cores} cores used"


# ------------------------------------------------------------------------------------------------ every limit
# Cells that take all of one per-rollout limit and keep it (the interpreter is stopped between calls, holding it).
THREADS_HOG = (  # as many threads as it may start, each parked on an event that never comes
    "import threading\nthreading.stack_size(1 << 16)\nev = threading.Event()\nheld = []\ntry:\n"
    "    while len(held) < 4096:\n        t = threading.Thread(target=ev.wait)\n        t.start()\n"
    "        held.append(t)\nexcept RuntimeError:\n    pass\nlen(held)"
)
MEMORY_HOG = (  # its tmpfs nearly full (files are memory too), then its whole address space, touched
    "chunk = b'\\x02' * (1 << 20)\nfor k in range(4):\n    with open(f'mem{k}', 'wb') as f:\n"
    "        for _ in range(15):\n            f.write(chunk)\nblocks = []\ntry:\n    while True:\n"
    "        blocks.append(b'\\x01' * (8 << 20))\nexcept MemoryError:\n    blocks.pop()\nlen(blocks)"
)
DISK_HOG = (  # every byte, then every inode, of its tmpfs
    "k = 0\nchunk = b'\\x03' * (1 << 20)\ntry:\n    while True:\n        with open(f'big{k}', 'wb') as f:\n"
    "            for _ in range(15):\n                f.write(chunk)\n        k += 1\nexcept OSError:\n    pass\ntry:\n    while True:\n        open(f'empty{k}', 'wb').close()\n"
    "        k += 1\nexcept OSError:\n    pass\nk"
)
FDS_HOG = (  # every fd
    "import os\nfds = []\ntry:\n    while True:\n        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
    "except OSError:\n    pass\nlen(fds)"
)
CPU_HOG = C_THREADS.format(seconds=0.5, n=8)  # every core it can get, in C without the GIL
HOGS = {"threads": THREADS_HOG, "memory": MEMORY_HOG, "disk": DISK_HOG, "fds": FDS_HOG, "cpu": CPU_HOG}

# A modest use of each limit at once: 128 MiB touched, 128 threads alive together, an 8 MiB file, 32 fds. (The memory
# first: each thread's malloc arena reserves 64 MiB of address space, which glibc does without once none is left.)
PROBE = (
    "import os, threading\nblock = b'\\x04' * (128 << 20)\nthreading.stack_size(1 << 16)\nev = threading.Event()\n"
    "ts = [threading.Thread(target=ev.wait) for _ in range(128)]\n[t.start() for t in ts]\nev.set()\n"
    "[t.join() for t in ts]\nwith open('probe', 'wb') as f:\n"
    "    f.write(b'\\x05' * (8 << 20))\nfds = [os.open('/dev/null', os.O_RDONLY) for _ in range(32)]\n"
    "[os.close(fd) for fd in fds]\nprint(len(ts), len(block) >> 20, os.path.getsize('probe') >> 20, len(fds))\n"
    "os.unlink('probe')"
)
PROBE_REPLY = "128 128 8 32\n"


@pytest.mark.skipif(not _cgroups_here("pids", "memory"), reason="needs root and cgroup v1 pids and memory controllers")
def test_each_interpreter_has_pids_and_memory_cgroups_of_its_own(envs):
    """Outside the server's cgroup (which holds the zygote), each capped for itself: ``max_processes`` threads,
    its address space + its tmpfs + the kernel's slack; and no uid-wide RLIMIT_NPROC of the tool's."""
    a, b = envs(memory_mb=512), envs(memory_mb=256)
    server = interpreter_server._SERVERS["bwrap"]
    tool = {d for d in server.server.cgroups}
    for e in (a, b):
        assert e.python("1") == "1\n"
        pid = launcher.pidfd_pid(e._interpreter.pidfd)
        pids, mem = own_cgroup(e, server.pids_dir), own_cgroup(e, server.memory_dir)
        for d in (pids, mem):
            assert open(os.path.join(d, "cgroup.procs")).read().split() == [str(pid)]
        assert not any(str(pid) in open(os.path.join(d, "cgroup.procs")).read().split() for d in tool)
        assert int(open(os.path.join(pids, "pids.max")).read()) == server.max_processes
        want = (e.limits.memory_mb << 20) + interpreter_server.SCRATCH_BYTES + launcher.MEMORY_CGROUP_SLACK
        assert int(open(os.path.join(mem, "memory.limit_in_bytes")).read()) == want
        nproc = next(line for line in open(f"/proc/{pid}/limits") if line.startswith("Max processes"))
        assert int(nproc.split()[2]) > server.max_processes  # left at the host's, not the tool's 256
    assert own_cgroup(a, server.pids_dir) != own_cgroup(b, server.pids_dir)


@pytest.mark.skipif(not _cgroups_here("pids"), reason="needs root and a cgroup v1 pids controller")
def test_a_rollout_holding_all_its_threads_leaves_a_sibling_and_a_later_rollout_theirs(envs):
    """The attack: a cell starts every thread it may and returns, its interpreter holding them; a sibling, a
    rollout started after it, and the hostile instance's own next rollout each start 128 threads."""
    hostile, sibling = envs(), envs()
    held = int(hostile.python(THREADS_HOG))
    assert sibling.python(PROBE) == PROBE_REPLY
    assert envs().python(PROBE) == PROBE_REPLY
    assert interpreter_server._SERVERS["bwrap"].max_processes - 2 <= held < 4096  # its own cap, not unbounded
    hostile.reset()
    assert hostile.python(PROBE) == PROBE_REPLY


@pytest.fixture()
def small_server(monkeypatch):
    """A server of this test's own with a small memory budget (``memory_mb=256``: 448 MiB for the server's cgroup),
    the process's shared one for the test."""
    server = interpreter_server.InterpreterServer("bwrap", memory_mb=256)
    monkeypatch.setitem(interpreter_server._SERVERS, "bwrap", server)
    yield server
    server.close()


@pytest.mark.skipif(not _cgroups_here("memory"), reason="needs root and a cgroup v1 memory controller")
def test_rollouts_holding_all_their_memory_never_meet_a_cap_they_share(small_server, envs):
    """Three rollouts each hold their whole address space (256 MiB) and 60 MiB of files, together twice what the
    server's cgroup takes: each is held to its own cap, so none is OOM-killed, nor is the zygote."""
    crowd = [envs(memory_mb=256) for _ in range(3)]
    held = [int(e.python(MEMORY_HOG)) for e in crowd]
    assert all(n >= 20 for n in held), held  # >= 160 MiB each, plus 60 MiB of tmpfs
    assert [e.python("len(blocks)") for e in crowd] == [f"{n}\n" for n in held]
    assert all(e.stats["restarts"] == 0 for e in crowd)
    assert envs(memory_mb=256).python("6 * 7") == "42\n"  # the zygote still forks


@pytest.mark.skipif(not _cgroups_here("memory"), reason="needs root and a cgroup v1 memory controller")
def test_a_memory_cgroup_is_drained_before_it_is_removed(tmp_path):
    """The page cache a process read first stays charged to its memory cgroup after it exits, and would keep the
    cgroup alive after its removal (the kernel has 65535 memory cgroup ids; the tool makes one per rollout):
    ``cgroup_rmdir`` reclaims it first."""
    import subprocess

    data = tmp_path / "data"  # on a disk, not a tmpfs: its pages can be dropped and read again
    data.write_bytes(os.urandom(8 << 20))
    fd = os.open(data, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    path = launcher.memory_cgroup(os.path.join(launcher.cgroup_base("memory"), f"code_sandbox-drain-{os.getpid()}"),
                                  64 << 20)  # fmt: skip
    usage = os.path.join(path, "memory.usage_in_bytes")
    try:
        subprocess.run(["/bin/sh", "-c", f'echo $$ > "{path}/cgroup.procs" && exec cat "{data}" > /dev/null'],
                       check=True)  # fmt: skip
        assert int(open(usage).read()) >= 8 << 20  # charged to it, with no process left in it
        launcher._drain_memory(path)
        assert int(open(usage).read()) < 1 << 20
    finally:
        assert launcher.cgroup_rmdir(path)


@pytest.fixture()
def server_without_cgroups(monkeypatch):
    """A server started as where no cgroup can be made (not root, no cgroup v1 controller): the fallbacks."""
    monkeypatch.setattr(launcher, "_make_cgroups", lambda *args, **kwargs: [])
    server = interpreter_server.InterpreterServer("bwrap")
    assert server.pids_dir is server.memory_dir is server.cpu_dir is None
    monkeypatch.setitem(interpreter_server._SERVERS, "bwrap", server)
    yield server
    server.close()


def threads_of(pid: int) -> int:
    """The threads of process ``pid`` (0 once it is gone)."""
    try:
        return int(next(line.split()[1] for line in open(f"/proc/{pid}/status") if line.startswith("Threads:")))
    except (FileNotFoundError, ProcessLookupError):  # reaped before or while it is read
        return 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to start a server as if it were not)")
def test_without_cgroups_threads_are_the_uids_and_a_later_rollout_gets_them_back(server_without_cgroups, envs):
    """The weaker guarantee, as documented: where no pids cgroup is made, RLIMIT_NPROC (``max_processes``) bounds the
    threads of all the server's interpreters together, so a sibling running beside a rollout that holds them all
    cannot start its own; a rollout that starts after the hostile one's ``reset`` can (``close`` waits for the killed
    interpreter to be gone)."""
    hostile, sibling = envs(), envs()
    assert sibling.python("1") == "1\n"
    held = int(hostile.python(THREADS_HOG))
    assert held < server_without_cgroups.max_processes
    assert "can't start new thread" in sibling.python(PROBE)
    pid = launcher.pidfd_pid(hostile._interpreter.pidfd)
    hostile.reset()
    assert threads_of(pid) <= 1  # exited (its leader at most a zombie until the zygote reaps it): close waited
    assert sibling.python(PROBE) == PROBE_REPLY
    assert hostile.python(PROBE) == PROBE_REPLY


@pytest.fixture(scope="module")
def pair():
    """A hostile and an honest rollout, reused across examples (reset per example)."""
    made = [PythonEnvironment(timeout=5.0, rollout_timeout=600.0, memory_mb=512) for _ in range(2)]
    yield made
    for e in made:
        e._close()


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(hogs=st.lists(st.sampled_from(sorted(HOGS)), min_size=1, max_size=3),
       last=st.sampled_from(sorted(HOGS)), first=st.booleans())  # fmt: skip
def test_no_rollout_feels_another_take_all_of_any_limit(pair, hogs, last, first):
    """A hostile rollout takes all of one limit after another (threads, memory, disk, fds: held between its calls;
    CPU: while in a call), then runs one more hog in the same dispatched round as an honest rollout's probe, which
    uses each limit at once: the probe's reply is the same as alone; then the hostile instance's next rollout runs
    the probe too (nothing of its last rollout is left to it)."""
    bad, good = pair
    bad.reset()
    good.reset()
    for name in hogs:
        bad.python(HOGS[name])  # its own reply is whatever its own limits make it
    batch = [(bad, HOGS[last]), (good, PROBE)]
    out = trl_round(batch if first else batch[::-1])
    assert out[1 if first else 0][0] == PROBE_REPLY
    assert good.stats["restarts"] == 0
    bad.reset()
    assert bad.python(PROBE) == PROBE_REPLY


# ------------------------------------------------------------------------------------------------ metrics
REFUSED = [
    ("too_long", lambda e: "x" * (e.limits.max_code_chars + 1), "errors", "error: the code has"),
    ("not_a_string", lambda e: 12, "errors", "error: code must be a string"),
]


@pytest.mark.parametrize("via_round", [False, True])
@pytest.mark.parametrize("name,code,counter,reply", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_refused_call_is_counted_once(envs, via_round, name, code, counter, reply):
    e = envs(max_code_chars=100)
    before = dict(e.stats)
    for k in range(1, 4):
        got = trl_round([(e, code(e))])[0][0] if via_round else e.python(code(e))
        assert got.startswith(reply)
        assert e.stats == {**before, counter: before[counter] + k}, e.stats
    assert e.python("1") == "1\n" and e.stats["calls"] == before["calls"] + 1


@pytest.mark.parametrize("via_round", [False, True])
def test_a_call_refused_for_a_used_up_budget_is_one_timeout(envs, via_round):
    e = envs(timeout=1.0, rollout_timeout=0.3)
    assert "this rollout's 0.3 s of run time are used up" in e.python("import time\ntime.sleep(1)")
    before = dict(e.stats)
    assert before["timeouts"] == 1 and before["restarts"] == 1
    for k in range(1, 4):
        got = trl_round([(e, "1")])[0][0] if via_round else e.python("1")
        assert got == "not run: this rollout's 0.3 s of run time are used up"
        assert e.stats == {**before, "timeouts": before["timeouts"] + k}, e.stats


def test_the_trainers_tool_metrics_count_each_refused_call_once():
    """``rlvr/tool_errors_per_rollout`` and ``rlvr/tool_timeouts_per_rollout`` (the doctor's tool error rate reads
    them), computed as the trainer computes them, after rounds run as the trainer runs them: two rollouts, one with
    three refused calls (too long, not a string, too long), one with its budget used up and two refused calls."""
    import torch

    from trl_rlvr.algorithms.metrics import tool_metrics, tool_rollout_rows

    with PythonEnvironment(max_code_chars=10) as a, PythonEnvironment(timeout=1.0, rollout_timeout=0.3) as b:
        a.reset()
        b.reset()
        completions = [[], []]
        for codes in (["x" * 11, "import time\ntime.sleep(1)"], [None, "1"], ["x" * 11, "1"]):
            for messages, (reply, _) in zip(completions, trl_round([(a, codes[0]), (b, codes[1])])):
                messages.append({"role": "tool", "name": "python", "content": reply})
        assert a.stats == {"calls": 0, "errors": 3, "timeouts": 0, "restarts": 0, "printed_errors": 0}
        assert b.stats == {"calls": 1, "errors": 0, "timeouts": 3, "restarts": 1, "printed_errors": 0}  # the cut cell, then 2 refused
        metrics = tool_metrics(torch.tensor(tool_rollout_rows(completions, [a, b]), dtype=torch.float64))
    assert metrics["rlvr/tool_errors_per_rollout"] == 1.5 and metrics["rlvr/tool_timeouts_per_rollout"] == 1.5
    assert metrics["rlvr/tool_calls_per_rollout"] == 3.0
