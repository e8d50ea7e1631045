"""A small pool of long-lived worker processes with a hard per-task deadline that works from any thread.

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
  It is measured in the worker's CPU seconds (from /proc; wall seconds elsewhere), with a wall-clock cap
  of ``wall_factor`` (5) times the deadline: a loaded machine slows checks down without failing them.
* Tasks carry an affinity key (boxed_math: the gold) so that the answers of one group go to the same
  worker, which parses their gold once.
* The pool is created lazily, shared per process (:func:`get_pool`), never pickled (reward functions hold
  only their options), shut down at exit; the zygote and the workers also exit by themselves when the
  parent dies (EOF on their sockets), and the zygote's children are reaped automatically.
"""

from __future__ import annotations

import atexit
import importlib
import os
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


def _worker_loop(conn: Connection, handler) -> None:
    conn.send(_READY)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        task_id, payload = msg
        try:
            result = ("ok", handler(payload))
        except BaseException as e:  # noqa: BLE001 - report, never die, on a bad input
            result = ("error", f"{type(e).__name__}: {e}"[:300])
        try:
            conn.send((task_id, result))
        except (EOFError, OSError):
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
            msg, fds, _, _ = socket.recv_fds(ctrl, 16, 4)
        except OSError:
            return
        if not msg:  # the parent is gone
            return
        if not fds:
            continue
        pid = os.fork()
        if pid == 0:
            try:
                ctrl.close()
                for fd in fds[1:]:
                    os.close(fd)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _worker_loop(Connection(fds[0]), handler)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        try:
            ctrl.sendall(struct.pack("!i", pid))
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
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
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
        self.ready = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float) -> bool:
        if not self.ready:
            self.ctrl.settimeout(timeout)
            try:
                self.ready = self.ctrl.recv(1) == b"R"
            except OSError:
                self.ready = False
            finally:
                self.ctrl.settimeout(None)
        return self.ready

    def fork_worker(self) -> tuple[int, Connection]:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.ctrl.settimeout(30.0)
            socket.send_fds(self.ctrl, [b"W"], [theirs.fileno()])
            data = b""
            while len(data) < 4:
                chunk = self.ctrl.recv(4 - len(data))
                if not chunk:
                    raise OSError("reward worker zygote exited")
                data += chunk
        finally:
            self.ctrl.settimeout(None)
            theirs.close()
        return struct.unpack("!i", data)[0], Connection(mine.detach())

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


class _Worker:
    def __init__(self, pid: int, conn: Connection):
        self.pid = pid
        self.conn = self.tx = conn
        self.ready = False
        self.task: int | None = None
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


