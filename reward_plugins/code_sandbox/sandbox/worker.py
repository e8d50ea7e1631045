"""Fork server: the program that runs inside the sandbox, started by the host (``host/pool.py``) as

    python -I -S -B CODE_DIR CTRL_FD ISOLATION LIMITS_JSON

CODE_DIR holds this folder (``code_sandbox/sandbox/``) under its package path, and a
``__main__.py`` that calls :func:`main` (``host.launcher.install_sandbox_code``). Run as a directory, it is the one
entry ``-I`` leaves on ``sys.path`` (the directory of a script is not). Importing this module
does nothing but import: everything the worker sets up for itself happens in :func:`main`.

It never reads sample data: each request arrives as a small header (``<mode> <number of tests>``;
the limits came once, on the command line) plus file descriptors (memfds with the program / the
tests / stdin, the result pipe, stdout memfds). Only
the forked children read them, after they have locked themselves down, so nothing a sample leaves
in memory can reach the next one (each untrusted child is a fresh fork of this clean process).

Roles of a child:
* candidate (A, one fork per execution): executes the untrusted program, then serves calls to
  its functions as data (``call``), or evaluates test expressions and streams their typed values
  to the host, which compares (``values``).
* tester (B, long-lived, forked once before any sample): runs the trusted test code against
  ``Remote`` proxies of A's names and writes one record per test to the result pipe, which only
  B holds. Nothing is ever forked from B, so its memory never reaches a candidate.
* program (io, one fork per test case): the untrusted program with stdin/stdout bound to memfds
  the host reads.
"""

# Stdlib that solutions use, imported once here so that a fork need not import it again. Every
# module here makes every fork and exit dearer, so only the ones common in MBPP's reference
# solutions and HumanEval's prompts and solutions (hashlib, datetime, dataclasses, decimal and
# fractions are rare there and cost more per fork than they save). Not random either: its
# after-fork reseed costs every fork page faults, and a program that needs it imports it cheaply.
# Counts and costs: docs/benchmarks.md, "Sandbox and reward design measurements".
import bisect  # noqa: E401,F401
import builtins
import io
import math  # noqa: E401,F401
import os
import select
import signal
import socket
import sys
import time

from . import layers, protocol

USAGE = "usage: python -I -S -B CODE_DIR CTRL_FD ISOLATION LIMITS_JSON (the code_sandbox pool starts this worker)"

# Set once by main() from the command line, then read by every fork (see _configure).
CTRL_FD = -1
MODE = ""  # the isolation: "bwrap" or "rlimits"
LIMITS: dict = {}  # the pool's limits: {timeout, cpu, mem, fsize, nproc}
RLIMITS: list = []
RO_PATHS: list = []
# Made by main(): the scratch dirs, the tester process, and the limits to hold (see _after_job).
SCRATCH_A = SCRATCH_B = TESTER = BASELINE = TESTER_BASELINE = None


def _configure(argv):
    """The worker's settings from its command line ``[CODE_DIR, CTRL_FD, ISOLATION, LIMITS_JSON]``."""
    global CTRL_FD, MODE, LIMITS, RLIMITS, RO_PATHS
    code_dir, ctrl_fd, MODE, limits = argv
    CTRL_FD = int(ctrl_fd)
    LIMITS = protocol.loads(limits.encode())
    RLIMITS = layers.rlimit_plan(LIMITS["mem"], LIMITS["cpu"], LIMITS["nproc"])
    RO_PATHS = sorted({"/usr", code_dir, sys.prefix, sys.base_prefix, os.path.dirname(os.__file__)})
    RO_PATHS += ["/dev/null", "/dev/urandom", "/dev/zero"]


