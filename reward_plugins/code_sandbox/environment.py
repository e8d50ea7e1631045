"""``PythonEnvironment``: a sandboxed, persistent Python interpreter per rollout, as a TRL environment.

TRL's ``GRPOTrainer(environment_factory=PythonEnvironment)`` constructs instances once, calls ``reset(**row)``
before each rollout, and offers each public method as a tool, its schema read from the docstring. Here there is
one tool, ``python(code)``. Each rollout gets its own interpreter (a fresh fork of a clean, sandboxed server:
``interpreter.py``); the host side (this module) holds the server process and, per environment, the two pipe
ends of its current interpreter, and never runs a cell itself.

Bounds, each a keyword argument of ``PythonEnvironment`` (docs/python_tool.md has the table): a cell's time
(an alarm inside the interpreter, then SIGKILL from outside), the rollout's wall time (its calls together) and
CPU time (RLIMIT_CPU), the interpreter's address space, the characters of a cell and of a reply.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import select
import signal
import socket
import threading
import time

from .host import launcher
from .host.claim import PoolClaim
from .sandbox import interpreter, protocol

log = logging.getLogger(__package__)

#: the modules the server runs, laid out in its code dir under their package path (``pool.install_worker_code``'s way)
GRACE_S = 1.0  # after a cell's alarm, how long the interpreter may take to answer before it is killed

RESTARTED = "names, imports and files of earlier calls are gone"


@dataclasses.dataclass(frozen=True)
class ToolLimits:
    """The bounds of one rollout's interpreter (see docs/python_tool.md)."""

    timeout: float = 10.0  # wall seconds per cell
    rollout_timeout: float = 60.0  # wall seconds of all cells of one rollout together; also its CPU seconds
    memory_mb: int = 1024  # address space of the interpreter
    max_output_chars: int = 4000  # characters of one reply
    max_code_chars: int = 65536  # characters of one cell

    def __post_init__(self):
        for name in ("timeout", "rollout_timeout", "memory_mb", "max_output_chars", "max_code_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"PythonEnvironment: {name} must be a positive number, not {value!r}")
        if self.max_output_chars < 200:
            raise ValueError(f"PythonEnvironment: max_output_chars must be at least 200, not {self.max_output_chars}")


# ---------------------------------------------------------------- the server (host side)
class InterpreterServer:
    """One sandboxed fork server of interpreters (``interpreter.main``), shared by the environments of a process.

    Launched as ``pool._Worker`` launches the reward's workers: a claimed pool id (its code dir, uid and cgroups),
    bubblewrap (``launcher.worker_command``), a cgroup capping memory and processes of all its interpreters
    together (as root), an ordinary uid."""

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
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock, self._lock, self._next_id, self.cgroups = host, threading.Lock(), 0, []
        limits = protocol.dumps({"nproc": max_processes, "fsize": max_file_bytes}).decode()
        argv = launcher.worker_command(isolation_mode, launcher.sandbox_python(), self.claim.code_dir,
                                        child.fileno(), limits)  # fmt: skip
        # the server's own processes count too; a cgroup per server, under the claim
        mem = (memory_mb << 20) + (launcher.SCRATCH_MB << 20) + (128 << 20)
        self.proc, self.err, self.cgroups, _ = launcher.start_server(
            argv, child, uid, f"{self.claim.cgroup_name}/tool", mem, 2 * max_processes + 64)
        ready, _, _ = select.select([self.sock], [], [], 30)
        hello = self.sock.recv(4096) if ready else b""
        caps = protocol.loads(hello) if hello else {}
        problem = None
        if not hello:
            self.err.seek(0)
            problem = f"the interpreter server did not start: {self.err.read().decode(errors='replace')[-2000:]}"
        elif caps.get("uid") == 0:
            problem = "the interpreter server runs as root; refusing"
        elif isolation_mode == "bwrap" and not (caps.get("landlock") and caps.get("seccomp")):
            problem = f"Landlock ({caps.get('landlock')}) or seccomp ({caps.get('seccomp')}) is not available"
        if problem:
            self.close()
            raise launcher.IsolationUnavailable(f"PythonEnvironment: {problem}. " + launcher.INSTALL_HINT)

    def alive(self) -> bool:
        return self.proc.poll() is None and os.getpid() == self.pid

    def spawn(self, limits: ToolLimits) -> "Interpreter":
        """A fresh interpreter (the server forks it while the host goes on: nothing here waits for it)."""
        cell_r, cell_w = os.pipe2(os.O_CLOEXEC)
        reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
        cpu_s = max(1, int(limits.rollout_timeout + 0.999))
        with self._lock:
            self._next_id += 1
            ident = str(self._next_id)
            msg = f"spawn {ident} {limits.timeout!r} {cpu_s} {limits.memory_mb << 20} {limits.max_output_chars}"
            try:
                socket.send_fds(self.sock, [msg.encode()], [cell_r, reply_w])
            finally:
                os.close(cell_r)
                os.close(reply_w)
        os.set_blocking(cell_w, False)
        return Interpreter(self, ident, cell_w, reply_r)

    def kill(self, ident: str) -> None:
        with self._lock:
            try:
                self.sock.send(f"kill {ident}".encode())
            except OSError:
                pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        proc = getattr(self, "proc", None)
        if proc is not None and os.getpid() == self.pid:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.kill()
            proc.wait()
        if os.getpid() == self.pid:
            launcher.cgroup_remove(self.cgroups)
            self.claim.release()


_SERVERS: dict[str, InterpreterServer] = {}
_SERVERS_LOCK = threading.Lock()


def shared_server(isolation_mode: str) -> InterpreterServer:
    """This process's server for ``isolation_mode``, started (or restarted, if it died) on demand."""
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
    """The host's end of one interpreter: send a cell, wait for its reply within a deadline."""

    def __init__(self, server: InterpreterServer, ident: str, cell_fd: int, reply_fd: int):
        self.server, self.ident, self.cell_fd, self.reply_fd = server, ident, cell_fd, reply_fd

    def run(self, code: str, deadline: float, max_reply_bytes: int) -> str | None:
        """The interpreter's reply to ``code``, or None when it died, answered outside the protocol, or did not
        answer by ``deadline`` (time.monotonic())."""
        data = code.encode("utf-8", errors="replace")
        try:
            view = memoryview(len(data).to_bytes(4, "big") + data)
            while view:
                if not select.select([], [self.cell_fd], [], max(0.0, deadline - time.monotonic()))[1]:
                    return None
                view = view[os.write(self.cell_fd, view) :]
            head = self._read(4, deadline)
            n = int.from_bytes(head, "big") if head is not None else max_reply_bytes + 1
            body = self._read(n, deadline) if n <= max_reply_bytes else None
        except OSError:  # EPIPE: it is gone
            return None
        return None if body is None else body.decode("utf-8", errors="replace")

    def _read(self, n: int, deadline: float) -> bytes | None:
        chunks = []
        while n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.reply_fd], [], [], left)[0]:
                return None
            b = os.read(self.reply_fd, min(n, 1 << 16))
            if not b:
                return None
            chunks.append(b)
            n -= len(b)
        return b"".join(chunks)

    def close(self) -> None:
        self.server.kill(self.ident)
        for fd in (self.cell_fd, self.reply_fd):
            try:
                os.close(fd)
            except OSError:
                pass


