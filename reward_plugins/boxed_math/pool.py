"""Trusted checks with hard deadlines: a pool of long-lived worker processes, one task at a time each, a task killed
when it overruns its deadline, from any thread.

The contract: the handler is trusted code of this package (boxed_math's math-verify check); what is untrusted is its
input (a model's answer), which may make it hang or eat memory, never escape. So a worker is an ordinary
subprocess of this user, bounded in time (CPU seconds) and address space, not a sandbox. Untrusted *code* runs in
``code_sandbox``'s ``SandboxPool`` instead (bubblewrap, an unprivileged uid, Landlock, seccomp; its limits applied
inside the sandbox), whose workers are sandboxed fork servers.

Why not ``concurrent.futures``/``multiprocessing.Pool``: neither can stop one task that hangs (a sympy
evaluation of ``10^{10^{10^{10}}}`` never returns), and math-verify's own timeouts use SIGALRM, which
only works in the main thread (TRL calls reward functions from other threads in some modes). Here each
worker runs one task at a time; a worker that overruns its task's deadline is killed (SIGKILL) and
replaced, and the task is reported as ``("timeout", None)``.

* A *zygote* — one plain ``python -c`` subprocess (``ZYGOTE_PROGRAM``) — runs the ``warmup`` function
  (boxed_math: imports math-verify and runs typical checks) once, then forks the workers on request; a worker is warm
  from its first task and replacing a killed one costs a fork (milliseconds), not a Python start-up.
  No ``fork`` of the (threaded) trainer process, and unlike multiprocessing's spawn/forkserver the user's
  ``__main__`` is never re-imported (a training script without an ``if __name__ == "__main__"`` guard
  keeps working). Workers get their socket from the zygote over a Unix socket (``SCM_RIGHTS``).
* The deadline of a task starts when it is handed to a ready worker: start-up never counts as a timeout.
* Only a task's own events end it: its reply, its own deadline, its own worker's death (``("died", None)``) or,
  when the caller sets one, the batch's ``total_deadline``. No budget shared by a call (its length, how long other
  workers take to start) turns a task into a failure of the machinery. A worker that cannot start (the zygote
  cannot fork it, or it sends no hello within ``hello_timeout``) is counted in ``start_failures`` and replaced;
  after ``start_attempts`` such failures in one call no more are started, and once no worker is left the tasks
  never handed out are ``("unstarted", None)`` (none is in flight then). The caller decides what a lost task
  (``died``, ``unstarted``) means: boxed_math runs it again, then a control check (``BoxedMathReward.attribute``).
* A deadline is measured in the worker's CPU seconds (from /proc; wall seconds elsewhere), with a wall-clock cap
  of ``wall_factor`` (5) times the deadline: a loaded machine slows checks down without failing them.
* Tasks carry an affinity key (boxed_math: the gold) so that the answers of one group go to the same
  worker, which parses their gold once.
* The pool is created lazily, shared per process (:func:`get_pool`), never pickled (reward functions hold
  only their options), shut down at exit; the zygote and the workers also exit by themselves when the
  parent dies (EOF on their sockets), and the zygote's children are reaped automatically.
* Every worker runs under an address-space bound (``RLIMIT_AS``, set in the worker right after the fork;
  ``memory_limit`` bytes, ``DEFAULT_MEMORY_LIMIT`` = 1 GiB): a task whose allocation fails there (a
  ``MemoryError`` escapes the handler, or the worker's peak address space reached :data:`OOM_FRACTION` of the
  bound, so that a library that swallowed the error does not hide it) is reported as ``("oom", None)``
  and its worker exits and is replaced. The pool's memory is at most ``num_workers x memory_limit`` plus
  the zygote's (which only ever runs the trusted warm-up).
* A reply is taken only by the task it answers: each task sent carries a token ``(call, index)`` that the
  worker echoes, checked on receipt (a reply with another token is discarded). A call that ends early (an
  exception raised in the calling thread while tasks are in flight, e.g. ``KeyboardInterrupt`` or one
  raised by a signal handler or a trainer's timeout) kills the workers that were not provably idle on the
  way out (``try/finally``), so the next call starts from workers with nothing in flight. The zygote's
  control channel is a ``SOCK_SEQPACKET`` socket whose fork replies carry their request's number, so an
  interrupted fork leaves no reply to be taken by the next one.
"""