class Scratch:
    """A fixed scratch dir per role with its Landlock ruleset built once (rules bind the dir's
    inode, so the dir is emptied between runs, not replaced). Emptying is bounded in time: a dir a
    sample filled faster than it can be emptied in ``CLEAN_BUDGET_S`` (or one that cannot be
    emptied) is this worker's last (``_PROBLEMS``: the host replaces the worker, and the kernel drops
    its whole tmpfs), rather than a cost to the next sample's time. Named at random, not after the
    pid: with isolation="rlimits" it sits in the host's /tmp, which other PID namespaces may share."""

    CLEAN_BUDGET_S = 0.5

    def __init__(self, role):
        self.role = role
        self.path = os.path.join("/tmp", f"sbx-{os.urandom(8).hex()}-{role}")
        self.ruleset = -1
        self.broken = False
        self._make()

    def _make(self):
        if os.path.lexists(self.path):
            old = self.path + f".old{time.monotonic_ns()}"
            os.rename(self.path, old)  # out of every ruleset: no later child can read it
            layers.remove_tree(old)
        os.mkdir(self.path, 0o700)
        if self.role == "a":
            os.chdir(self.path)
        if self.ruleset >= 0:
            os.close(self.ruleset)
        self.ruleset = layers.landlock_ruleset(RO_PATHS, [self.path])

    def clean(self):
        if self.broken:
            return
        try:  # the common case, cheaply: untouched (a child may chmod the dir itself: that counts)
            if os.stat(self.path).st_mode & 0o7777 == 0o700:
                with os.scandir(self.path) as entries:
                    if next(entries, None) is None:
                        return
        except OSError:
            pass
        if not layers.remove_tree(self.path, keep_top=True, deadline=time.monotonic() + self.CLEAN_BUDGET_S):
            self.broken = True
            _PROBLEMS.append(f"scratch dir {self.role} not emptied within {self.CLEAN_BUDGET_S} s")


def _child(keep, rlimits, scratch, stdin=None, stdout=None):
    """Common start of every child: own session, own scratch dir, no fds but ``keep`` (and 0-2,
    /dev/null like the worker's own, but stdin/stdout when given), all inner layers (Landlock
    before the fds are closed: its ruleset is an fd; rlimits after: NOFILE is low)."""
    if stdin is not None:
        os.dup2(stdin, 0)
    if stdout is not None:
        os.dup2(stdout, 1)
    # the worker itself works in SCRATCH_A: its forks start there
    layers.enter_layers(keep, rlimits, scratch.ruleset, None if scratch is SCRATCH_A else scratch.path, MODE)