# ---------------------------------------------------------------- the environment
class PythonEnvironment:
    """A sandboxed Python interpreter per rollout, for ``GRPOTrainer(environment_factory=PythonEnvironment)``.

    ``reset(**row)`` starts a fresh interpreter; ``python(code)`` is the model's tool. Options (all keyword
    arguments with defaults, so TRL can call the class with none; pass others with ``functools.partial``):
    ``timeout`` (s per cell), ``rollout_timeout`` (s of all cells of a rollout), ``memory_mb``,
    ``max_output_chars``, ``max_code_chars``, ``isolation`` ("bwrap", or the much weaker "rlimits").

    After each rollout ``stats`` holds its tool figures: ``calls``, ``errors`` (cells that raised),
    ``timeouts``, ``restarts`` (interpreters that died or hung and were replaced). ``cells`` holds the source of
    the rollout's cells that ran without an error, in order (for a ``get_reward`` that re-runs them through
    ``code_sandbox``'s verdict path; docs/python_tool.md).
    """

    def __init__(self, *, timeout: float = 10.0, rollout_timeout: float = 60.0, memory_mb: int = 1024,
                 max_output_chars: int = 4000, max_code_chars: int = 65536, isolation: str = "bwrap"):  # fmt: skip
        self.limits = ToolLimits(timeout, rollout_timeout, memory_mb, max_output_chars, max_code_chars)
        if isolation not in ("bwrap", "rlimits"):
            raise ValueError(f"PythonEnvironment: isolation must be 'bwrap' or 'rlimits', not {isolation!r}")
        self.isolation = isolation
        if isolation == "bwrap":  # refuse at construction, with the install hint, rather than at the first batch
            launcher.find_bwrap()
            launcher.sandbox_python()
        self._interpreter: Interpreter | None = None
        self._new_rollout()

    def _new_rollout(self) -> None:
        self.stats = {"calls": 0, "errors": 0, "timeouts": 0, "restarts": 0}
        self.cells: list[str] = []
        self._spent = 0.0

    def _fresh_interpreter(self) -> None:
        if self._interpreter is not None:
            self._interpreter.close()
        self._interpreter = None
        self._interpreter = shared_server(self.isolation).spawn(self.limits)

    def reset(self, **row) -> None:
        """Start the next rollout: a fresh interpreter (nothing of the last one is reachable), zeroed figures."""
        self._new_rollout()
        self._fresh_interpreter()
        return None

    def python(self, code: str) -> str:
        """Run Python code in a persistent interpreter and return its output.

        Variables, functions, imports and files persist between calls, like cells of a notebook. The reply holds
        what the code printed, the value of a last expression, or the traceback of an error. Only the standard
        library is available; there is no network.

        Args:
            code: The Python source code to run.
        """
        limits = self.limits
        if not isinstance(code, str):
            self.stats["errors"] += 1
            return f"error: code must be a string, not {type(code).__name__}"
        if len(code) > limits.max_code_chars:
            self.stats["errors"] += 1
            return f"error: the code has {len(code)} characters; at most {limits.max_code_chars} run in one call"
        left = limits.rollout_timeout - self._spent
        if left <= 0:
            self.stats["timeouts"] += 1
            return f"not run: this rollout's {limits.rollout_timeout:g} s of run time are used up"
        if self._interpreter is None:
            self._fresh_interpreter()
        self.stats["calls"] += 1
        start = time.monotonic()
        budget_cut = left < limits.timeout + GRACE_S  # the rollout's budget ends before the cell's own
        deadline = start + min(limits.timeout + GRACE_S, left)
        reply = self._interpreter.run(code, deadline, 4 * limits.max_output_chars + 64)
        self._spent += time.monotonic() - start
        if reply is None:
            return self._restart(start, budget_cut and time.monotonic() >= deadline)
        status, reply = reply[:1], interpreter.clip(reply[1:], limits.max_output_chars)
        if status == interpreter.STATUS_TIMEOUT:
            self.stats["timeouts"] += 1
        elif status == interpreter.STATUS_OK:
            self.cells.append(code)
        else:  # an error, or a status the interpreter made up (it is the rollout's own process: its loss)
            self.stats["errors"] += 1
        return reply

    def _restart(self, start: float, budget_cut: bool = False) -> str:
        """The interpreter hung past its deadline or died: replace it, and say so."""
        took = time.monotonic() - start
        self.stats["restarts"] += 1
        self._fresh_interpreter()
        self.cells = []
        if budget_cut:
            self.stats["timeouts"] += 1
            return (f"stopped after {took:.1f} s: this rollout's {self.limits.rollout_timeout:g} s of run time are "
                    f"used up; the interpreter was restarted: {RESTARTED}")  # fmt: skip
        if took >= self.limits.timeout:
            self.stats["timeouts"] += 1
            return f"timed out after {self.limits.timeout:g} s; the interpreter was restarted: {RESTARTED}"
        self.stats["errors"] += 1
        return (
            "the interpreter exited or broke its reply channel while running this code (its own exit, a crash, or "
            "its memory or CPU limit); "
            f"a fresh interpreter was started: {RESTARTED}"
        )

    # No public method but the tool: TRL offers every public method of an environment to the model. Closing is
    # ``with PythonEnvironment() as env:`` or garbage collection; the shared server goes at exit.
    def _close(self) -> None:
        if self._interpreter is not None:
            self._interpreter.close()
            self._interpreter = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._close()

    def __del__(self):
        try:
            self._close()
        except Exception:  # noqa: BLE001
            pass



