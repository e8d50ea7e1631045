"""Hostile suite for the code_sandbox reward.

Every program below is a WRONG solution of ``add(a, b)`` that tries a trick; many are written
"correct only if the attack worked", so a score of 0 proves the attack failed. Each runs in a
batch beside a correct solution that must still score 1.0, and the host must be left unchanged.
Nothing here talks to any address off this machine.
"""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

pytest.importorskip("reward_plugins.code_sandbox")
from reward_plugins.code_sandbox import code_sandbox  # noqa: E402
from reward_plugins.code_sandbox.host import launcher  # noqa: E402
from reward_plugins.code_sandbox.sandbox import worker  # noqa: E402

pytestmark = pytest.mark.skipif(not (sys.platform == "linux"), reason="Linux sandbox")

CORRECT = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]
CORRECT_IF_OK = "\ndef add(a, b):\n    return a + b if ok else a - b\n"


def _attempt(body: str) -> str:
    """A program whose ``add`` is right only if ``body`` ran without raising (the attack worked)."""
    return "ok = False\ntry:\n" + textwrap.indent(textwrap.dedent(body), "    ") + "\n    ok = True\nexcept BaseException:\n    pass\n" + CORRECT_IF_OK


@pytest.fixture(scope="module")
def reward():
    f = code_sandbox(num_workers=2, timeout=2.0, memory_mb=512, max_output_bytes=1 << 20)
    f.pool.start()
    yield f
    f.close()


def _uids(pool):
    return set(pool.uids)


DEBUG = {}  # pid -> /proc/pid/stat head, to say what a leftover process was


def _procs_of(uids):
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid in uids:
                    out.append(pid)
                    DEBUG[pid] = open(f"/proc/{pid}/stat").read()[:80]  # for the failure message
            except OSError:
                pass
    return sorted(out)


CHECK_VALUES = "def check(candidate):\n" + "".join(f"    {t.replace('add(', 'candidate(')}\n" for t in TESTS)
CHECK = "def check(candidate):\n    for a, b, want in [(1, 2, 3), (-1, 1, 0), (10, 5, 15)]:\n        assert candidate(a, b) == want\n"
PATHS = {  # the verdict paths: values judged on the host (asserts, check()) or the tester process (asserts, check())
    "values": dict(tests=[TESTS, TESTS]),
    "tester": dict(tests=[TESTS, TESTS], test_setup_code=["SETUP = 1", "SETUP = 1"]),
    "check_values": dict(test=[CHECK_VALUES, CHECK_VALUES], entry_point=["add", "add"]),
    "check": dict(test=[CHECK, CHECK], entry_point=["add", "add"]),
}


def test_paths_are_what_they_say(reward):
    modes = {name: reward.job(CORRECT, 0, {k: v[:1] for k, v in kw.items()}).mode for name, kw in PATHS.items()}
    assert modes == {"values": "values", "tester": "call", "check_values": "values", "check": "call"}


def _ppid(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]
    except OSError:
        return None


def _shape(pids):
    """(the processes that are not testers, how many there are): per worker bwrap -> fork server
    -> tester. A tester may be replaced between samples (new pid), nothing else may change."""
    testers = {p for p in pids if _ppid(_ppid(p)) in pids}
    return sorted(set(pids) - testers), len(pids)


def _testers(pool):
    pids = _procs_of(_uids(pool))
    return sorted(set(pids) - set(_shape(pids)[0]))


def _score(reward, hostile, path="values"):
    before = _shape(_procs_of(_uids(reward.pool)))
    restarts = reward.pool.restarts
    r = reward(prompts=["", ""], completions=[hostile, CORRECT], **PATHS[path])
    assert r == [0.0, 1.0]
    assert reward.pool.restarts == restarts, "a sandbox worker was killed from inside"
    assert _shape(_procs_of(_uids(reward.pool))) == before, "a process was left running"
    return r


