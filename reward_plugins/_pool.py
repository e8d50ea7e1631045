"""A small pool of long-lived worker processes with a hard per-task deadline that works from any thread.

Why not ``concurrent.futures``/``multiprocessing.Pool``: neither can stop one task that hangs (a sympy
evaluation of ``10^{10^{10^{10}}}`` never returns), and math-verify's own timeouts use SIGALRM, which
only works in the main thread (TRL calls reward functions from other threads in some modes). Here each
worker runs one task at a time; a worker that overruns its task's deadline is killed (SIGKILL) and
replaced, and the task is reported as ``("timeout", None)``.

* Workers are plain ``python -c`` subprocesses talking pickles over pipes: no ``fork`` of a threaded
  parent, and unlike multiprocessing's spawn/forkserver they never re-import the user's ``__main__``
  (a training script without an ``if __name__ == "__main__"`` guard keeps working). A worker imports its
  ``preload`` module (boxed_math: math-verify, warmed up) and then says it is ready; the deadline of a task
  starts when it is handed to a ready worker, so start-up never counts as a timeout.
* Tasks carry an affinity key (boxed_math: the gold) so that the answers of one group go to the same
  worker, which parses their gold once.
* The pool is created lazily, shared per process (:func:`get_pool`), never pickled (reward functions hold
  only their options), shut down at exit; workers also exit by themselves when the parent dies (EOF).
"""

from __future__ import annotations

import atexit
import importlib
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Hashable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

_POOLS: dict[tuple, "DeadlinePool"] = {}
_POOLS_LOCK = threading.Lock()
_READY = "__ready__"


def _resolve(spec: str):
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


def _serve(handler_spec: str, preload: Sequence[str] = ()) -> None:
    """Worker main loop (runs in the subprocess): protocol on a private copy of stdout, stdout -> stderr."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints of the handler must not corrupt the protocol
    rx, tx = Connection(0, writable=False), Connection(out_fd, readable=False)
    for module in preload:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a failed warm-up only costs time
            pass
    handler = _resolve(handler_spec)
    tx.send(_READY)
    while True:
        try:
            msg = rx.recv()
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
            tx.send((task_id, result))
        except (EOFError, OSError):
            return


class _Worker:
    def __init__(self, handler_spec: str, preload: Sequence[str]):
        code = "import sys; from reward_plugins._pool import _serve; _serve(sys.argv[1], sys.argv[2:])"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, handler_spec, *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
            start_new_session=True,  # a terminal's Ctrl-C goes to the parent only
        )
        self.tx = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self.conn = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.ready = False
        self.task: int | None = None
        self.started = 0.0
        self.key: Hashable = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(1.0)
        except Exception:
            pass
        for c in (self.tx, self.conn):
            try:
                c.close()
            except Exception:
                pass


class DeadlinePool:
    """``map(tasks, deadline)`` runs ``handler(payload)`` for each ``(key, payload)`` across the workers.

    ``handler_spec`` names a module-level function as ``"package.module:function"``.
    """

    def __init__(self, handler_spec: str, num_workers: int, preload: Sequence[str] = ()):
        self.handler_spec = handler_spec
        self.num_workers = max(1, int(num_workers))
        self.preload = list(preload)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.respawns = 0

    def start(self) -> None:
        """Start the workers now (otherwise on the first :meth:`map`); returns without waiting for them."""
        with self._lock:
            self._ensure_workers()

    def _ensure_workers(self) -> None:
        if self._pid != os.getpid():  # forked copy of a parent's pool: never touch the parent's workers
            self._workers, self._pid = [], os.getpid()
        alive = []
        for w in self._workers:
            if w.alive():
                alive.append(w)
            else:
                w.kill()
        while len(alive) < self.num_workers:
            alive.append(_Worker(self.handler_spec, self.preload))
        self._workers = alive

    def map(
        self, tasks: Sequence[tuple[Hashable, Any]], deadline: float, total_deadline: float | None = None
    ) -> list[tuple[str, Any]]:
        """Results in task order: ``("ok", value)``, ``("error", message)``, ``("timeout", None)`` (the task
        overran ``deadline`` seconds) or ``("skipped", None)`` (``total_deadline`` for the batch ran out)."""
        if not tasks:
            return []
        with self._lock:
            self._ensure_workers()
            return self._run(tasks, float(deadline), total_deadline)

    def _run(self, tasks, deadline, total_deadline):
        results: list[tuple[str, Any] | None] = [None] * len(tasks)
        groups: dict[Hashable, deque[int]] = {}
        for i, (key, _) in enumerate(tasks):
            groups.setdefault(key, deque()).append(i)
        unstarted = deque(groups)  # keys nobody has taken yet
        t0 = time.monotonic()
        start_budget = max(60.0, 10 * deadline)  # a worker that cannot even start is an error, not a hang
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
            w.task, w.started = i, time.monotonic()

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
            if now - t0 > start_budget and not any(w.ready for w in self._workers):
                for i, r in enumerate(results):
                    if r is None:
                        results[i] = ("error", "reward workers failed to start")
                break
            busy = [w for w in self._workers if w.task is not None]
            wake = min([w.started + deadline - now for w in busy] + [0.5])
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
                        w = self._replace(w)
                        continue
                    if msg == _READY:
                        w.ready = True
                    else:
                        task_id, result = msg
                        results[task_id] = result
                        remaining -= 1
                        w.task = None
                    dispatch(w)
                elif w.task is not None and time.monotonic() - w.started >= deadline:
                    results[w.task] = ("timeout", None)
                    remaining -= 1
                    self._replace(w)
        return [r if r is not None else ("skipped", None) for r in results]

    def _replace(self, w: _Worker) -> _Worker:
        w.kill()
        self.respawns += 1
        new = _Worker(self.handler_spec, self.preload)
        new.key = w.key
        self._workers[self._workers.index(w)] = new
        return new

    def close(self) -> None:
        for w in self._workers:
            try:
                w.tx.send(None)
            except Exception:
                pass
        deadline = time.monotonic() + 1.0
        for w in self._workers:
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            w.kill()
        self._workers = []

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]


def default_workers() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def get_pool(handler_spec: str, num_workers: int | None = None, preload: Sequence[str] = ()) -> DeadlinePool:
    """The process-wide pool for ``handler_spec`` (created on first use, started by the first ``map``)."""
    n = num_workers or default_workers()
    key = (handler_spec, n, tuple(preload), os.getpid())
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = DeadlinePool(handler_spec, n, preload)
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
