"""The Python tool's sandbox side: a fork server of persistent interpreters, one per rollout.

Started by the host (``environment.InterpreterServer``) like the reward's worker, through
``isolation.worker_command`` (bubblewrap with every namespace, no network, a cleared environment,
read-only /usr, a size-capped tmpfs, an ordinary uid, cgroups where the host is root)::

    python -I -S -B CODE_DIR CTRL_FD ISOLATION LIMITS_JSON

The server never reads a cell: the host sends ``spawn <id> <timeout_s> <cpu_s> <mem_bytes> <max_chars>``
with two pipe ends (cells in, replies out), and the server forks an interpreter that locks itself down
(own session, Landlock on its own fresh scratch dir, rlimits, the seccomp allowlist) before it reads
anything. The host then talks to that interpreter directly. ``kill <id>`` ends one; one that exits by
itself is reaped. Each interpreter is a fresh fork of this clean process, so nothing one rollout
leaves (names, modules, files, threads, freed memory) reaches another.

Frames both ways: a 4-byte big-endian length, then UTF-8 text: a cell; a status character and its rendered result.
"""

import ast

# Modules a tool cell commonly imports, loaded once here so that an interpreter starts with them in
# memory (an import in a cell then costs a dict lookup); stdlib only: the sandbox runs ``python -I -S``.
import bisect  # noqa: E401,F401,E501
import gc
import linecache
import math  # noqa: E401,F401
import os
import select
import signal
import socket
import sys
import time
import traceback

from . import layers, protocol

USAGE = "usage: python -I -S -B CODE_DIR CTRL_FD ISOLATION LIMITS_JSON (PythonEnvironment starts this server)"
MAX_FRAME = 1 << 24  # a cell (the host bounds it far lower) or a reply
STATUS_OK, STATUS_ERROR, STATUS_TIMEOUT = "o", "e", "t"  # the first character of a reply frame
NO_OUTPUT = "(no output)"
_read, _write = os.read, os.write  # bound here: a cell that rebinds os.read/os.write breaks only itself


class CellTimeout(BaseException):
    """Raised in a cell when its time is up (a BaseException: ``except Exception`` in a cell does not eat it)."""


# ---------------------------------------------------------------- frames
def read_frame(fd: int, limit: int = MAX_FRAME) -> bytes:
    """One frame from ``fd``; EOFError at the end, ValueError for a length over ``limit``."""
    head = _read_exactly(fd, 4)
    n = int.from_bytes(head, "big")
    if n > limit:
        raise ValueError(f"frame of {n} bytes")
    return _read_exactly(fd, n)


