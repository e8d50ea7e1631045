"""The Python tool's sandbox side: a fork server of persistent interpreters, one per rollout.

Started by the host (``host.interpreter_server.InterpreterServer``) like the reward's worker, through
``launcher.worker_command`` (bubblewrap with every namespace, no network, a cleared environment,
read-only /usr, a size-capped tmpfs, an ordinary uid, cgroups where the host is root)::

    python -I -S -B CODE_DIR CTRL_FD ISOLATION LIMITS_JSON

The server is a zygote: it never reads a cell and holds nothing of any rollout. The host sends
``spawn <timeout_s> <cpu_s> <mem_bytes> <max_chars>`` with two pipe ends (cells in, replies out); the zygote forks
an interpreter that takes a mount namespace with a tmpfs of its own, drops its capabilities and locks itself down
(own session, Landlock on that tmpfs, rlimits, the seccomp allowlist) before it reads anything, and answers
``ok`` with a pidfd of it (``fail`` and none when the fork failed), one answer per request, in order. The host then
talks to that interpreter directly and stops, resumes and kills it through the pidfd; one that exits is reaped.
Each interpreter is a fresh fork of this clean loop, so nothing one rollout leaves (names, modules, files,
threads, freed memory) reaches another; every mount they share is read-only.

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
READY = b"r"  # the first frame of an interpreter, once it is locked down and before it reads a cell
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


# ---------------------------------------------------------------- the zygote (trusted, never reads a cell)
# Set once in ``main`` before any request, the same for every interpreter: nothing here is of a rollout.
RO_PATHS: list = []
MODE = ""
NPROC = 256  # RLIMIT_NPROC of each interpreter (shared by the uid); 0: not set (as root each has a pids cgroup)
NOFILE = 64
SCRATCH = "/tmp"  # under bwrap: each interpreter's own tmpfs, mounted here in its own mount namespace
SCRATCH_BYTES = 64 << 20
SCRATCH_INODES = 16384
SHARED_ROOT = "/tmp"  # "rlimits" mode (no namespaces): one dir per interpreter under it, named by its pid
REMOVE_BUDGET_S = 0.5  # "rlimits" mode: time to remove a dead interpreter's dir, once (what is left stays)


def _scratch_dir_of(pid: int) -> str:
    return os.path.join(SHARED_ROOT, f"code_sandbox-py-{pid}")


def _become_interpreter(cell_fd, reply_fd, timeout, cpu_s, mem, max_chars):
    """In the fork: a filesystem of its own, then the code_sandbox children's layers, then the REPL (never
    returns). Under bwrap the scratch is a fresh tmpfs in a mount namespace of its own (``layers.private_tmpfs``):
    no other rollout's files exist there, and every shared mount (/, /dev, /usr, the code) is read-only, so no
    chmod, utime or write of a cell reaches anything another rollout or a later interpreter uses."""
    if MODE == "bwrap":
        layers.private_tmpfs(SCRATCH, SCRATCH_BYTES, SCRATCH_INODES)
        scratch = SCRATCH
    else:
        scratch = _scratch_dir_of(os.getpid())
        if os.path.lexists(scratch) and not layers.remove_tree(scratch, deadline=time.monotonic() + REMOVE_BUDGET_S):
            os._exit(70)  # a leftover of an earlier interpreter with this pid that cannot be removed: fail closed
        os.mkdir(scratch, 0o700)
    ruleset = layers.landlock_ruleset(RO_PATHS, [scratch])  # here: the rule must name this tmpfs, not the shared /tmp
    rlimits = layers.rlimit_plan(mem, cpu_s, NPROC, NOFILE)
    layers.enter_layers([cell_fd, reply_fd], rlimits, ruleset, scratch, MODE)  # the code_sandbox children's layers
    write_frame(reply_fd, READY)  # locked down: the host counts it as started (no cell has been read yet)
    repl_loop(cell_fd, reply_fd, timeout, max_chars)


def spawn(fds, args) -> int:
    """Fork one interpreter on the pipe ends ``fds`` (cells in, replies out) with ``args`` (timeout, cpu_s, mem,
    max_chars) -> a pidfd of it (opened before it can be reaped, so never of a reused pid)."""
    timeout, cpu_s, mem, max_chars = float(args[0]), int(args[1]), int(args[2]), int(args[3])
    pid = os.fork()
    if pid == 0:
        try:
            _become_interpreter(fds[0], fds[1], timeout, cpu_s, mem, max_chars)
        except BaseException:  # noqa: BLE001
            pass
        os._exit(70)  # before the lockdown: the filter refuses 70 after it
    return os.pidfd_open(pid)


def reap() -> None:
    """Collect every child (and, as the namespace's pid 1, every orphan) that has exited; in "rlimits" mode
    remove its scratch dir, once, within ``REMOVE_BUDGET_S`` (the next interpreter with that pid fails closed on
    what is left). Nothing is remembered between calls."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if MODE != "bwrap":
            layers.remove_tree(_scratch_dir_of(pid), deadline=time.monotonic() + REMOVE_BUDGET_S)


def serve(sock) -> None:
    """The zygote's loop. It holds no state of any rollout: it never reads a cell, keeps no table of its
    interpreters (the host holds each one's pidfd, and stops, resumes and kills it through that), and has no
    files to clean up (each interpreter's tmpfs goes with its mount namespace). Each request is served in a frame
    of its own (``serve_one``), so nothing of one request is left in this loop's frame for the next fork to see:
    the image an interpreter is forked from is the same for every rollout (this loop, its modules, and the request
    being served: limits and two pipe ends, the same for every rollout of an environment)."""
    while True:
        reap()
        if select.select([sock], [], [], 2.0)[0] and not serve_one(sock):
            return


def serve_one(sock) -> bool:
    """Answer one request: ``ok`` with a pidfd of the interpreter forked for it, or ``fail``. False when the host
    is gone (then so are we, and our interpreters with us: we are their namespace's pid 1)."""
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 256, 2)
    except OSError:
        msg, fds = b"", []
    if not msg:
        return False
    reply, pidfd = b"fail", -1
    try:
        verb, *args = msg.decode("ascii").split()
        if verb == "spawn" and len(fds) == 2 and len(args) == 4:
            pidfd, reply = spawn(fds, args), b"ok"
    except Exception:  # noqa: BLE001 - a failed spawn is answered "fail"; the host sees its pipes close
        pass
    finally:
        for fd in fds:
            os.close(fd)
    try:  # one answer per request, in order: the host matches them to its spawns
        socket.send_fds(sock, [reply], [pidfd] if pidfd >= 0 else [])
    except OSError:
        return False
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    return True