HOSTILE = {
    "fork_bomb": "import os\nfor _ in range(2000):\n    try:\n        os.fork()\n    except OSError:\n        pass\ndef add(a, b):\n    return a - b\n",
    "fork_bomb_in_call": "import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n",
    "thread_bomb": "import threading, time\nts = []\nfor _ in range(5000):\n    try:\n        t = threading.Thread(target=time.sleep, args=(100,)); t.start(); ts.append(t)\n    except BaseException:\n        break\ndef add(a, b):\n    return a - b\n",
    "infinite_loop": "def add(a, b):\n    while True:\n        pass\n",
    "sleep": "import time\ndef add(a, b):\n    time.sleep(100)\n    return a + b\n",
    "alloc_10GB": _attempt("x = bytearray(10 * 1024**3)"),
    "huge_file": _attempt("with open('big', 'wb') as f:\n    for _ in range(1 << 14):\n        f.write(b'x' * (1 << 16))"),
    "output_flood": "import sys\ndef add(a, b):\n    while True:\n        sys.stdout.write('x' * 65536)\n        sys.stderr.write('y' * 65536)\n",
    "read_shadow": _attempt("assert open('/etc/shadow').read()"),
    "read_environ": _attempt("import os\nassert os.environ and any(os.environ.values())"),
    "read_proc": _attempt("import os\nassert os.listdir('/proc/self/fd')"),
    "write_usr": _attempt("open('/usr/pwned-code-sandbox', 'w').write('x')"),
    "write_worker_code": _attempt(f"import sys\nopen(sys.modules[{worker.__name__!r}].__file__, 'a').write('x')"),
    "write_sandbox_main": _attempt("import sys\nopen(sys.modules['__main__'].__file__, 'a').write('x')"),
    "kill_parent": _attempt("import os\nos.kill(os.getppid(), 9)"),
    "kill_all": _attempt("import os\nos.kill(-1, 9)"),
    "kill_all_libc": _attempt("import ctypes\nassert ctypes.CDLL(None).kill(-1, 9) == 0"),
    "sys_exit_before_tests": "import sys\nsys.exit(0)\ndef add(a, b):\n    return a - b\n",
    "os_exit_before_tests": "import os\nos._exit(0)\ndef add(a, b):\n    return a - b\n",
    "fake_success_marker": (
        "import os, sys\nrec = b''.join(b'{\"i\":%d,\"ok\":true}\\n' % i for i in range(3)) + b'{\"flag\":\"end\"}\\n'\n"
        "print(rec.decode()); sys.stderr.write(rec.decode())\n"
        "for fd in range(0, 256):\n    try:\n        os.write(fd, rec)\n    except OSError:\n        pass\n"
        "def add(a, b):\n    return a - b\n"
    ),
    "eq_always_true": "class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\ndef add(a, b):\n    return Yes()\n",
    "int_subclass_eq": "class I(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\ndef add(a, b):\n    return I(a - b)\n",
    "monkeypatch_builtins_unittest": (
        "import builtins, unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
        "builtins.AssertionError = type('X', (Exception,), {})\nbuiltins.isinstance = lambda *a: True\n"
        "import sys\nsys.modules['builtins'].__dict__['abs'] = lambda x: 0\n"
        "def add(a, b):\n    return a - b\n"
    ),
    "getframe_walk": (
        "import sys, gc\ndef add(a, b):\n    f = sys._getframe()\n    while f is not None:\n"
        "        for k, v in list(f.f_locals.items()):\n            if isinstance(v, list):\n                v[:] = [True] * len(v)\n"
        "            if isinstance(v, dict):\n                v.update(ok=True, passed=True, result='passed')\n"
        "        f = f.f_back\n    for o in gc.get_objects():\n        if isinstance(o, list) and o and o[0] is False:\n            o[:] = [True] * len(o)\n"
        "    return a - b\n"
    ),
    "patch_harness_modules": (
        "import sys\nfor m in list(sys.modules.values()):\n    for name in ('record', 'send_frame', 'encode'):\n"
        "        if hasattr(m, name):\n            try:\n                setattr(m, name, lambda *a, **k: None)\n            except Exception:\n                pass\n"
        "def add(a, b):\n    return a - b\n"
    ),
    "double_forked_daemon": _attempt(
        "import os, subprocess\ntry:\n    subprocess.Popen(['/bin/sleep', '1000'])\nexcept OSError:\n    pid = os.fork()\n    if pid == 0:\n        os.setsid()\n        if os.fork():\n            os._exit(0)\n        import time\n        time.sleep(1000)"
    ),
    "raise_limits": _attempt("import resource\nresource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))"),
    "ptrace_neighbors": _attempt(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nassert any(libc.ptrace(16, p, 0, 0) == 0 for p in range(1, 200))"
    ),
    "run_as_root": _attempt("import os\nassert os.getuid() == 0 or os.geteuid() == 0"),
    "nested_user_namespace": _attempt("import os\nos.unshare(os.CLONE_NEWUSER)"),
    "huge_return_value": "def add(a, b):\n    return 10 ** 100000\n",
    "opaque_object_truthy": "def add(a, b):\n    return object()\n",
    "system_exit_in_call": "def add(a, b):\n    raise SystemExit(0)\n",
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_scores_zero_beside_correct(reward, name, path):
    _score(reward, HOSTILE[name], path)


def test_suite_size():
    assert len(HOSTILE) + 4 >= 25  # plus the four stateful / host-side tests below


def test_tester_outlives_candidate_timeouts_and_is_replaced_when_it_hangs():
    """The long-lived tester: a candidate that hangs is killed and the tester goes on; test code
    that hangs (here on purpose) costs the tester, and a fresh one serves the next sample."""
    f = code_sandbox(num_workers=1, timeout=1.0)
    try:
        ok = dict(test=[CHECK], entry_point=["add"])
        assert f(prompts=[""], completions=[CORRECT], **ok) == [1.0]
        (tester,) = _testers(f.pool)
        assert f(prompts=[""], completions=[HOSTILE["sleep"]], **ok) == [0.0]
        assert _testers(f.pool) == [tester]
        hang = "def check(candidate):\n    assert candidate(1, 2) == 3\n    while True:\n        pass\n"
        assert f(prompts=[""], completions=[CORRECT], test=[hang], entry_point=["add"]) == [0.0]
        (fresh,) = _testers(f.pool)
        assert fresh != tester
        assert f(prompts=[""], completions=[CORRECT], **ok) == [1.0]
        assert f.pool.restarts == 0
    finally:
        f.close()


def test_a_job_that_imports_retires_the_tester(reward):
    """A module imported during one sample's tests (the candidate's names may ask for any stdlib
    module) never stays for the next sample: that tester retires and a fresh one takes over. A check() gets
    the candidate's entry point only, so there the candidate's imports never reach the tester at all."""
    ok = dict(test=[CHECK], entry_point=["add"])
    asserts = {"tests": [["assert add(1, 2) == 3"]] * 2, "test_setup_code": ["X = 1"] * 2}  # the tester, with names
    assert reward(prompts=[""] * 2, completions=[CORRECT] * 2, **asserts) == [1.0, 1.0]
    testers = _testers(reward.pool)
    importing = "import wave, this\n" + CORRECT.strip("`").removeprefix("python\n")
    assert reward(prompts=[""] * 2, completions=[importing] * 2, **asserts) == [1.0, 1.0]
    after = _testers(reward.pool)
    assert len(after) == len(testers) and not set(after) & set(testers)
    assert reward(prompts=[""], completions=[CORRECT], **ok) == [1.0]
    assert _testers(reward.pool) == after  # no import this time: the testers stay
    assert reward(prompts=[""] * 2, completions=[importing] * 2, test=[CHECK] * 2, entry_point=["add"] * 2) == [1.0, 1.0]
    assert _testers(reward.pool) == after  # check(): the candidate's modules are not the test code's


def test_socket_to_local_listener_gets_nothing(reward):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = b"\0code-sandbox-test-" + uuid.uuid4().hex.encode()
    abstract.bind(name)
    abstract.listen(1)
    abstract.settimeout(0.5)
    hostile = _attempt(
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'leak')"
    ).replace("ok = False\n", "ok = False\nimport socket\ntry:\n    u = socket.socket(socket.AF_UNIX); u.connect(" + repr(name) + "); u.send(b'leak')\nexcept OSError:\n    pass\n", 1)
    try:
        _score(reward, hostile)
        for s in (srv, abstract):
            with pytest.raises(socket.timeout):
                s.accept()
    finally:
        srv.close()
        abstract.close()