from __future__ import annotations

import atexit
import importlib
import itertools
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

_POOLS: dict[tuple, "DeadlinePool"] = {}
_POOLS_LOCK = threading.Lock()
_READY = "__ready__"

#: Default address-space bound of one worker, in bytes (1 GiB). A warmed math worker maps about 70 MB.
DEFAULT_MEMORY_LIMIT = 1 << 30
#: A task after which its worker's peak address space (``VmPeak``) reached this fraction of the bound is
#: reported as out of memory even when the handler swallowed the ``MemoryError`` (math-verify catches errors).
OOM_FRACTION = 0.9
_FORK_REQUEST = struct.Struct("!QQ")  # b"W" + (request number, memory limit in bytes; 0: none)
_FORK_REPLY = struct.Struct("!Qi")  # b"P" + (request number, pid)


def _resolve(spec: str):
    """The object a ``"module:qualname"`` spec names (imported)."""
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    for name in attr.split(".") if attr else ():
        obj = getattr(obj, name)
    return obj


def _spec(fn: Callable) -> str:
    """``fn`` as ``"module:qualname"``, the name by which the zygote (a fresh interpreter) imports it;
    checked here to lead back to ``fn``, so that a function the zygote cannot find fails at once."""
    spec = f"{getattr(fn, '__module__', None)}:{getattr(fn, '__qualname__', None)}"
    try:
        found = _resolve(spec) is fn
    except (ImportError, AttributeError):
        found = False
    if not found:
        raise ValueError(f"reward pool: {fn!r} is not a module-level function that imports back as {spec!r}")
    return spec


def _peak_address_space() -> int | None:
    """This process's peak virtual memory size (``VmPeak``) in bytes; None where /proc is unavailable."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmPeak:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _limit_memory(limit: int) -> None:
    """Bound this process's address space (``RLIMIT_AS``) to ``limit`` bytes (never above an existing hard limit)."""
    if limit <= 0:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _error_text(e: BaseException) -> str:
    try:
        return f"{type(e).__name__}: {e}"[:300]
    except BaseException:  # noqa: BLE001 - a message that cannot be formatted: its type is enough
        return type(e).__name__


def _worker_loop(conn: Connection, handler, memory_limit: int = 0) -> None:
    """Serve ``(token, payload)`` tasks: reply ``(token, (status, value))``. After an out-of-memory task the
    worker exits (a fresh one replaces it: nothing that task allocated or half-built stays behind)."""
    conn.send(_READY)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError, MemoryError):
            return
        if msg is None:
            return
        token, payload = msg
        try:
            result = ("ok", handler(payload))
        except MemoryError:
            result = ("oom", None)
        except BaseException as e:  # noqa: BLE001 - report, never die, on a bad input
            result = ("error", _error_text(e))
        if memory_limit > 0 and result[0] != "oom":
            peak = _peak_address_space()
            if peak is not None and peak >= OOM_FRACTION * memory_limit:
                result = ("oom", None)
        try:
            conn.send((token, result))
        except (EOFError, OSError, MemoryError):
            return
        if result[0] == "oom":
            return