def _probe_private_tmpfs() -> bool:
    """Can an interpreter get a tmpfs of its own here? (A forked probe tries it, as each interpreter will.)"""
    pid = os.fork()
    if pid == 0:
        try:
            layers.private_tmpfs(SCRATCH, 1 << 20, 64)
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    return os.waitpid(pid, 0)[1] == 0


def main(argv=None):
    """Serve the host until it closes the channel (see the module docstring)."""
    global RO_PATHS, MODE, NPROC, SCRATCH_BYTES, SCRATCH_INODES
    argv = sys.argv if argv is None else argv
    if len(argv) != 4:
        sys.stderr.write(USAGE + "\n")
        raise SystemExit(2)
    code_dir, ctrl_fd, MODE, limits = argv  # argv[0]: the code dir python was given
    limits = protocol.loads(limits.encode())
    NPROC = int(limits["nproc"])
    SCRATCH_BYTES, SCRATCH_INODES = int(limits["scratch_bytes"]), int(limits["scratch_inodes"])
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
    private = MODE == "bwrap" and _probe_private_tmpfs()
    if MODE != "bwrap":  # no namespaces: drop what this process may hold
        try:
            layers.drop_capabilities()
        except OSError:
            pass
    gc.collect()
    gc.freeze()
    os.dup2(null, 2)
    caps = {"ready": True, "uid": os.getuid(), "landlock": layers.landlock_abi(), "seccomp": layers.X86_64,
            "private_tmpfs": private}  # fmt: skip
    sock.send(protocol.dumps(caps))
    del caps, limits, argv
    serve(sock)