def test_write_outside_scratch_leaves_host_unchanged(reward, tmp_path):
    os.chmod(tmp_path, 0o777)  # even a world-writable host dir must stay untouched
    target = tmp_path / "pwned"
    _score(reward, _attempt(f"open({str(target)!r}, 'w').write('x')"))
    _score(reward, _attempt("open('../pwned', 'w').write('x')\nopen('/tmp/pwned', 'w').write('x')"))
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_state_left_for_the_next_sample(reward):
    """Files in scratch/tmp and System V shared memory left by one sample must not reach the next."""
    leave = (
        "import ctypes, os\nfor p in ('answer', '/tmp/answer', '/dev/shm/answer'):\n    try:\n        open(p, 'w').write('1')\n    except OSError:\n        pass\n"
        "libc = ctypes.CDLL(None, use_errno=True)\nid_ = libc.shmget(0x5EC12E7, 4096, 0o1666)\n"
        "if id_ >= 0:\n    addr = libc.shmat(id_, None, 0)\n    ctypes.memmove(addr, b'ANSWER', 6)\n"
        "for _ in range(1500):\n    try:\n        os.mkdir('d')\n        os.chdir('d')\n    except OSError:\n        break\n"
        "os.chmod('.', 0o500)\nos.chdir('/')\n"  # deep dirs, locked: the scratch dir must still come back empty and writable
        "def add(a, b):\n    return a - b\n"
    )
    pick = _attempt(
        "import ctypes, os\nfound = any(os.path.exists(p) for p in ('answer', '/tmp/answer', '/dev/shm/answer', '../answer'))\n"
        "libc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\nid_ = libc.shmget(0x5EC12E7, 4096, 0o666)\n"
        "if id_ >= 0:\n    found = found or ctypes.string_at(libc.shmat(id_, None, 0), 6) == b'ANSWER'\nassert found"
    )
    for _ in range(2):  # both workers see a "leave" sample before a "pick" sample
        reward(prompts=[""] * 2, completions=[leave, leave], tests=[TESTS, TESTS])
    _score(reward, pick)
    _score(reward, pick)
    writer = "open('scratch-file', 'w').write('x')\n" + CORRECT.strip("`").removeprefix("python\n")
    for _ in range(2):
        reward(prompts=[""] * 2, completions=[leave, leave], tests=[TESTS, TESTS])
        assert reward(prompts=[""] * 2, completions=[writer, writer], tests=[TESTS, TESTS]) == [1.0, 1.0]