def _zygote(ctrl_fd: int, handler_spec: str, warmup_spec: str = "") -> None:
    """Zygote main (runs in the ``python -c`` subprocess): warm up, then fork one worker per request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped automatically: no zombies
    os.dup2(2, 1)  # stray prints go to stderr
    if warmup_spec:
        try:
            _resolve(warmup_spec)()
        except Exception:  # noqa: BLE001 - a failed warm-up only costs time
            pass
    handler = _resolve(handler_spec)
    ctrl = socket.socket(fileno=ctrl_fd)
    try:
        ctrl.sendall(b"R")
    except OSError:  # the parent exited while we warmed up (e.g. on its own error): leave quietly
        return
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctrl, 64, 4)
        except OSError:
            return
        if not msg:  # the parent is gone
            return
        if not fds or msg[:1] != b"W" or len(msg) != 1 + _FORK_REQUEST.size:
            for fd in fds:
                os.close(fd)
            continue
        request, memory_limit = _FORK_REQUEST.unpack(msg[1:])
        pid = os.fork()
        if pid == 0:
            try:
                ctrl.close()
                for fd in fds[1:]:
                    os.close(fd)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _limit_memory(memory_limit)
                _worker_loop(Connection(fds[0]), handler, memory_limit)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        try:
            ctrl.sendall(b"P" + _FORK_REPLY.pack(request, pid))
        except OSError:
            return


_ZYGOTE_USAGE = "usage: python -c ZYGOTE_PROGRAM CTRL_FD HANDLER_SPEC WARMUP_SPEC (started by reward_plugins' DeadlinePool)"


def _zygote_main(argv: Sequence[str]) -> None:
    """The zygote subprocess's entry: ``argv`` = ``[CTRL_FD, HANDLER_SPEC, WARMUP_SPEC]`` (``""``: no warm-up)."""
    if len(argv) != 3:
        sys.stderr.write(_ZYGOTE_USAGE + "\n")
        raise SystemExit(2)
    _zygote(int(argv[0]), argv[1], argv[2])


#: The zygote's program (``python -c``): this module, found by its import name, runs :func:`_zygote_main`.
ZYGOTE_PROGRAM = f"import sys; from {_zygote_main.__module__} import {_zygote_main.__name__} as main; main(sys.argv[1:])"


class _Zygote:
    def __init__(self, handler_spec: str, warmup_spec: str):
        # message boundaries kept: a reply is read whole or not at all, even by a reader interrupted mid-call
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE_PROGRAM, str(child.fileno()), handler_spec, warmup_spec],
            stdin=subprocess.DEVNULL,
            env=env,
            pass_fds=(child.fileno(),),
            start_new_session=True,  # a terminal's Ctrl-C goes to the parent only
        )
        child.close()
        self.ctrl = parent
        self.ready = False  # the zygote said it finished its warm-up
        self._requests = itertools.count(1)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork_worker(self, memory_limit: int, start_timeout: float) -> tuple[int, Connection]:
        """A new worker (its pid and its end of the task socket), under ``memory_limit`` bytes of address
        space. Waits up to ``start_timeout`` for a zygote still warming up, 30 s for a ready one. Replies to
        earlier requests that were interrupted are skipped (their workers exit: their sockets are closed)."""
        request = next(self._requests)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(self.ctrl, [b"W" + _FORK_REQUEST.pack(request, max(0, memory_limit))], [theirs.fileno()])
            theirs.close()
            give_up = time.monotonic() + (30.0 if self.ready else start_timeout)
            while True:
                left = give_up - time.monotonic()
                if left <= 0:
                    raise OSError("reward worker zygote did not answer (see its stderr)")
                self.ctrl.settimeout(left)
                msg = self.ctrl.recv(64)
                if not msg:
                    raise OSError("reward worker zygote exited (see its stderr)")
                if msg == b"R":
                    self.ready = True
                elif msg[:1] == b"P" and len(msg) == 1 + _FORK_REPLY.size:
                    answered, pid = _FORK_REPLY.unpack(msg[1:])
                    if answered == request:
                        self.ready = True
                        return pid, Connection(mine.detach())
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
            self.ctrl.settimeout(None)

    def close(self) -> None:
        try:
            self.ctrl.close()  # EOF: the zygote exits
        except OSError:
            pass
        try:
            self.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(1.0)


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) used so far by process ``pid``; None where /proc is unavailable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


class _DeadlineWorker:
    def __init__(self, pid: int, conn: Connection):
        self.pid = pid
        self.conn = self.tx = conn
        self.ready = False
        self.task: int | None = None  # index of the task in flight in the current call
        self.token: tuple[int, int] | None = None  # (call, index) of the task in flight: its reply must echo it
        self.born = time.monotonic()  # its hello is due within the pool's hello_timeout of this
        self.started = 0.0
        self.cpu0: float | None = None
        self.key: Hashable = None

    def overran(self, deadline: float, wall_cap: float) -> bool:
        """The running task used ``deadline`` CPU seconds (or ``wall_cap`` wall seconds). CPU time, not wall
        time, so that a machine busy with other jobs does not turn slow-but-fine checks into timeouts."""
        wall = time.monotonic() - self.started
        if wall < deadline:
            return False
        if wall >= wall_cap or self.cpu0 is None:
            return True
        cpu = _cpu_seconds(self.pid)
        return cpu is None or cpu - self.cpu0 >= deadline

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not self.conn.closed

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.conn.close()
        except Exception:
            pass