def _read_fd(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    return b"".join(chunks)


# ---------------------------------------------------------------- candidate (untrusted)
def candidate_main(code_fd, req_fd, rep_fd):
    code = _read_fd(code_fd).decode("utf-8", errors="replace")
    ns = {"__name__": "__sandbox__", "__builtins__": builtins}
    table, ids = {}, {}

    def handle(obj):
        k = id(obj)
        if k not in ids:
            ids[k] = len(table)
            table[len(table)] = obj
        return ids[k]

    def resolve(ref):
        if type(ref) is str:
            return ns[ref]
        return table[ref]

    try:
        exec(compile(code, "<program>", "exec"), ns)
    except BaseException as e:  # noqa: BLE001 - anything the program does is its own failure
        protocol.send_frame(rep_fd, {"load_error": _error(e)[0]})
        os._exit(0)
    manifest = {}
    for name, val in list(ns.items()):
        if not protocol.is_public_name(name) or len(manifest) >= protocol.MAX_NAMES:
            continue  # the tester takes public names only (protocol.manifest)
        if isinstance(val, type(os)):
            mod = getattr(val, "__name__", "")
            if type(mod) is str and all(protocol.is_public_name(p) for p in mod.split(".")):
                manifest[name] = {"m": mod}
        elif callable(val):
            manifest[name] = {"f": 1}
        else:
            try:
                manifest[name] = {"v": protocol.encode(val)}
            except Exception:  # noqa: BLE001
                pass
    protocol.send_frame(rep_fd, {"names": manifest})
    while True:
        try:
            req = protocol.recv_frame(req_fd, trusted=True)  # from the tester
        except EOFError:
            os._exit(0)
        try:
            target = resolve(req["r"])
            if "g" in req:
                out = getattr(target, req["g"])
            else:
                args = protocol.decode(req["a"], resolve)
                kwargs = protocol.decode(req["k"], resolve)
                out = target(*args, **kwargs)
            reply = {"v": protocol.encode(out, handle)}
        except BaseException as e:  # noqa: BLE001
            reply = {"e": _error(e)}
        try:
            protocol.send_frame(rep_fd, reply)
        except ValueError as e:  # the value's frame is too large
            protocol.send_frame(rep_fd, {"e": _error(e)})


def _error(e) -> list:
    """An exception of the program, as the data the tester re-raises as protocol.CandidateError."""
    name = type(e).__name__
    try:
        message = str(e)[:200]
    except BaseException:  # noqa: BLE001 - a program's __str__ may raise
        message = ""
    return [name if type(name) is str and name.isascii() and name.isidentifier() else "Exception", message]


def values_main(payload_fd, result_fd):
    """Return-value tests: evaluate each test's call and send its typed value; the host, which
    alone holds the expectations, judges. Nothing here is a verdict. The payload is a first line
    ``each`` (every call its own test: each record goes out at once, so that what ran before a
    timeout still counts) or ``one`` (the calls form one test, a check(): the records go out
    together, and a call that raises ends it), the calls one per line, a NUL (which Python source
    cannot contain), then the program."""
    head, _, code = _read_fd(payload_fd).partition(b"\0")
    mode, *exprs = head.decode("utf-8").split("\n")
    code = code.decode("utf-8", errors="replace")
    ns = {"__name__": "__sandbox__", "__builtins__": builtins}
    try:
        exec(compile(code, "<program>", "exec"), ns)
    except BaseException:  # noqa: BLE001
        os.write(result_fd, protocol.dumps({"flag": "load_error"}) + b"\n")
        os._exit(0)
    out = []
    for i, src in enumerate(exprs):
        try:
            rec = {"i": i, "v": protocol.encode(eval(compile(src, f"<test {i}>", "eval"), ns))}
        except BaseException:  # noqa: BLE001
            rec = {"i": i, "x": 1}
        if mode == "each":
            protocol._write_all(result_fd, protocol.dumps(rec) + b"\n")
            continue
        out.append(protocol.dumps(rec) + b"\n")
        if "x" in rec:
            break
    protocol._write_all(result_fd, b"".join(out))
    os._exit(0)


# ---------------------------------------------------------------- tester (trusted test code)
class CandidateGone(Exception):
    pass


class Conn:
    """The tester's end of one job's channel to the candidate. Every reply is schema-checked
    (``protocol.reply``) and decoded to plain data and ``Remote`` proxies; an exception of the
    candidate comes back as ``protocol.CandidateError`` only. A reply outside the protocol sets
    ``void`` (the sample scores 0 as an error) and ends the conversation."""

    def __init__(self, req_fd, rep_fd):
        self.req_fd, self.rep_fd, self.dead, self.void = req_fd, rep_fd, False, False

    def _round(self, msg):
        if self.dead:
            raise CandidateGone("candidate process is gone")
        try:
            protocol.send_frame(self.req_fd, msg)
            return protocol.decode(protocol.reply(protocol.recv_frame(self.rep_fd)), self.remote)
        except (EOFError, OSError):
            self.dead = True
            raise CandidateGone("candidate process is gone") from None
        except protocol.ProtocolError:
            self.dead = self.void = True
            raise CandidateGone("candidate broke the protocol") from None

    def remote(self, ref):
        return protocol.Remote(ref, self)

    def call(self, ref, args, kwargs):
        return self._round({"r": ref, "a": protocol.encode(list(args)), "k": protocol.encode(dict(kwargs))})

    def getattr(self, ref, name):
        return self._round({"r": ref, "g": name})


# stdlib modules the candidate's names may not bring into the tester (they act when imported)
_NO_IMPORT = frozenset({"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "webbrowser"})


def _stdlib_module(name):
    """The real module ``name`` when it is a public top-level stdlib module, else None."""
    if name not in sys.stdlib_module_names or name in _NO_IMPORT or name.startswith("_"):
        return None
    try:
        return __import__(name)
    except Exception:  # noqa: BLE001
        return None


def candidate_globals(entries, conn) -> dict:
    """The test code's globals from the candidate's (schema-checked) names: a ``Remote`` for a
    callable, plain data for a value. A builtin's name is never taken from the candidate, and the
    name of a stdlib module always means the real module, so that the candidate cannot stand in
    for ``range``, ``all`` or ``math.isclose`` in the test code. ``__builtins__`` is set last."""
    g = {"__name__": "__test__"}
    for name, kind, payload in entries:
        if hasattr(builtins, name):
            continue
        if name in sys.stdlib_module_names:
            mod = _stdlib_module(name)
            if mod is not None:
                g[name] = mod
        elif kind == "f":
            g[name] = protocol.Remote(name, conn)
        elif kind == "m":
            mod = _stdlib_module(payload)
            if mod is not None:
                g[name] = mod
        else:
            g[name] = protocol.decode(payload, conn.remote)  # ProtocolError: the caller voids
    g["__builtins__"] = builtins
    return g


def run_tests(tests_fd, result_fd, req_fd, rep_fd):
    """One job: the trusted test code, in fresh globals, against ``Remote`` proxies of the
    candidate's names; one record per test on ``result_fd`` (which only this process holds). A
    candidate that breaks the protocol (its names or a reply outside the schema) voids the
    sample: a ``void`` flag, after which no record counts."""
    spec = protocol.loads_trusted(_read_fd(tests_fd))  # from the host
    conn = Conn(req_fd, rep_fd)
    try:
        entries = protocol.manifest(protocol.recv_frame(rep_fd))
        g = candidate_globals(entries or [], conn) if spec["kind"] == "asserts" else None
    except (EOFError, OSError):
        entries, g = None, candidate_globals([], conn)
    except protocol.ProtocolError:
        os.write(result_fd, protocol.dumps({"flag": "void"}) + b"\n")
        return
    if entries is None:
        os.write(result_fd, protocol.dumps({"flag": "load_error"}) + b"\n")
    try:
        _run_spec(spec, g, conn, result_fd)
    finally:
        conn.dead = True  # a proxy kept by test code must not reach the next job's channel (same fd numbers)
    os.write(result_fd, protocol.dumps({"flag": "void" if conn.void else "end"}) + b"\n")


def _run_spec(spec, g, conn, result_fd):
    """The test code of one job in globals ``g``: asserts (one record each) or a check() (one record)."""
    if spec["kind"] == "asserts":
        try:
            exec(compile(spec.get("setup") or "", "<setup>", "exec"), g)
            tests = enumerate(spec["asserts"])
        except BaseException:  # noqa: BLE001 - broken setup: every test fails
            tests = ()
        for i, src in tests:
            try:
                exec(compile(src, f"<test {i}>", "exec"), g)
                ok = True
            except BaseException:  # noqa: BLE001
                ok = False
            os.write(result_fd, protocol.record(i, ok))
    else:  # "check": HumanEval-style test code defining check(candidate)
        # The candidate gives the test code its entry point and nothing else: every other name comes from the
        # trusted prelude (the row's helpers, constants and imports: prelude.py) or the test code itself. The
        # globals are this process's own dict, which the candidate (another process, reached as data only) cannot
        # write, whatever it does to its own globals or builtins.
        entry = spec["entry_point"]
        g = {"__name__": "__test__", "__builtins__": builtins}
        try:
            exec(compile(spec.get("prelude") or "", "<trusted prelude>", "exec"), g)
            g[entry] = protocol.Remote(entry, conn)  # after the prelude: a helper that calls it calls the candidate's
            g.pop("check", None)  # only the test code's own check() may run
            exec(compile(spec["test"], "<test>", "exec"), g)
            g["check"](protocol.Remote(entry, conn))
            ok = True
        except BaseException:  # noqa: BLE001
            ok = False
        os.write(result_fd, protocol.record(0, ok))


def tester_loop(sock_fd):
    """The tester process: long-lived (one per worker, forked before any sample, never forked
    from), it runs trusted test code only and receives each job's four fds from the fork server,
    answering ``done`` when the job's records are written and its fds closed. Candidates are
    forks of the clean fork server, never of this process, so what a job leaves here is
    unreachable to later samples. What a job could leave for the next one's test code is kept
    out too: fresh globals per job, files removed, and a job that imported a module (test code,
    or a stdlib module named by the candidate) is this tester's last (``last``: it exits). A
    tester that hangs is killed and replaced."""
    sock = socket.socket(fileno=sock_fd)
    modules = set(sys.modules)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 64, 8)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)
        try:
            if len(fds) == 4:
                run_tests(*fds)
        except BaseException:  # noqa: BLE001 - a failed job only fails its own tests
            pass
        for f in fds:
            try:
                os.close(f)
            except OSError:
                pass
        layers.remove_tree(".", keep_top=True)  # files the test code wrote stay out of the next job
        if set(sys.modules) != modules:  # a job imported something (the candidate's names may ask
            sock.send(b"last")  # for any stdlib module): retire, so that no import outlives its job
            os._exit(0)
        sock.send(b"done")


# ---------------------------------------------------------------- io program (untrusted)
def program_main(code_fd):
    code = _read_fd(code_fd).decode("utf-8", errors="replace")
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="replace")
    status = 0
    try:
        exec(compile(code, "<program>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as e:
        status = 0 if e.code is None or e.code == 0 else 1
    except BaseException:  # noqa: BLE001
        status = 1
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001
        status = 1
    os._exit(status)


# ---------------------------------------------------------------- fork server
def _fork(fn, *args):
    pid = os.fork()
    if pid == 0:
        try:
            fn(*args)
        except BaseException:  # noqa: BLE001
            pass
        os._exit(70)  # before the lockdown: _note_exit tells; after it, the filter refuses 70 (-> SIGSEGV)
    return pid


# Why this worker must not serve another sample, found during the current job (see ``_after_job``).
_PROBLEMS: list = []


def _note_exit(status):
    """A child's wait status: exiting with a status that only the worker's own code can use
    (``layers.RESERVED_EXIT_STATUSES``, refused to sandboxed code by the seccomp filter) means it
    failed before its lockdown was complete: an internal error, never the program's failure."""
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) in layers.RESERVED_EXIT_STATUSES:
        _PROBLEMS.append(f"a child exited with {os.WEXITSTATUS(status)} before its lockdown was complete")
    return status


def _wait_one(pid, deadline):
    """Wait for ``pid`` to exit until ``deadline``, killing it then. -> (timed_out, wait status)."""
    fd = os.pidfd_open(pid)
    try:
        left = deadline - time.monotonic()
        timed_out = left <= 0 or not select.select([fd], [], [], left)[0]
        if timed_out:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)
    return timed_out, _note_exit(os.waitpid(pid, 0)[1])