def _read_exactly(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        b = _read(fd, min(n, 1 << 20))
        if not b:
            raise EOFError
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def write_frame(fd: int, data: bytes) -> None:
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[_write(fd, view) :]


# ---------------------------------------------------------------- one interpreter (untrusted code runs here)
class CappedText:
    """A text stream (``sys.stdout``/``sys.stderr`` of a cell) that keeps its first ``limit`` characters
    and counts the rest."""

    encoding, errors = "utf-8", "replace"

    def __init__(self, limit: int):
        self.limit, self.parts, self.kept, self.dropped = limit, [], 0, 0

    def write(self, s):
        if type(s) is not str:
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        room = self.limit - self.kept
        if room > 0:
            self.parts.append(s[:room])
            self.kept += min(len(s), room)
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def flush(self):
        pass

    def isatty(self):
        return False

    def writable(self):
        return True

    def text(self) -> str:
        more = f"\n[... {self.dropped} more characters of output not shown]\n" if self.dropped else ""
        return "".join(self.parts) + more


def clip(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: its head (2/3) and tail (1/3) around a marker saying how much is cut."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters cut ...]\n"
    keep = max(0, limit - len(marker))
    head = keep * 2 // 3
    return text[:head] + marker + text[len(text) - (keep - head) :]


def format_error(e: BaseException) -> str:
    """The traceback of an exception raised in a cell, from the cell's own frames on (the REPL's are left out)."""
    tb = e.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next
    if tb is None:
        return "".join(traceback.format_exception_only(type(e), e))
    return "".join(traceback.format_exception(type(e), e, tb, limit=-20))


def _on_alarm(signum, frame):
    raise CellTimeout


def run_cell(src: str, ns: dict, number: int, timeout: float, max_chars: int) -> tuple[str, str]:
    """Run one cell in ``ns`` like a notebook -> (status, text). The text: what it printed (stdout and stderr, in
    order), then the repr of a last expression (when not None, also bound to ``_``), or the trimmed traceback of
    an error; within ``max_chars`` characters. The status: ``STATUS_OK``, ``STATUS_ERROR`` or ``STATUS_TIMEOUT``.
    The cell and the rendering of its result run under a ``timeout`` s alarm."""
    out = CappedText(max_chars)
    saved = sys.stdout, sys.stderr
    tail, status = "", STATUS_OK
    try:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            sys.stdout = sys.stderr = out
            name = f"<cell {number}>"
            try:
                tree = ast.parse(src, name)
                last = None
                if tree.body and isinstance(tree.body[-1], ast.Expr):
                    last = ast.Expression(tree.body.pop().value)
                linecache.cache[name] = (len(src), None, src.splitlines(True), name)
                exec(compile(tree, name, "exec"), ns)
                if last is not None:
                    value = eval(compile(last, name, "eval"), ns)
                    if value is not None:
                        ns["_"] = value
                        tail = clip(repr(value), max_chars // 2) + "\n"
            except CellTimeout:
                raise
            except BaseException as e:  # noqa: BLE001 - SystemExit too: a cell's exit does not end the rollout
                tail, status = clip(format_error(e), max_chars // 2), STATUS_ERROR
            text = out.text()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout, sys.stderr = saved
    except CellTimeout:
        text, tail, status = out.text(), f"timed out after {timeout:g} s\n", STATUS_TIMEOUT
    text = clip(text, max(0, max_chars - len(tail))) + tail
    return status, text if text.strip() else NO_OUTPUT


def repl_loop(cell_fd: int, reply_fd: int, timeout: float, max_chars: int) -> None:
    """Serve cells from ``cell_fd`` until it closes, one reply frame each; the namespace persists."""
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    number = 0
    while True:
        try:
            src = read_frame(cell_fd).decode("utf-8", errors="replace")
        except (EOFError, ValueError, OSError):
            os._exit(0)
        number += 1
        status, text = run_cell(src, ns, number, timeout, max_chars)
        write_frame(reply_fd, (status + text).encode("utf-8", errors="replace"))


# ---------------------------------------------------------------- the fork server (trusted, never reads a cell)
RO_PATHS: list = []
MODE = ""
NPROC = 256
NOFILE = 64


def _spawn(fds, timeout, cpu_s, mem, max_chars):
    """Fork one interpreter on the pipe ends ``fds`` -> (pid, its scratch dir)."""
    cell_fd, reply_fd = fds
    scratch = os.path.join("/tmp", f"py-{os.urandom(8).hex()}")
    os.mkdir(scratch, 0o700)
    ruleset = layers.landlock_ruleset(RO_PATHS, [scratch])
    rlimits = layers.rlimit_plan(mem, cpu_s, NPROC, NOFILE)
    pid = os.fork()
    if pid == 0:
        try:
            layers.enter_layers([cell_fd, reply_fd], rlimits, ruleset, scratch, MODE)  # the code_sandbox children's layers
            repl_loop(cell_fd, reply_fd, timeout, max_chars)
        except BaseException:  # noqa: BLE001
            pass
        os._exit(70)  # before the lockdown: the filter refuses 70 after it
    if ruleset >= 0:
        os.close(ruleset)
    return pid, scratch


class Server:
    """The interpreters this server runs: host id -> pid, pid -> scratch dir; dirs still to remove."""

    CLEAN_BUDGET_S = 0.2  # per pass of the loop: a dir full of files is removed over several passes

    def __init__(self):
        self.pids, self.dirs, self.trash = {}, {}, []

    def handle(self, msg: bytes, fds: list) -> None:
        try:
            verb, *args = msg.decode("ascii").split()
            if verb == "spawn" and len(fds) == 2 and len(args) == 5:
                ident, timeout, cpu_s, mem, max_chars = args
                pid, scratch = _spawn(fds, float(timeout), int(cpu_s), int(mem), int(max_chars))
                self.pids[ident], self.dirs[pid] = pid, scratch
            elif verb == "kill" and len(args) == 1:
                pid = self.pids.pop(args[0], None)
                if pid is not None:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
        finally:
            for f in fds:
                os.close(f)

    def reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            scratch = self.dirs.pop(pid, None)
            if scratch is not None:
                self.trash.append(scratch)
        self.pids = {k: p for k, p in self.pids.items() if p in self.dirs}
        deadline = time.monotonic() + self.CLEAN_BUDGET_S
        while self.trash and time.monotonic() < deadline:
            if layers.remove_tree(self.trash[-1], deadline=deadline):
                self.trash.pop()


def main(argv=None):
    """Serve the host until it closes the channel (see the module docstring)."""
    global RO_PATHS, MODE, NPROC
    argv = sys.argv if argv is None else argv
    if len(argv) != 4:
        sys.stderr.write(USAGE + "\n")
        raise SystemExit(2)
    code_dir, ctrl_fd, MODE, limits = argv  # argv[0]: the code dir python was given
    limits = protocol.loads(limits.encode())
    NPROC = int(limits["nproc"])
    RO_PATHS = sorted({"/usr", code_dir, sys.prefix, sys.base_prefix, os.path.dirname(os.__file__)})
    RO_PATHS += ["/dev/null", "/dev/urandom", "/dev/zero"]
    os.environ.clear()
    sys.set_int_max_str_digits(0)  # the tool does arithmetic on big numbers; a cell's own time bounds the cost
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    sock = socket.socket(fileno=int(ctrl_fd))
    os.dup2(null, 0)
    os.dup2(null, 1)
    layers.no_new_privs()
    layers.apply_rlimits(layers.worker_rlimit_plan(int(limits["fsize"])))
    layers.seccomp_prepare()
    gc.collect()
    gc.freeze()
    os.dup2(null, 2)
    caps = {"ready": True, "uid": os.getuid(), "landlock": layers.landlock_abi(), "seccomp": layers.X86_64}
    sock.send(protocol.dumps(caps))
    server = Server()
    while True:
        ready, _, _ = select.select([sock], [], [], 0.5 if server.trash else 2.0)
        if ready:
            try:
                msg, fds, _, _ = socket.recv_fds(sock, 256, 4)
            except OSError:
                msg, fds = b"", []
            if not msg:  # the host is gone: our interpreters go with us (we are their namespace's pid 1)
                for pid in server.dirs:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                return
            try:
                server.handle(msg, fds)
            except Exception:  # noqa: BLE001 - a failed spawn: the host sees its pipes close
                pass
        server.reap()