class _Call:
    """The state of one :meth:`DeadlinePool.map` call: its tasks grouped by affinity key, their results, and the
    worker starts that failed during it (bounded: :attr:`DeadlinePool.start_attempts`)."""

    def __init__(self, number: int, tasks: Sequence[tuple[Hashable, Any]]):
        self.number = number
        self.tasks = tasks
        self.results: list[tuple[str, Any] | None] = [None] * len(tasks)
        self.remaining = len(tasks)
        self.failed_starts = 0
        self.groups: dict[Hashable, deque[int]] = {}
        for i, (key, _) in enumerate(tasks):
            self.groups.setdefault(key, deque()).append(i)
        self.unstarted = deque(self.groups)  # keys nobody has taken yet

    def next_task(self, w: _DeadlineWorker) -> int | None:
        """The next task for ``w``: of its group, else of a group nobody took yet, else stolen from the group with
        most work left (its gold is parsed again: only at the tail)."""
        q = self.groups.get(w.key)
        if q:
            return q.popleft()
        while self.unstarted:
            key = self.unstarted.popleft()
            if self.groups[key]:
                w.key = key
                return self.groups[key].popleft()
        key = max(self.groups, key=lambda k: len(self.groups[k]), default=None)
        if key is not None and self.groups[key]:
            w.key = key
            return self.groups[key].popleft()
        return None

    def done(self, i: int, result: tuple[str, Any]) -> None:
        self.results[i] = result
        self.remaining -= 1

    def finish(self, status: str) -> list[tuple[str, Any]]:
        """The results, in task order; a task that has none gets ``(status, None)``."""
        return [r if r is not None else (status, None) for r in self.results]