class Tester:
    """The fork server's handle on its tester process (see ``tester_loop``)."""

    RECYCLE_AFTER = 500  # jobs; a fresh tester bounds what test code can accumulate
    GRACE_S = 2.0  # after a timeout, how long the tester may take to finish the job (generous: a loaded machine)

    def __init__(self, limits):
        life = (limits["cpu"] + 1) * self.RECYCLE_AFTER  # CPU over its whole life
        self.rlimits = layers.rlimit_plan(limits["mem"], life, limits["nproc"])
        self.pid, self.sock, self.jobs = None, None, 0

    def ensure(self):
        if self.pid is not None and self.jobs < self.RECYCLE_AFTER:
            return self
        self.stop()
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

        def t():
            _child([there.fileno()], self.rlimits, SCRATCH_B)
            import random  # noqa: E401,F401 - test code uses them; nothing forks from here
            tester_loop(there.fileno())

        self.pid = _fork(t)
        layers.apply_rlimits(self.rlimits, self.pid)  # as the tester does too: they hold from here on (_after_job)
        there.close()
        self.sock, self.jobs = here, 0
        return self

    def stop(self):
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(self.pid, 0)
        self.sock.close()
        self.pid = self.sock = None
        SCRATCH_B.clean()

    def send(self, fds) -> bool:
        self.jobs += 1
        try:
            socket.send_fds(self.sock, [b"job"], fds)
            return True
        except OSError:
            self.stop()
            return False

    def wait_done(self, deadline) -> str:
        """"done" when the tester finished the job before ``deadline``, else "timeout", or
        "died" (the tester is reaped and replaced at the next job)."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            ready, _, _ = select.select([self.sock], [], [], left)
            if ready:
                msg = self.sock.recv(16)
                if msg != b"done":
                    self.stop()  # b"last": it retires after this job; b"": it died
                return "done" if msg in (b"done", b"last") else "died"


def run_call(fds, n, budget=None):
    """Any assert/check() tests: the candidate (a fresh fork) serves its names as data to the
    tester process, which alone holds the result pipe. Ends when the tester is done or at the
    deadline; the candidate never outlives the call."""
    code_fd, tests_fd, result_fd = fds
    a_req_r, a_req_w = os.pipe()  # tester -> candidate
    a_rep_r, a_rep_w = os.pipe()  # candidate -> tester
    job_fds = [tests_fd, result_fd, a_req_w, a_rep_r]
    sent = TESTER.ensure().send(job_fds) or TESTER.ensure().send(job_fds)  # once more to a fresh tester

    def a():
        _child([code_fd, a_req_r, a_rep_w], RLIMITS, SCRATCH_A)
        candidate_main(code_fd, a_req_r, a_rep_w)

    pa = _fork(a)
    for f in (code_fd, tests_fd, result_fd, a_req_r, a_req_w, a_rep_r, a_rep_w):
        os.close(f)
    state = TESTER.wait_done(time.monotonic() + LIMITS["timeout"]) if sent else "died"
    os.kill(pa, signal.SIGKILL)
    _note_exit(os.waitpid(pa, 0)[1])
    if state == "died":  # the trusted tester process never dies by itself
        _PROBLEMS.append("the tester process died")
    if state == "timeout" and TESTER.wait_done(time.monotonic() + Tester.GRACE_S) != "done":
        TESTER.stop()  # the candidate's death normally ends a blocked tester; this one hangs
    TESTER.ensure()  # a tester that retired or died is replaced now, not in the next call's time
    SCRATCH_A.clean()
    return _CALL_REPLY[state]


def run_values(fds, n, budget=None):
    payload_fd, result_fd = fds

    def a():
        _child([payload_fd, result_fd], RLIMITS, SCRATCH_A)
        values_main(payload_fd, result_fd)

    pa = _fork(a)
    for f in fds:
        os.close(f)
    timed_out, _ = _wait_one(pa, time.monotonic() + LIMITS["timeout"])
    SCRATCH_A.clean()
    return _VALUES_REPLY[timed_out]


def run_io(fds, n, budget):
    """The io cases of one sample (or of one part of it), each in a fresh fork, within ``budget`` wall seconds
    in all: a case runs until ``timeout`` or the end of the budget, whichever is first, and once a case has timed
    out (or the budget is spent) the rest are not run (they fail)."""
    code_fd, ins, outs = fds[0], fds[1 : 1 + n], fds[1 + n : 1 + 2 * n]
    cases = []
    end = time.monotonic() + budget
    for i in range(n):
        if cases and (cases[-1] is None or cases[-1][1]) or time.monotonic() >= end:
            cases.append(None)
            continue

        def p():
            _child([code_fd], RLIMITS, SCRATCH_A, stdin=ins[i], stdout=outs[i])  # noqa: B023 - forked at once
            program_main(code_fd)

        timed_out, st = _wait_one(_fork(p), min(end, time.monotonic() + LIMITS["timeout"]))
        SCRATCH_A.clean()
        cases.append([os.waitstatus_to_exitcode(st), timed_out])
    for f in fds:
        os.close(f)
    return protocol.dumps({"cases": cases, "timeout": any(c is None or c[1] for c in cases)})


# replies, encoded once: the loop between two forks should write as few pages as it can
_VALUES_REPLY = {t: protocol.dumps({"timeout": t}) for t in (False, True)}
# A dead tester is not reported here: it is one of _PROBLEMS, so the reply becomes {"internal": ...} (main).
_CALL_REPLY = {s: protocol.dumps({"timeout": s == "timeout"}) for s in ("done", "timeout", "died")}
_RUN = {b"values": run_values, b"call": run_call, b"io": run_io}


def _after_job():
    """Why this worker must not serve another sample, or None. Besides what the job noted
    (``_PROBLEMS``): no job may change this worker's or its tester's rlimits, CPU affinity, nice
    value or scheduling (the seccomp filter already refuses every syscall that could, on another
    process); should one ever, every later child would inherit it and fail quietly."""
    try:
        for who, pid, want in (("worker", 0, BASELINE), ("tester", TESTER.pid, TESTER_BASELINE)):
            now = layers.process_state(pid) if pid is not None else want
            if now != want:
                _PROBLEMS.append(f"the {who}'s limits, affinity or priority changed: {layers.state_changes(want, now)}")
    except OSError as e:
        _PROBLEMS.append(f"state check failed: {e}")
    return "; ".join(_PROBLEMS) or None


def main(argv=None):
    """Serve the host until it closes the channel. ``argv``: ``sys.argv`` (see the module docstring)."""
    global SCRATCH_A, SCRATCH_B, TESTER, BASELINE, TESTER_BASELINE
    argv = sys.argv if argv is None else argv
    if len(argv) != 4:
        sys.stderr.write(USAGE + "\n")
        raise SystemExit(2)
    _configure(argv)
    os.environ.clear()
    # Programs and test code may print and parse ints of any size (a correct factorial(2000) has 5736
    # digits). The 4300-digit limit guards decimal conversion of untrusted strings; every byte a
    # candidate sends is read by protocol.parse, which accepts at most 19 decimal digits per number
    # (bigger ints travel as hex), so lifting it here, for this process and every fork, opens nothing.
    sys.set_int_max_str_digits(0)
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    sock = socket.socket(fileno=CTRL_FD)
    os.dup2(null, 0)  # children keep these (and 2, below) unless a test gives its own stdin/stdout
    os.dup2(null, 1)
    SCRATCH_A, SCRATCH_B = Scratch("a"), Scratch("b")
    layers.no_new_privs()  # for this process and every fork: Landlock and seccomp need it
    layers.apply_rlimits(layers.worker_rlimit_plan(LIMITS["fsize"]))
    layers.seccomp_prepare()
    TESTER = Tester(LIMITS)
    BASELINE = layers.process_state()
    TESTER_BASELINE = layers.with_rlimits(BASELINE, TESTER.rlimits)
    import gc

    gc.collect()
    gc.freeze()  # children's collections skip the worker's objects: fewer copy-on-write faults
    os.dup2(null, 2)  # set up: from here on, nothing of ours (nor any child) writes to the host's log file
    TESTER.ensure()  # forked now, before any sample data exists
    caps = {"ready": True, "uid": os.getuid(), "landlock": layers.landlock_abi(), "seccomp": layers.X86_64}
    sock.send(protocol.dumps(caps))
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 256, 256)
        except OSError:
            msg = b""
        if not msg:  # the host is gone or closed us: leave nothing behind
            TESTER.stop()
            for s in (SCRATCH_A, SCRATCH_B):
                layers.remove_tree(s.path)
            return
        try:  # b"<mode> <number of tests> <io: ms for all cases>"; the limits are the pool's, from the command line
            mode, n, *ms = msg.split(b" ")
            budget = min(int(ms[0]) / 1000, LIMITS["sample"]) if ms else LIMITS["sample"]
            reply = _RUN[mode](fds, int(n), budget)
            why = _after_job()
            if why:  # the host logs it, counts the sample as an error and replaces this worker
                reply = protocol.dumps({"internal": why})
        except Exception as e:  # noqa: BLE001
            reply = protocol.dumps({"internal": f"{type(e).__name__}: {e}"})
        sock.send(reply)