class DeadlinePool:
    """``map(tasks, deadline)`` runs ``handler(payload)`` for each ``(key, payload)`` across the workers.

    ``handler`` and ``warmup`` (run once in the zygote, before any worker forks) are module-level functions:
    the zygote imports them by name.
    """

    def __init__(self, handler: Callable, num_workers: int, warmup: Callable | None = None):
        self.handler_spec = _spec(handler)
        self.warmup_spec = _spec(warmup) if warmup is not None else ""
        self.num_workers = max(1, int(num_workers))
        self._workers: list[_Worker] = []
        self._zygote: _Zygote | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.respawns = 0
        self.start_timeout = 300.0
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

    def _new_worker(self) -> _Worker:
        if self._zygote is None or not self._zygote.alive():
            if self._zygote is not None:
                self._zygote.close()
            self._zygote = _Zygote(self.handler_spec, self.warmup_spec)
        if not self._zygote.wait_ready(self.start_timeout):
            raise RuntimeError("reward worker zygote failed to start (see its stderr)")
        return _Worker(*self._zygote.fork_worker())

    def _ensure_workers(self) -> None:
        self._check_pid()
        alive = []
        for w in self._workers:
            if w.alive():
                alive.append(w)
            else:
                w.kill()
        while len(alive) < self.num_workers:
            alive.append(self._new_worker())
        self._workers = alive

    def map(
        self, tasks: Sequence[tuple[Hashable, Any]], deadline: float, total_deadline: float | None = None
    ) -> list[tuple[str, Any]]:
        """Results in task order: ``("ok", value)``, ``("error", message)``, ``("timeout", None)`` (the task
        used ``deadline`` CPU seconds, or ``wall_factor * deadline`` wall seconds) or ``("skipped", None)`` (``total_deadline`` for the batch ran out)."""
        if not tasks:
            return []
        with self._lock:
            try:
                self._ensure_workers()
            except (OSError, RuntimeError) as e:
                return [("error", f"reward workers unavailable: {e}")] * len(tasks)
            return self._run(tasks, float(deadline), total_deadline)

    def _run(self, tasks, deadline, total_deadline):
        results: list[tuple[str, Any] | None] = [None] * len(tasks)
        groups: dict[Hashable, deque[int]] = {}
        for i, (key, _) in enumerate(tasks):
            groups.setdefault(key, deque()).append(i)
        unstarted = deque(groups)  # keys nobody has taken yet
        t0 = time.monotonic()
        start_budget = max(60.0, 10 * deadline)  # a worker that cannot even start is an error, not a hang
        wall_cap = self.wall_factor * deadline
        remaining = len(tasks)

        def next_task(w: _Worker) -> int | None:
            q = groups.get(w.key)
            if q:
                return q.popleft()
            while unstarted:
                key = unstarted.popleft()
                if groups[key]:
                    w.key = key
                    return groups[key].popleft()
            # steal from the group with most work left (its gold is parsed again: only at the tail)
            key = max(groups, key=lambda k: len(groups[k]), default=None)
            if key is not None and groups[key]:
                w.key = key
                return groups[key].popleft()
            return None

        def dispatch(w: _Worker) -> None:
            nonlocal remaining
            if not w.ready or w.task is not None:
                return
            i = next_task(w)
            if i is None:
                return
            try:
                w.tx.send((i, tasks[i][1]))
            except (OSError, ValueError, EOFError):
                results[i] = ("error", "worker died")
                remaining -= 1
                self._replace(w)
                return
            w.task, w.started, w.cpu0 = i, time.monotonic(), _cpu_seconds(w.pid)

        for w in self._workers:
            dispatch(w)
        while remaining:
            now = time.monotonic()
            if total_deadline is not None and now - t0 > total_deadline:
                for w in list(self._workers):
                    if w.task is not None:
                        results[w.task] = ("timeout", None)
                        self._replace(w)
                break
            if not self._workers or (now - t0 > start_budget and not any(w.ready for w in self._workers)):
                for i, r in enumerate(results):
                    if r is None:
                        results[i] = ("error", "reward workers failed to start")
                break
            busy = [w for w in self._workers if w.task is not None]
            # past its wall deadline, a task still short of its CPU deadline is polled every 0.1 s
            wake = min([max(w.started + deadline - now, 0.1) for w in busy] + [0.5])
            if total_deadline is not None:
                wake = min(wake, t0 + total_deadline - now)
            ready = wait([w.conn for w in self._workers], timeout=max(0.0, wake))
            for w in list(self._workers):
                if w.conn in ready:
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):  # the worker died (e.g. out of memory or failed to start)
                        if w.task is not None:
                            results[w.task] = ("error", "worker died")
                            remaining -= 1
                        self._replace(w)
                        continue
                    if msg == _READY:
                        w.ready = True
                    else:
                        task_id, result = msg
                        results[task_id] = result
                        remaining -= 1
                        w.task = None
                    dispatch(w)
                elif w.task is not None and w.overran(deadline, wall_cap):
                    results[w.task] = ("timeout", None)
                    remaining -= 1
                    self._replace(w)
        return [r if r is not None else ("skipped", None) for r in results]

    def _replace(self, w: _Worker) -> _Worker | None:
        w.kill()
        self.respawns += 1
        i = self._workers.index(w)
        try:
            new = self._new_worker()
        except (OSError, RuntimeError):
            self._workers.pop(i)  # no replacement now: the next map() tries again
            return None
        new.key = w.key
        self._workers[i] = new
        return new

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


def get_pool(handler: Callable, num_workers: int | None = None, warmup: Callable | None = None) -> DeadlinePool:
    """The process-wide pool for ``handler`` (created on first use, started by the first ``map``)."""
    n = num_workers or default_workers()
    key = (handler, n, warmup, os.getpid())
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = DeadlinePool(handler, n, warmup)
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