# ---------------------------------------------------------------- scored by the row's tests
#: The dataset columns ``code_sandbox`` reads its tests from (docs/code_sandbox.md).
TEST_COLUMNS = ("tests", "test_setup_code", "test", "entry_point", "io_tests")
_DEFAULT_REWARD = None
_DEFAULT_REWARD_LOCK = threading.Lock()


class PythonTestsEnvironment(PythonEnvironment):
    """The Python tool for code tasks, with a ``get_reward()`` (TRL adds it as a reward column) that judges the
    rollout by the row's tests through ``code_sandbox``'s trusted verdict path.

    The program judged is the rollout's cells that ran without an error or a timeout, in order
    (``PythonEnvironment.cells``), run afresh in the reward's sandbox. Never the interpreter the model talked to:
    that process is the model's (it can redefine anything, print "all tests passed"), so nothing it says or holds
    is a verdict. A cell that raised is left out as a whole, also what it defined before the error. Rows need a
    test column (``tests``, ``test`` + ``entry_point`` or ``io_tests``); a row without one scores None (TRL
    ignores it). ``reward``: a ``code_sandbox(...)`` reward function to use (default: one with default options,
    shared by the process); every other keyword argument is ``PythonEnvironment``'s.
    """

    def __init__(self, *, reward=None, **options):
        super().__init__(**options)
        self._reward = reward
        self._tests: dict = {}
        self._prompt = None

    def reset(self, **row) -> None:
        self._tests = {k: row[k] for k in TEST_COLUMNS if k in row}
        self._prompt = row.get("prompt")
        return super().reset(**row)

    def get_reward(self) -> float | None:
        reward = self._reward or _default_reward()
        program = "\n\n".join(self.cells)
        completion = f"```python\n{program}\n```"
        score = reward(prompts=[self._prompt], completions=[completion], **{k: [v] for k, v in self._tests.items()})
        return score[0]


def _default_reward():
    global _DEFAULT_REWARD
    with _DEFAULT_REWARD_LOCK:
        if _DEFAULT_REWARD is None:
            from .plugin import CodeSandboxReward

            _DEFAULT_REWARD = CodeSandboxReward()
        return _DEFAULT_REWARD