class DeadlinePool:
    """``map(tasks, deadline)`` runs ``handler(payload)`` for each ``(key, payload)`` across the workers.

    ``handler`` and ``warmup`` (run once in the zygote, before any worker forks) are module-level functions:
    the zygote imports them by name. ``memory_limit``: each worker's address-space bound in bytes (``None``
    or 0: unbounded).
    """

    def __init__(
        self,
        handler: Callable,
        num_workers: int,
        warmup: Callable | None = None,
        memory_limit: int | None = DEFAULT_MEMORY_LIMIT,
    ):
        self.handler_spec = _spec(handler)
        self.warmup_spec = _spec(warmup) if warmup is not None else ""
        self.num_workers = max(1, int(num_workers))
        self.memory_limit = int(memory_limit or 0)
        self._workers: list[_DeadlineWorker] = []
        self._zygote: _Zygote | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._calls = itertools.count(1)
        self._unclean = False  # a call is running, or one ended without its clean-up
        self.respawns = 0
        self.stale_replies = 0  # replies whose token matched no task in flight (discarded)
        self.start_failures = 0  # workers that could not start (no fork, or no hello in time), over the pool's life
        self.start_timeout = 300.0  # seconds for the zygote's warm-up (the first fork waits for it)
        self.hello_timeout = 30.0  # wall seconds from a worker's fork to its hello (a fork: milliseconds when idle)
        self.start_attempts = 3  # worker starts that may fail in one call before it stops starting more
        self.wall_factor = 5.0  # a task is killed at `deadline` CPU seconds or `wall_factor * deadline` wall seconds

    def start(self) -> None:
        """Start the zygote now (it warms up in the background); otherwise the first :meth:`map` does."""
        with self._lock:
            self._check_pid()
            if self._zygote is None or not self._zygote.alive():
                self._zygote = _Zygote(self.handler_spec, self.warmup_spec)

    def _check_pid(self) -> None:
        if self._pid != os.getpid():  # a forked copy of the parent's pool: never touch the parent's processes
            self._workers, self._zygote, self._pid = [], None, os.getpid()

    def _new_worker(self) -> _DeadlineWorker:
        if self._zygote is None or not self._zygote.alive():
            if self._zygote is not None:
                self._zygote.close()
            self._zygote = _Zygote(self.handler_spec, self.warmup_spec)
        return _DeadlineWorker(*self._zygote.fork_worker(self.memory_limit, self.start_timeout))

    def _drop_dead_workers(self) -> None:
        self._check_pid()
        alive = []
        for w in self._workers:
            if w.alive():
                alive.append(w)
            else:
                w.kill()
        self._workers = alive

    def map(
        self, tasks: Sequence[tuple[Hashable, Any]], deadline: float, total_deadline: float | None = None
    ) -> list[tuple[str, Any]]:
        """Results in task order: ``("ok", value)``, ``("error", message)`` (the handler raised), ``("timeout",
        None)`` (the task used ``deadline`` CPU seconds, or ``wall_factor * deadline`` wall seconds), ``("oom",
        None)`` (the task ran out of its worker's ``memory_limit``), ``("skipped", None)`` (``total_deadline`` for
        the batch ran out before it started) or, when the machinery lost the task, ``("died", None)`` (its worker
        died or stopped answering before its deadline) or ``("unstarted", None)`` (never handed to a worker: no
        worker could start). Never raises for a worker that cannot start: those are counted in
        ``start_failures``. An exception raised in the calling thread meanwhile propagates, and the workers that
        may still hold one of this call's tasks are killed on the way out."""
        if not tasks:
            return []
        with self._lock:
            if self._unclean:  # the last call was interrupted during its own clean-up
                self._discard_unclean(interrupted=True)
            self._unclean = True
            completed = False
            try:
                self._drop_dead_workers()
                results = self._run(tasks, float(deadline), total_deadline)
                completed = True
                return results
            finally:  # also on BaseException (KeyboardInterrupt, an exception raised by a signal handler, ...)
                self._discard_unclean(interrupted=not completed)
                self._unclean = False

    def _discard_unclean(self, interrupted: bool) -> None:
        """Kill every worker that may still hold a task (its late reply must never reach another call) and,
        after an interrupted call, every worker whose start-up message may have been half read. Replacements
        are forked by the next call. Only signals and closes: nothing here blocks."""
        keep = []
        for w in self._workers:
            if w.token is None and w.task is None and (w.ready or not interrupted):
                keep.append(w)
            else:
                w.kill()
                self.respawns += 1
        self._workers = keep

    def _run(self, tasks, deadline, total_deadline):
        """The loop of one call. Nothing shared by the call (its length, the starts of other workers) ever decides
        a task's result: a task ends by its own reply, its own deadline, its own worker's death or, only when the
        caller set one, ``total_deadline``. Tasks end ``unstarted`` only when no worker is left and no more may be
        started (``start_attempts`` failed in this call): none is in flight then."""
        call = _Call(next(self._calls), tasks)
        t0 = time.monotonic()
        wall_cap = self.wall_factor * deadline
        self._top_up(call)
        self._dispatch_idle(call)
        remaining = call.remaining
        while remaining:
            now = time.monotonic()
            if total_deadline is not None and now - t0 > total_deadline:
                for w in list(self._workers):
                    if w.task is not None:
                        call.done(w.task, ("timeout", None))
                        self._drop(w)
                return call.finish("skipped")
            if not self._workers:
                return call.finish("unstarted")
            ready = wait([w.conn for w in self._workers], timeout=self._wake(deadline, now, t0, total_deadline))
            for w in list(self._workers):
                if w.conn in ready:
                    self._receive(call, w)
                elif w.task is not None and w.overran(deadline, wall_cap) and not w.conn.poll(0):
                    call.done(w.task, ("timeout", None))
                    self._drop(w)
                elif not w.ready and time.monotonic() - w.born > self.hello_timeout:
                    self._start_failed(call, w)  # forked, but no hello in time
            self._top_up(call)
            self._dispatch_idle(call)
            remaining = call.remaining
        return call.finish("skipped")

    def _wake(self, deadline: float, now: float, t0: float, total_deadline: float | None) -> float:
        """Seconds to wait for a reply: until the first task in flight reaches its deadline; past its wall deadline,
        a task still short of its CPU deadline is polled every 0.1 s; 0.5 s at most (hellos, start timeouts)."""
        wake = min([max(w.started + deadline - now, 0.1) for w in self._workers if w.task is not None] + [0.5])
        if total_deadline is not None:
            wake = min(wake, t0 + total_deadline - now)
        return max(0.0, wake)

    def _dispatch_idle(self, call: _Call) -> None:
        """Hand every ready, idle worker its next task (a copy of the list: a failed send drops its worker)."""
        for w in list(self._workers):
            self._dispatch(call, w)

    def _dispatch(self, call: _Call, w: _DeadlineWorker) -> None:
        """Hand ``w`` its next task, if it is ready and idle; its deadline starts now."""
        if not w.ready or w.task is not None:
            return
        i = call.next_task(w)
        if i is None:
            return
        tasks = call.tasks
        w.task, w.token = i, (call.number, i)  # before sending: an interrupted send leaves the worker marked busy
        try:
            w.tx.send((w.token, tasks[i][1]))
        except (OSError, ValueError, EOFError):
            call.done(i, ("died", None))
            self._drop(w)
            return
        w.started, w.cpu0 = time.monotonic(), _cpu_seconds(w.pid)

    def _receive(self, call: _Call, w: _DeadlineWorker) -> None:
        """Read what ``w`` sent: its hello, the reply to its task, or its end (a death)."""
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):  # the worker died (out of memory, killed from outside, or before its hello)
            if w.task is not None:
                call.done(w.task, ("died", None))
            if w.ready:
                self._drop(w)
            else:
                self._start_failed(call, w)
            return
        if msg == _READY:
            w.ready = True
        elif not (isinstance(msg, tuple) and len(msg) == 2 and w.token is not None and msg[0] == w.token):
            self.stale_replies += 1  # not the answer to this worker's task in flight: never taken
            return
        else:
            call.done(w.task, msg[1])
            w.task = w.token = None
            if msg[1][0] == "oom":  # the worker exits after an out-of-memory task
                self._drop(w)
                return
        self._dispatch(call, w)

    def _drop(self, w: _DeadlineWorker) -> None:
        """Kill ``w`` and take it out of the pool; :meth:`_top_up` starts its replacement."""
        w.kill()
        self.respawns += 1
        self._workers.remove(w)

    def _start_failed(self, call: _Call, w: _DeadlineWorker | None = None) -> None:
        """A worker could not start (``w``: it was forked but sent no hello): counted, in the pool and the call."""
        if w is not None:
            w.kill()
            self._workers.remove(w)
        self.start_failures += 1
        call.failed_starts += 1

    def _top_up(self, call: _Call) -> None:
        """Start workers up to ``num_workers``, unless ``start_attempts`` starts failed in this call already.
        A new worker takes tasks once its hello is read."""
        while len(self._workers) < self.num_workers and call.failed_starts < self.start_attempts:
            try:
                self._workers.append(self._new_worker())
            except (OSError, RuntimeError):  # no fork: counted, never raised to the caller
                self._start_failed(call)

    def close(self) -> None:
        for w in self._workers:
            try:
                w.tx.send(None)
            except Exception:
                pass
            w.kill()
        self._workers = []
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

    def pids(self) -> list[int]:
        """The zygote's and the workers' process ids."""
        zygote = [self._zygote.proc.pid] if self._zygote is not None else []
        return zygote + [w.pid for w in self._workers]


def default_workers() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def get_pool(
    handler: Callable,
    num_workers: int | None = None,
    warmup: Callable | None = None,
    memory_limit: int | None = DEFAULT_MEMORY_LIMIT,
) -> DeadlinePool:
    """The process-wide pool for ``handler`` (created on first use, started by the first ``map``)."""
    n = num_workers or default_workers()
    key = (handler, n, warmup, memory_limit, os.getpid())
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = DeadlinePool(handler, n, warmup, memory_limit)
        return pool


@atexit.register
def _shutdown() -> None:
    for pool in list(_POOLS.values()):
        if pool._pid == os.getpid():
            try:
                pool.close()
            except Exception:
                pass
    _POOLS.clear()