def test_previous_sample_data_not_in_memory(reward):
    """A sample scans its own address space (libc write() to a pipe: EFAULT instead of a crash on
    unmapped pages) for a value that only the previous sample's tests contained."""
    secret_tests = ["assert add(7777777, 1234) == 7779011"]
    scan = _attempt(
        """
        import ctypes, gc, os
        libc = ctypes.CDLL(None, use_errno=True)
        libc.write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        r, w = os.pipe()
        part = bytes([55, 55, 55, 57, 48, 49])  # the first six bytes of the secret; the last is checked as an int
        found = False
        bases = {id(o) & ~0xFFF for o in gc.get_objects()[:: max(1, len(gc.get_objects()) // 64)]}
        seen = set()
        for base in sorted(bases):
            for page in range(base - (1 << 22), base + (1 << 22), 4096):
                if page in seen or page <= 0:
                    continue
                seen.add(page)
                if libc.write(w, page, 4096) != 4096:
                    continue
                buf = os.read(r, 4096)
                k = buf.find(part)
                while k != -1:
                    if k + 6 < len(buf) and buf[k + 6] == 49:
                        found = True
                    k = buf.find(part, k + 1)
        assert found
        """
    )
    tests_here = ["assert add(7777777, 1234) == 7779011", "assert add(1, 2) == 3"]
    for _ in range(2):
        r = reward(prompts=[""] * 2, completions=[CORRECT, CORRECT], tests=[secret_tests, secret_tests])
        assert r == [1.0, 1.0]
    r = reward(prompts=[""] * 2, completions=[scan, CORRECT], tests=[tests_here, tests_here])
    assert r == [0.0, 1.0]
    # positive control: the same scanner inside the sandbox does find the value when it is there
    planted = "keep = 'x' + str(7779000 + 11) + 'y'\n" + scan
    assert reward(prompts=[""], completions=[planted], tests=[tests_here]) == [1.0]


