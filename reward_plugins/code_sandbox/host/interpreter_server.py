"""The Python tool's host side: its sandboxed interpreter server, and the host's end of each interpreter.

:class:`InterpreterServer` starts the zygote (``sandbox/interpreter.py``) as a reward pool's worker is started (a
claimed pool id, its uid and cgroups, bubblewrap: ``launcher.tool_server_command``) and asks it for interpreters.
The zygote answers each request with a pidfd of the new interpreter, which the host keeps in its
:class:`Interpreter`: the host, not the server, stops (SIGSTOP), resumes (SIGCONT) and kills (SIGKILL) it, so the
server keeps no table of rollouts. Between calls an interpreter is stopped: nothing a cell started (threads,
timers) runs while its rollout is not in a call.

All pipes and sockets of a process are read and written by one thread, its I/O loop (``_IOLoop``, started on
demand, and anew in a forked host). :meth:`Interpreter.start` hands a cell to it and returns; the loop writes the
cell as the interpreter's pipe takes it (never waiting on a full pipe), reads every interpreter's reply as it
arrives, stamps it with that time and stops its interpreter then, ends each cell at its own deadline, and reads the
zygote's answers to spawns. :func:`collect` waits for one interpreter's cell alone. So cells of many rollouts run
together (``PythonEnvironment._dispatch_call``), and each is charged from its own send to its own reply: an
interpreter that does not read its cell, floods its pipe or never answers costs nobody else's cell any time.

Every limit is per rollout. As root, each interpreter runs in cgroups of its own, entered when its pidfd arrives
and before its first cell is written: cpu (equal weight, a quota of ``CPU_QUOTA_CORES``: its threads together get
one rollout's share of the cores), pids (``max_processes`` threads) and memory (its address space, its tmpfs and
``launcher.MEMORY_CGROUP_SLACK``: at that cap the kernel's OOM killer has only it to choose from); the uid's
RLIMIT_NPROC, which all interpreters of a server share, is then left at the host's. Its CPU seconds, address space,
open files and file size are rlimits of its own process, its files a tmpfs of its own. Without root (or without a
cgroup v1 controller) the controller's limit falls back: threads to RLIMIT_NPROC of the sandbox uid, shared by the
server's interpreters, and memory to RLIMIT_AS alone (docs/python_tool.md, "What a rollout can and cannot do to
another").
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
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
CPU_QUOTA_CORES = 1.0  # as root: the cores one interpreter may use at once (its cpu cgroup's CFS quota)
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
        # each interpreter's pids and memory cgroups go under the claim (which caps nothing), beside the server's own
        # (``tool``): None where the claim has none in that controller (not root, no cgroup v1 controller)
        self.pids_dir, self.memory_dir = (self._claim_dir(ctrl) for ctrl in ("pids", "memory"))
        self.max_processes = max_processes
        self.failed_starts = 0
        self._send_lock = threading.Lock()  # spawn requests and their places in ``_waiting`` in the same order
        self._waiting: deque[Interpreter] = deque()  # spawned, pidfd not received yet, in request order
        self._spawned = 0
        self._cgroups: set[str] = set()  # the interpreters' cgroups not removed yet
        self._dead_cgroups: list[str] = []  # those of closed interpreters (removed once their process has exited)
        # RLIMIT_NPROC counts every process of the uid: set (to the whole server's bound) only where no pids cgroup
        # bounds each interpreter; 0 leaves it at the host's
        nproc = 0 if self.pids_dir else max_processes
        limits = protocol.dumps({"nproc": nproc, "fsize": max_file_bytes, "scratch_bytes": SCRATCH_BYTES,
                                 "scratch_inodes": SCRATCH_INODES}).decode()  # fmt: skip
        python = launcher.sandbox_python()

        def command(ctrl_fd: int) -> list[str]:
            if isolation_mode == "bwrap":
                return launcher.tool_server_command(python, self.claim.code_dir, ctrl_fd, limits)
            return launcher.worker_command(isolation_mode, python, self.claim.code_dir, ctrl_fd, limits)

        # the server and every interpreter with its tmpfs: a cgroup per server, under the claim (as root, interpreters
        # leave it for their own before their first cell); under bubblewrap an interpreter must also be able to
        # mount a tmpfs of its own (bwrap --cap-add)
        mem = (memory_mb << 20) + (launcher.SCRATCH_MB << 20) + (128 << 20)
        try:
            self.server = launcher.SandboxedServer(
                "PythonEnvironment: the interpreter server", isolation_mode, command, uid,
                f"{self.claim.cgroup_name}/tool", mem, 2 * max_processes + 64,
                needs=("landlock", "seccomp", "private_tmpfs"),
            )
            # each interpreter gets a cpu cgroup of its own in this dir (``_own_cgroups``); None where the claim has
            # none in cpu (not root, no cgroup v1 cpu controller): then CPU between rollouts is the kernel's (docs)
            self.cpu_dir = launcher.cgroup_base("cpu") if any(
                os.path.dirname(d) == launcher.cgroup_base("cpu") for d in self.claim.cgroups) else None
        except BaseException:
            self.claim.release()
            raise
        self.sock, self.proc = self.server.sock, self.server.proc
        self.sock.settimeout(SPAWN_REPLY_S)  # sends only: answers are read without waiting (``_answers``)

    def alive(self) -> bool:
        """Running, ours (not a forked host's), and able to start interpreters: ``FAILED_STARTS`` in a row that
        never came up (or a spawn not answered within ``SPAWN_REPLY_S``) mark it broken, and ``shared_server``
        replaces it."""
        return self.proc.poll() is None and os.getpid() == self.pid and self.failed_starts < FAILED_STARTS

    def started(self, ok: bool) -> None:
        """Count an interpreter that came up (``ok``: it sent its ready frame) or never did."""
        self.failed_starts = 0 if ok else self.failed_starts + 1

    def spawn(self, timeout: float, cpu_s: int, mem_bytes: int, max_chars: int) -> "Interpreter":
        """A fresh interpreter. The zygote forks it while the host goes on: nothing here waits for it; the I/O loop
        receives its pidfd, moves it into its own cgroups, and only then writes its first cell."""
        cell_r, cell_w = os.pipe2(os.O_CLOEXEC)
        reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(cell_w, False)  # the host's ends never block; the interpreter's do (whole frames)
        os.set_blocking(reply_r, False)
        interp = Interpreter(self, cell_w, reply_r)
        interp.cgroups = self._own_cgroups(mem_bytes)
        loop = _io_loop()
        try:
            with self._send_lock:
                with loop.lock:
                    self._waiting.append(interp)
                    interp.asked_at = time.monotonic()
                try:
                    msg = f"spawn {timeout!r} {int(cpu_s)} {int(mem_bytes)} {int(max_chars)}"
                    socket.send_fds(self.sock, [msg.encode()], [cell_r, reply_w])
                except OSError:  # the server is gone (or stuck): the first call finds the pipes closed
                    with loop.lock:
                        if interp in self._waiting:
                            self._waiting.remove(interp)
                        interp.pidfd = -1
                    self.failed_starts = FAILED_STARTS if self.proc.poll() is None else self.failed_starts
        finally:
            os.close(cell_r)
            os.close(reply_w)
        loop.watch(self)
        return interp

    def _claim_dir(self, ctrl: str) -> str | None:
        path = os.path.join(launcher.cgroup_base(ctrl), self.claim.cgroup_name)
        return path if path in self.claim.cgroups else None

    def _own_cgroups(self, mem_bytes: int) -> list[str]:
        """New cgroups for one interpreter, in each controller the host has (none where not root):

        * cpu: beside the host's own (not nested: so each weighs what a session of its own weighs with the kernel's
          autogroup, ``cpu.shares`` 1024, also where autogroup is off), held to ``CPU_QUOTA_CORES``; named after the
          claim, so that a host killed outright leaves them to ``claim.reclaim_stale``;
        * pids: at most ``max_processes`` threads; memory: ``mem_bytes`` (its RLIMIT_AS) + its tmpfs +
          ``launcher.MEMORY_CGROUP_SLACK``. Both under the claim, which caps nothing (so no interpreter's use counts
          against another's) and goes, with them, at its release or ``claim.reclaim_stale``.

        First the removal of those of closed interpreters that have exited since: here, on the caller's thread and
        outside the I/O loop's lock, since draining a memory cgroup (``launcher.cgroup_rmdir``) reclaims what its
        interpreter read, which takes time no cell may be charged."""
        with _io_loop().lock:  # vs. ``forget``
            dead, self._dead_cgroups = self._dead_cgroups, []
            self._spawned += 1
            n = self._spawned
        busy = [d for d in dead if not launcher.cgroup_rmdir(d)]
        made = []
        if self.cpu_dir is not None:
            made.append(launcher.cpu_cgroup(os.path.join(self.cpu_dir, f"{self.claim.cgroup_name}-i{n}"),
                                            CPU_QUOTA_CORES))  # fmt: skip
        if self.pids_dir is not None:
            made.append(launcher.pids_cgroup(os.path.join(self.pids_dir, f"i{n}"), self.max_processes))
        if self.memory_dir is not None:
            limit = mem_bytes + SCRATCH_BYTES + launcher.MEMORY_CGROUP_SLACK
            made.append(launcher.memory_cgroup(os.path.join(self.memory_dir, f"i{n}"), limit))
        with _io_loop().lock:
            self._dead_cgroups += busy
            self._cgroups.difference_update(set(dead) - set(busy))
            self._cgroups.update(made)
        return made

    def _answers(self, now: float) -> None:
        """(The I/O loop, holding its lock.) Match the zygote's answers that have arrived to the waiting spawns, in
        order; give up on the server when the oldest has waited ``SPAWN_REPLY_S``."""
        while self._waiting:
            try:
                msg, fds, _, _ = socket.recv_fds(self.sock, 64, 1, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                msg, fds = b"", []
            if not msg:  # the server is gone
                self._fail_waiting()
                return
            interp = self._waiting.popleft()
            pidfd = fds[0] if msg == b"ok" and fds else -1
            for fd in fds[1:] if not interp.closed else fds:  # a closed one's interpreter ends at EOF on its pipe
                os.close(fd)
            if interp.closed:
                continue
            if pidfd < 0:
                self.started(False)
                interp.fresh = False  # counted: its cell finds the pipes closed
            elif not all(launcher.cgroup_enter(d, pidfd) for d in interp.cgroups):
                # where its cgroups are the rule, an interpreter outside one never gets a cell: it is killed
                log.warning("PythonEnvironment: could not move an interpreter into its cgroups; it is not used")
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                os.close(pidfd)
                pidfd = -1
                self.started(False)
                interp.fresh = False
            interp._resolved(pidfd, now)
        if self._waiting and now - self._waiting[0].asked_at > SPAWN_REPLY_S:
            log.warning("PythonEnvironment: the interpreter server did not answer a spawn; replacing it")
            self.failed_starts = FAILED_STARTS  # shared_server replaces it (and closes this one) at the next call
            self._fail_waiting()

    def _fail_waiting(self) -> None:
        while self._waiting:
            self._waiting.popleft()._resolved(-1, time.monotonic())

    def forget(self, interp: "Interpreter") -> None:
        """(Under the loop's lock.) A closed interpreter's cgroups: removed at a later spawn once it has exited, or at
        the close."""
        self._dead_cgroups += interp.cgroups
        interp.cgroups = []

    def close(self) -> None:
        """Kill the server (and so every interpreter it started); spawns still waiting for their answer get none."""
        if hasattr(self, "_waiting"):
            loop = _io_loop()
            with loop.lock:
                self._fail_waiting()
                loop.servers.discard(self)
        server = getattr(self, "server", None)
        if server is not None:
            server.kill()  # in a process that did not start it (a fork): only its copies of the channel and log
        if os.getpid() == self.pid:
            left = launcher.cgroup_remove(sorted(getattr(self, "_cgroups", ())))  # the interpreters' cgroups
            if left:
                log.warning("PythonEnvironment: cgroups %s still busy; the next pool's start reclaims them", left)
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
    """The host's end of one interpreter: its two pipes and its pidfd; at most one cell in flight.

    :meth:`start` hands a cell to the process's I/O loop and returns; :func:`collect` waits for that cell alone.
    The cell's state (``out``, ``buf``, ``reply``, ``in_flight``, ...) is read and written under the loop's lock."""

    def __init__(self, server: InterpreterServer | None, cell_fd: int, reply_fd: int, pidfd: int | None = None):
        self.server, self.cell_fd, self.reply_fd, self.pidfd = server, cell_fd, reply_fd, pidfd
        self.cgroups: list[str] = []  # its own cgroups (a server's, as root: cpu, pids, memory)
        self.asked_at = 0.0  # when its spawn was requested
        self.buf, self.want, self.max_reply = bytearray(), -1, 0
        self.out: memoryview | None = None  # the rest of the cell frame still to write
        self.started = self.deadline = self.done_at = 0.0
        self.in_flight, self.reply, self.closed = False, None, False
        self.done = threading.Event()  # set while no cell is in flight
        self.done.set()
        self.fresh = server is not None  # a server's interpreter that has not said it is ready yet

    def _signal(self, sig: int) -> None:
        if self.pidfd is not None and self.pidfd >= 0:
            try:
                signal.pidfd_send_signal(self.pidfd, sig)
            except OSError:  # gone: its pipes say so
                pass

    def start(self, code: str, seconds: float, max_reply_bytes: int) -> None:
        """Hand ``code`` to the I/O loop, to be over within ``seconds`` from now: the interpreter is resumed and
        the cell written without blocking (the rest of a cell larger than the pipe as the interpreter reads it);
        the reply is read and stamped by the loop as it arrives, and :func:`collect` returns it."""
        data = code.encode("utf-8", errors="replace")
        frame = memoryview(len(data).to_bytes(4, "big") + data)
        loop = _io_loop()
        with loop.lock:
            self.buf.clear()
            self.started = time.monotonic()
            self.deadline = self.started + seconds
            self.want, self.max_reply, self.reply, self.done_at = -1, max_reply_bytes, None, 0.0
            self.in_flight, self.out = True, frame
            self.done.clear()
            if self.closed:
                return self._finish(None, self.started)
            if self.pidfd is not None:  # else its pidfd is on its way: the loop writes once it has come
                self._signal(signal.SIGCONT)
                self._write()
            if self.in_flight:
                loop.cells.add(self)
        loop.wake()

    def _resolved(self, pidfd: int, now: float) -> None:
        """(The loop.) The zygote's answer to this interpreter's spawn: its pidfd (in its cgroups by now), or -1."""
        self.pidfd = pidfd
        if self.in_flight:  # its first cell waited for this
            self._signal(signal.SIGCONT)
            self._write()

    def _write(self) -> None:
        """(Under the loop's lock.) Write what the pipe takes of the cell, never waiting."""
        try:
            while self.out:
                self.out = self.out[os.write(self.cell_fd, self.out) :]
        except BlockingIOError:  # the interpreter has not read the rest yet: the loop writes it when it can
            return
        except OSError:  # EPIPE: it is gone
            return self._finish(None, time.monotonic())
        self.out = None

    def _read(self, now: float) -> None:
        """(Under the loop's lock.) Read what the interpreter has written (its ready frame first, once); finish the
        cell at ``now``, the time the loop saw it arrive, when its reply frame is whole or broken."""
        try:
            while self.in_flight:
                b = os.read(self.reply_fd, 1 << 16)
                if not b:
                    return self._finish(None, now)
                self.buf += b
                if self.fresh:
                    came = self._came_up()
                    if came is None:
                        continue
                    if not came:
                        return self._finish(None, now)
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

    def _came_up(self) -> bool | None:
        """Its ready frame (an interpreter sends it once locked down, before it reads a cell): None while it is not
        whole yet; else whether it came (taken off the buffer), told to the server. An interpreter that dies or says
        anything else first is a failed start, not the rollout's doing."""
        have = bytes(self.buf[: len(READY_FRAME)])
        if len(have) < len(READY_FRAME) and READY_FRAME.startswith(have):
            return None
        ok = have == READY_FRAME
        self.fresh = False
        if self.server is not None:
            self.server.started(ok)
        del self.buf[: len(READY_FRAME)]
        return ok

    def _finish(self, reply: str | None, at: float) -> None:
        """(Under the loop's lock.) The cell is over (``reply`` None: the interpreter died, broke the framing, or ran
        past its deadline): stop the interpreter at once, until its next call, and wake its caller."""
        if not self.in_flight:
            return
        self._signal(signal.SIGSTOP)
        if self.fresh:  # never said it was ready
            self.fresh = False
            if self.server is not None:
                self.server.started(False)
        self.reply, self.done_at, self.in_flight, self.out = reply, at, False, None
        _io_loop().cells.discard(self)
        self.done.set()

    def close(self) -> None:
        """Kill the interpreter and let go of it. One whose pidfd has not come yet never got a cell (nor was it
        stopped): it reads EOF when its pipes close here and exits, and its pidfd is closed when it comes. Where no
        pids cgroup of its own holds its threads (not root), wait (outside the loop's lock, up to ``EXIT_WAIT_S``)
        until it has exited: its threads count against the uid's RLIMIT_NPROC, which the next rollout shares."""
        loop = _io_loop()
        with loop.lock:
            self.closed = True
            pidfd, self.pidfd = self.pidfd, (-1 if self.pidfd is not None else None)
            pidfd = -1 if pidfd is None else pidfd
            if pidfd >= 0:
                try:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                except OSError:
                    pass
            loop.cells.discard(self)
            self.in_flight, self.out = False, None
            self.done.set()
            for fd in (self.cell_fd, self.reply_fd):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self.cell_fd = self.reply_fd = -1
            if self.server is not None:
                self.server.forget(self)
        if pidfd >= 0:
            if self.server is not None and self.server.pids_dir is None:
                _wait_exited(pidfd, EXIT_WAIT_S)
            with contextlib.suppress(OSError):
                os.close(pidfd)


EXIT_WAIT_S = 1.0  # not root: how long ``Interpreter.close`` waits for a killed interpreter to be gone


def _wait_exited(pidfd: int, seconds: float) -> bool:
    """Wait until the process of ``pidfd`` has exited, all its threads (the kernel makes a pidfd readable then)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(1000 * seconds))))


READY_FRAME = len(READY).to_bytes(4, "big") + READY


class _IOLoop:
    """The one thread of a process that reads and writes every interpreter's pipes and the servers' sockets.

    It never blocks on one of them: every fd is non-blocking and it sleeps only in ``poll`` over all of them (and a
    wake pipe), until the next cell's deadline. So a reply is stamped with the time it arrived and its interpreter
    stopped then, whatever any other interpreter does: one that does not read its cell, floods its pipe or never
    answers costs the loop a non-blocking call, and its own cell its own time. ``lock`` guards the loop's sets and
    every interpreter's cell state; nothing done under it waits."""

    def __init__(self):
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.cells: set[Interpreter] = set()  # a cell in flight: a write pending, a reply expected, or its pidfd
        self.servers: set[InterpreterServer] = set()  # servers whose spawns may be waiting for their answer
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.thread: threading.Thread | None = None

    def watch(self, server: InterpreterServer) -> None:
        with self.lock:
            self.servers.add(server)
        self.wake()

    def wake(self) -> None:
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="python-tool-io", daemon=True)
                self.thread.start()
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # a wake is pending already
            pass

    def _run(self) -> None:
        while True:
            try:
                self._turn()
            except Exception:  # noqa: BLE001 - never a dead loop: log, and go on with the others
                log.exception("PythonEnvironment: the tool's I/O loop")
                time.sleep(0.01)

    def _turn(self) -> None:
        now = time.monotonic()
        poller = select.poll()  # not select(): a trainer may hold fds past FD_SETSIZE
        poller.register(self._wake_r, select.POLLIN)
        readers, writers, socks = {}, {}, {}
        wake_at = None
        with self.lock:
            for it in list(self.cells):
                if now >= it.deadline:
                    if it.pidfd is not None:
                        it._read(it.deadline)  # a reply whole at the deadline still counts
                    it._finish(None, it.deadline)
                    continue
                wake_at = it.deadline if wake_at is None else min(wake_at, it.deadline)
                if it.pidfd is None:  # its spawn's answer is on its way
                    continue
                readers[it.reply_fd] = it
                poller.register(it.reply_fd, select.POLLIN)
                if it.out:
                    writers[it.cell_fd] = it
                    poller.register(it.cell_fd, select.POLLOUT)
            for server in list(self.servers):
                if not server._waiting:
                    self.servers.discard(server)
                    continue
                socks[server.sock.fileno()] = server
                poller.register(server.sock, select.POLLIN)
                give_up = server._waiting[0].asked_at + SPAWN_REPLY_S
                wake_at = give_up if wake_at is None else min(wake_at, give_up)
        wait_ms = -1 if wake_at is None else max(0, math.ceil(1000 * (wake_at - now)))
        ready = poller.poll(wait_ms)
        now = time.monotonic()  # the arrival time of everything ready
        with self.lock:
            for fd, _ in ready:
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    continue
                if fd in socks:
                    socks[fd]._answers(now)
                    continue
                it = readers.get(fd)  # an fd closed and reused meanwhile only gets a read or write that cannot block
                if it is not None and it.in_flight and not it.closed and it.reply_fd == fd:
                    it._read(now)
                it = writers.get(fd)
                if it is not None and it.in_flight and not it.closed and it.cell_fd == fd and it.out:
                    it._write()
            for server in list(self.servers):  # a spawn's give-up time
                if server._waiting and now - server._waiting[0].asked_at > SPAWN_REPLY_S:
                    server._answers(now)


_LOOP: _IOLoop | None = None
_LOOP_LOCK = threading.Lock()


def _io_loop() -> _IOLoop:
    """This process's I/O loop (a fork gets its own: the parent's thread is not in it)."""
    global _LOOP
    loop = _LOOP
    if loop is None or loop.pid != os.getpid():
        with _LOOP_LOCK:
            if _LOOP is None or _LOOP.pid != os.getpid():
                _LOOP = _IOLoop()
            loop = _LOOP
    return loop


def _after_fork_in_child() -> None:
    global _LOOP, _LOOP_LOCK
    _LOOP_LOCK = threading.Lock()  # the parent's may have been held by a thread that is not here
    _LOOP = None


os.register_at_fork(after_in_child=_after_fork_in_child)

WATCHDOG_S = 5.0  # past a cell's deadline, how long collect waits for the loop before it ends the cell itself


def collect(interp: Interpreter) -> tuple[str | None, float]:
    """Wait until ``interp``'s cell is over -> (its reply or None, the time it was over). The I/O loop reads every
    interpreter's reply as it arrives: this waits for this one's alone, whoever else is waiting."""
    while not interp.done.wait(max(0.0, interp.deadline - time.monotonic()) + WATCHDOG_S):
        loop = _io_loop()  # the loop should have ended it at its deadline: a loop that died is restarted
        with loop.lock:
            if interp.in_flight and time.monotonic() > interp.deadline + WATCHDOG_S:
                log.error("PythonEnvironment: the tool's I/O loop missed a deadline; ending the cell")
                interp._finish(None, interp.deadline)
        loop.wake()
    return interp.reply, interp.done_at
