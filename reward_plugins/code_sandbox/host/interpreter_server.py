"""The Python tool's host side: its sandboxed interpreter server, and the host's end of each interpreter.

:class:`InterpreterServer` starts the zygote (``sandbox/interpreter.py``) as a reward pool's worker is started (a
claimed pool id, its uid and cgroups, bubblewrap: ``launcher.tool_server_command``) and asks it for interpreters.
The zygote answers each request with a pidfd of the new interpreter, which the host keeps in its
:class:`Interpreter`: the host, not the server, stops (SIGSTOP), resumes (SIGCONT) and kills (SIGKILL) it, so the
server keeps no table of rollouts. Between calls an interpreter is stopped: nothing a cell started (threads,
timers) runs while its rollout is not in a call.

A cell is sent with :meth:`Interpreter.start` and its reply read by :func:`collect`, which waits on every
interpreter that has a cell in flight at once, stamping each reply with the time it was complete and stopping its
interpreter then. So cells of many rollouts run together (``PythonEnvironment._dispatch_call``) and each is
charged its own time, whoever waits for it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import select
import signal
import socket
import threading
import time
from collections import deque

from ..sandbox import protocol
from ..sandbox.interpreter import READY
from . import launcher
from .claim import PoolClaim

log = logging.getLogger(__package__)

#: Each interpreter's own tmpfs (its files and directories, its working directory): bytes and inodes.
SCRATCH_BYTES = 64 << 20
SCRATCH_INODES = 16384
SPAWN_REPLY_S = 30.0  # how long the host waits for the zygote's answer to a spawn before it gives the server up
FAILED_STARTS = 3  # interpreters in a row that never came up (a refused fork, a lockdown that failed): replace it


class InterpreterServer:
    """One sandboxed zygote of interpreters (``interpreter.main``), shared by the environments of a process."""

    def __init__(self, isolation_mode: str = "bwrap", memory_mb: int = 8192, max_processes: int = 256,
                 max_file_bytes: int = 16 << 20):  # fmt: skip
        if isolation_mode not in ("bwrap", "rlimits"):
            raise ValueError(f"PythonEnvironment: isolation must be 'bwrap' or 'rlimits', not {isolation_mode!r}")
        if isolation_mode == "bwrap":
            launcher.find_bwrap()
        self.mode, self.pid = isolation_mode, os.getpid()
        self.claim = PoolClaim.acquire()
        launcher.install_sandbox_code(self.claim.code_dir, "interpreter")
        uid = launcher.slot_uid(0, self.claim.id)
        self._lock, self.failed_starts = threading.RLock(), 0
        self._waiting: deque[Interpreter] = deque()  # spawned, pidfd not received yet, in request order
        limits = protocol.dumps({"nproc": max_processes, "fsize": max_file_bytes, "scratch_bytes": SCRATCH_BYTES,
                                 "scratch_inodes": SCRATCH_INODES}).decode()  # fmt: skip
        python = launcher.sandbox_python()

        def command(ctrl_fd: int) -> list[str]:
            if isolation_mode == "bwrap":
                return launcher.tool_server_command(python, self.claim.code_dir, ctrl_fd, limits)
            return launcher.worker_command(isolation_mode, python, self.claim.code_dir, ctrl_fd, limits)

        # the server and every interpreter with its tmpfs: a cgroup per server, under the claim; under bubblewrap an
        # interpreter must also be able to mount a tmpfs of its own (bwrap --cap-add)
        mem = (memory_mb << 20) + (launcher.SCRATCH_MB << 20) + (128 << 20)
        try:
            self.server = launcher.SandboxedServer(
                "PythonEnvironment: the interpreter server", isolation_mode, command, uid,
                f"{self.claim.cgroup_name}/tool", mem, 2 * max_processes + 64,
                needs=("landlock", "seccomp", "private_tmpfs"),
            )
        except BaseException:
            self.claim.release()
            raise
        self.sock, self.proc = self.server.sock, self.server.proc

    def alive(self) -> bool:
        """Running, ours (not a forked host's), and able to start interpreters: ``FAILED_STARTS`` in a row that
        never came up mark it broken, and ``shared_server`` replaces it."""
        return self.proc.poll() is None and os.getpid() == self.pid and self.failed_starts < FAILED_STARTS

    def started(self, ok: bool) -> None:
        """Count an interpreter that came up (``ok``: it read its first cell) or never did."""
        self.failed_starts = 0 if ok else self.failed_starts + 1

    def spawn(self, timeout: float, cpu_s: int, mem_bytes: int, max_chars: int) -> "Interpreter":
        """A fresh interpreter (the zygote forks it while the host goes on: nothing here waits for it)."""
        cell_r, cell_w = os.pipe2(os.O_CLOEXEC)
        reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
        interp = Interpreter(self, cell_w, reply_r)
        with self._lock:
            self._receive(0.0)  # answers to earlier spawns, so that the zygote never blocks on a full socket
            try:
                msg = f"spawn {timeout!r} {int(cpu_s)} {int(mem_bytes)} {int(max_chars)}"
                socket.send_fds(self.sock, [msg.encode()], [cell_r, reply_w])
                self._waiting.append(interp)
            except OSError:
                interp.pidfd = -1  # the server is gone: the first call finds the pipes closed
            finally:
                os.close(cell_r)
                os.close(reply_w)
        os.set_blocking(cell_w, False)
        os.set_blocking(reply_r, False)
        return interp

    def resolve(self, interp: "Interpreter") -> None:
        """Wait (at most ``SPAWN_REPLY_S``) for the zygote's answer to ``interp``'s spawn."""
        with self._lock:
            deadline = time.monotonic() + SPAWN_REPLY_S
            while interp.pidfd is None:
                if not self._receive(max(0.0, deadline - time.monotonic())) and time.monotonic() >= deadline:
                    log.warning("PythonEnvironment: the interpreter server did not answer a spawn; replacing it")
                    self._fail_waiting()
                    self.close()

    def _receive(self, wait_s: float) -> bool:
        """Match the zygote's answers that have arrived (waiting up to ``wait_s`` for the first) to the waiting
        spawns, in order. False when none came."""
        got = False
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        while self._waiting:
            if not poller.poll(1000 * (wait_s if not got else 0.0)):
                return got
            try:
                msg, fds, _, _ = socket.recv_fds(self.sock, 64, 1)
            except OSError:
                msg, fds = b"", []
            if not msg:  # the server is gone
                self._fail_waiting()
                return True
            got = True
            interp = self._waiting.popleft()
            interp.pidfd = fds[0] if msg == b"ok" and fds else -1
            if interp.pidfd < 0:
                self.started(False)
            for fd in fds[1:] if not interp.closed else fds:  # a closed one's interpreter ends at EOF on its pipe
                os.close(fd)
            if interp.closed:
                interp.pidfd = -1
        return got

    def _fail_waiting(self) -> None:
        while self._waiting:
            self._waiting.popleft().pidfd = -1

    def close(self) -> None:
        """Kill the server (and so every interpreter it started); spawns still waiting for their answer get none."""
        lock = getattr(self, "_lock", None)
        with lock if lock is not None else contextlib.nullcontext():
            if hasattr(self, "_waiting"):
                self._fail_waiting()
        server = getattr(self, "server", None)
        if server is not None:
            server.kill()  # in a process that did not start it (a fork): only its copies of the channel and log
        if os.getpid() == self.pid:
            self.claim.release()


_SERVERS: dict[str, InterpreterServer] = {}
_SERVERS_LOCK = threading.Lock()


def shared_server(isolation_mode: str) -> InterpreterServer:
    """This process's server for ``isolation_mode``, started (or replaced, if it died) on demand."""
    with _SERVERS_LOCK:
        server = _SERVERS.get(isolation_mode)
        if server is None or not server.alive():
            if server is not None and os.getpid() == server.pid:
                log.warning("PythonEnvironment: the interpreter server exited; starting a new one")
                server.close()
            server = _SERVERS[isolation_mode] = InterpreterServer(isolation_mode)
        return server


@atexit.register
def _close_servers() -> None:
    for server in list(_SERVERS.values()):
        try:
            server.close()
        except Exception:  # noqa: BLE001
            pass
    _SERVERS.clear()


class Interpreter:
    """The host's end of one interpreter: its two pipes and its pidfd; at most one cell in flight."""

    def __init__(self, server: InterpreterServer | None, cell_fd: int, reply_fd: int, pidfd: int | None = None):
        self.server, self.cell_fd, self.reply_fd, self.pidfd = server, cell_fd, reply_fd, pidfd
        self.buf, self.want, self.max_reply = bytearray(), -1, 0
        self.started = self.deadline = self.done_at = 0.0
        self.in_flight, self.reply, self.closed = False, None, False
        self.fresh = server is not None  # a server's interpreter that has not said it is ready yet

    def _signal(self, sig: int) -> None:
        if self.pidfd is None and self.server is not None:
            self.server.resolve(self)
        if self.pidfd is not None and self.pidfd >= 0:
            try:
                signal.pidfd_send_signal(self.pidfd, sig)
            except OSError:  # gone: its pipes say so
                pass

    def start(self, code: str, seconds: float, max_reply_bytes: int) -> None:
        """Resume the interpreter and send it ``code``, to be over within ``seconds``; its reply is read by
        :func:`collect`."""
        self.buf.clear()
        self.started = time.monotonic()
        deadline = self.deadline = self.started + seconds
        self.want, self.max_reply, self.reply, self.in_flight, self.done_at = -1, max_reply_bytes, None, True, 0.0
        self._signal(signal.SIGCONT)
        if self.fresh and not self._came_up(deadline):
            return self._finish(None, time.monotonic())
        data = code.encode("utf-8", errors="replace")
        view = memoryview(len(data).to_bytes(4, "big") + data)
        try:
            poller = select.poll()
            poller.register(self.cell_fd, select.POLLOUT)
            while view:
                if not poller.poll(1000 * max(0.0, deadline - time.monotonic())):
                    return self._finish(None, deadline)
                view = view[os.write(self.cell_fd, view) :]
        except OSError:  # EPIPE: it is gone
            return self._finish(None, time.monotonic())
        with _INFLIGHT_LOCK:
            _INFLIGHT.add(self)

    def _came_up(self, deadline: float) -> bool:
        """Read the interpreter's ready frame (it sends one once locked down, before it reads a cell), and tell the
        server whether it came: an interpreter that dies before it is a failed start, not the rollout's doing."""
        self.fresh = False
        poller = select.poll()
        poller.register(self.reply_fd, select.POLLIN)
        head = b""
        try:
            while len(head) < 4 + len(READY) and poller.poll(1000 * max(0.0, deadline - time.monotonic())):
                b = os.read(self.reply_fd, 4 + len(READY) - len(head))
                if not b:
                    break
                head += b
        except OSError:
            pass
        ok = head == len(READY).to_bytes(4, "big") + READY
        if self.server is not None:
            self.server.started(ok)
        return ok

    def _finish(self, reply: str | None, at: float) -> None:
        """The cell is over (``reply`` None: the interpreter died, broke the framing, or ran past its deadline):
        stop the interpreter until its next call."""
        self._signal(signal.SIGSTOP)
        self.reply, self.done_at, self.in_flight = reply, at, False
        with _INFLIGHT_LOCK:
            _INFLIGHT.discard(self)

    def _read_ready(self, now: float) -> None:
        """Read what the interpreter has written; finish the cell when its reply frame is whole or broken."""
        try:
            while True:
                b = os.read(self.reply_fd, 1 << 16)
                if not b:
                    return self._finish(None, now)
                self.buf += b
                if self.want < 0 and len(self.buf) >= 4:
                    self.want = int.from_bytes(self.buf[:4], "big")
                    if self.want > self.max_reply:
                        return self._finish(None, now)
                if self.want >= 0 and len(self.buf) >= 4 + self.want:
                    if len(self.buf) > 4 + self.want:  # more than one frame: not the protocol
                        return self._finish(None, now)
                    return self._finish(bytes(self.buf[4:]).decode("utf-8", errors="replace"), now)
        except BlockingIOError:
            return
        except OSError:
            return self._finish(None, now)

    def close(self) -> None:
        """Kill the interpreter and let go of it. One whose pidfd has not come yet never got a cell (nor was it
        stopped): it reads EOF when its pipes close here and exits, and its pidfd is closed when it comes."""
        with self.server._lock if self.server is not None else contextlib.nullcontext():  # vs. _receive
            self.closed = True
            pidfd, self.pidfd = self.pidfd, (-1 if self.pidfd is not None else None)
        if pidfd is not None and pidfd >= 0:
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass
        with _INFLIGHT_LOCK:
            _INFLIGHT.discard(self)
        self.in_flight = False
        for fd in (self.cell_fd, self.reply_fd, pidfd if pidfd is not None else -1):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.cell_fd = self.reply_fd = -1


_INFLIGHT: set[Interpreter] = set()  # interpreters with a cell sent and its reply not yet whole
_INFLIGHT_LOCK = threading.Lock()
_COLLECTING = threading.Lock()  # one thread reads replies at a time; it reads everyone's


def collect(interp: Interpreter) -> tuple[str | None, float]:
    """Wait until ``interp``'s cell is over -> (its reply or None, the time it was over). While waiting, read the
    replies of every interpreter with a cell in flight, stamping each with the time it was whole and stopping
    its interpreter then, and end at its own deadline each one that has not answered."""
    while interp.in_flight:
        with _COLLECTING:
            if not interp.in_flight:
                break
            with _INFLIGHT_LOCK:
                flying = list(_INFLIGHT)
            now = time.monotonic()
            for it in flying:
                if it.in_flight and now >= it.deadline:
                    it._read_ready(now)  # a reply whole at the deadline still counts
                    if it.in_flight:
                        it._finish(None, it.deadline)
            flying = [it for it in flying if it.in_flight]
            if not flying:
                continue
            wait = min(it.deadline for it in flying) - time.monotonic()
            poller = select.poll()  # not select(): a trainer may hold fds past FD_SETSIZE
            for it in flying:
                poller.register(it.reply_fd, select.POLLIN)
            ready = {fd for fd, _ in poller.poll(1000 * max(0.0, min(wait, 0.05)))}
            now = time.monotonic()
            for it in flying:
                if it.reply_fd in ready:
                    it._read_ready(now)
    return interp.reply, interp.done_at