def test_sandbox_has_only_loopback_and_ordinary_uid(reward):
    """The outer layer as started for a worker, with a probe instead of the fork server."""
    pool = reward.pool
    argv = launcher.worker_command("bwrap", pool.python, pool._dir, 0)
    argv = argv[: argv.index(pool.python)] + [
        pool.python, "-I", "-S", "-c",
        "import os, socket; print(socket.if_nameindex(), os.getuid(), sorted(os.listdir('/')), dict(os.environ))",
    ]  # fmt: skip
    uid = pool.uids[0]
    ids = dict(user=uid, group=uid, extra_groups=[]) if uid is not None else {}
    out = subprocess.run(argv, env={"SECRET": "x"}, capture_output=True, text=True, timeout=30, **ids)
    assert out.returncode == 0, out.stderr
    assert "[(1, 'lo')]" in out.stdout
    assert "SECRET" not in out.stdout and "'proc'" not in out.stdout and "'root'" not in out.stdout and "'etc'" not in out.stdout
    assert f" {uid} " in out.stdout or uid is None


def test_many_runs_leave_no_zombies(reward):
    progs = [CORRECT, HOSTILE["kill_parent"], HOSTILE["fork_bomb"], HOSTILE["sys_exit_before_tests"]] * 250
    before = _procs_of(_uids(reward.pool))
    r = reward(prompts=[""] * len(progs), completions=progs, tests=[TESTS] * len(progs))
    assert r == [1.0, 0.0, 0.0, 0.0] * 250
    after = _procs_of(_uids(reward.pool))
    gone = [p for p in before if p not in after]
    info = {p: DEBUG.get(p) for p in gone}
    assert after == before, info
    zombies = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                stat = open(f"/proc/{pid}/stat").read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] == "Z" and int(fields[1]) == os.getpid():
                zombies.append(pid)
    assert zombies == []
    assert threading.active_count() < 50


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/sys/fs/cgroup/pids"), reason="cgroup v1 layer needs root")
def test_workers_are_capped_by_cgroups_and_never_root(reward):
    reward.pool.start()
    for slot in list(reward.pool._idle.queue):
        w = slot[1]
        assert len(w.cgroups) == 2, "memory and pids cgroups"
        mem = [d for d in w.cgroups if "/memory/" in d][0]
        pids = [d for d in w.cgroups if "/pids/" in d][0]
        assert int(open(f"{mem}/memory.limit_in_bytes").read()) <= 4 << 30
        assert int(open(f"{pids}/pids.max").read()) <= 256
        members = open(f"{pids}/cgroup.procs").read().split()
        assert str(w.proc.pid) in members and len(members) >= 2
        assert all(os.stat(f"/proc/{p}").st_uid != 0 for p in members)


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = {int(k) for k in f.read().split()}
        except OSError:
            continue
        todo.extend(kids - found)
        found |= kids
    return found


def test_a_worker_whose_bubblewrap_is_killed_dies_with_it(reward):
    """Only bubblewrap's own process killed (not its session, not its cgroups): the sandboxed worker under it dies
    too (``--die-with-parent``) instead of running on unseen; the pool replaces it and scores exactly."""
    pool = reward.pool
    slot = pool._idle.get()
    try:
        worker = pool._ensure(slot)
        inside = _descendants(worker.proc.pid)
        assert inside, "no sandboxed process under bubblewrap"
        os.kill(worker.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") and _state(p) != "Z" for p in inside):
            time.sleep(0.05)
        assert not [p for p in inside if os.path.exists(f"/proc/{p}") and _state(p) != "Z"]
    finally:
        pool._idle.put(slot)
    assert reward(None, [CORRECT] * 4, tests=[TESTS] * 4) == [1.0] * 4


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
