"""The inner layers, entered inside the sandbox: standard library only (laid into the sandbox with the rest of
``code_sandbox/sandbox/``).

In each forked child that runs untrusted or test code (:func:`enter_layers`): new session, Landlock (read-only
system dirs, read-write own scratch dir only, no TCP, no signals or abstract sockets outside its domain), rlimits
(address space, CPU, open files, processes), then a seccomp filter that denies sockets, fork/exec, signals to
others, ptrace, process_vm_*, namespaces/mount, bpf, keyrings, io_uring, perf and System V IPC / POSIX message
queues. What does not depend on the process is set once on the server and inherited by every fork: no_new_privs,
and the file-size, core, locked-memory and message-queue limits. :func:`remove_tree` empties a scratch dir
whatever a child left in it. The outer layer (bubblewrap, uid, cgroups) is started from the host:
:mod:`..host.launcher`.
"""

from __future__ import annotations

import ctypes
import os
import resource
import struct
import time


# ---------------------------------------------------------------- rlimits
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
    second later), open files, processes/threads (``nproc`` 0: left as inherited, for a process whose threads a
    pids cgroup of its own bounds: RLIMIT_NPROC counts all of its uid's). Capped at the hard limits."""
    items = [
        (resource.RLIMIT_AS, mem_bytes, mem_bytes),
        (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),
        (resource.RLIMIT_NOFILE, nofile, nofile),
    ]
    return _capped(items + ([(resource.RLIMIT_NPROC, nproc, nproc)] if nproc else []))


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

X86_64 = os.uname().machine == "x86_64"
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
    runs = _action_runs(syscall_actions())
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
    _resolve_jumps(out, labels)
    return out


def _action_runs(acts: dict[int, str]) -> list[tuple[int, str]]:
    """``(first nr, action)`` for each run of equal actions over 0 .. 2**32-1 (a number not in ``acts``:
    ``"deny"``; the last run reaches 2**32-1)."""
    runs, prev = [], None
    for nr in range(max(acts) + 2):
        a = acts.get(nr, "deny")
        if a != prev:
            runs.append((nr, a))
            prev = a
    return runs


def _resolve_jumps(out: list, labels: dict[str, int]) -> None:
    """Each jump label (a str in ``jt`` / ``jf``) replaced, in place, by its offset from the next instruction;
    an offset outside classic BPF's 0..255 is an error."""
    for i, ins in enumerate(out):
        for j in (1, 2):
            if isinstance(ins[j], str):
                off = labels[ins[j]] - i - 1
                if not 0 <= off <= 255:
                    raise AssertionError(f"jump out of range at {i}")
                ins[j] = off


def seccomp_filter_bytes() -> bytes:
    """The classic-BPF program (``_assemble``)."""
    return b"".join(_bpf(*ins) for ins in _assemble())


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PROG = None  # (buffer, sock_fprog, its address), built once per worker and inherited by every fork


def seccomp_prepare():
    """Build the filter program once (in the worker, before it forks)."""
    global _PROG
    if _PROG is None and X86_64:
        raw = seccomp_filter_bytes()
        buf = ctypes.create_string_buffer(raw, len(raw))
        fprog = _SockFprog(len(raw) // 8, ctypes.cast(buf, ctypes.c_void_p))
        _PROG = (buf, fprog, ctypes.addressof(fprog))


def apply_seccomp() -> bool:
    """Install the allowlist filter on this process (and its threads). False where unsupported.
    Needs no_new_privs, which the worker sets once for itself and every fork."""
    if not X86_64:
        return False
    seccomp_prepare()
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, _PROG[2], 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")
    return True


# ---------------------------------------------------------------- a filesystem of one's own (the Python tool)
_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def private_tmpfs(path: str, size_bytes: int, max_inodes: int) -> None:
    """Give this process a mount namespace of its own with a fresh tmpfs on ``path`` (``size_bytes``, at most
    ``max_inodes`` files and dirs, mode 0700), then drop every capability. The namespace, and with it the tmpfs and
    everything in it (however deep or many), is freed by the kernel when the last process in it exits: nothing is
    left to clean. Needs CAP_SYS_ADMIN in the sandbox's user namespace (the tool's server holds it for this alone);
    OSError when it is refused. Mounts are made private first, so nothing mounted here reaches the server's
    namespace or another rollout's."""
    if _libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    if _libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None) != 0:
        raise OSError(ctypes.get_errno(), "making mounts private failed")
    opts = f"size={int(size_bytes)},nr_inodes={int(max_inodes)},mode=700".encode()
    flags = ctypes.c_ulong(_MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    if _libc.mount(b"tmpfs", path.encode(), b"tmpfs", flags, opts) != 0:
        raise OSError(ctypes.get_errno(), f"mounting a tmpfs on {path} failed")
    drop_capabilities()


def drop_capabilities() -> None:
    """Empty this process's effective, permitted and inheritable capability sets (the ambient set follows); with
    no_new_privs set and exec denied, nothing can bring them back."""
    header = struct.pack("=Ii", _LINUX_CAPABILITY_VERSION_3, 0)
    data = ctypes.create_string_buffer(24)  # two (effective, permitted, inheritable) u32 triples, all zero
    if _libc.capset(ctypes.c_char_p(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


# ---------------------------------------------------------------- entering them; cleaning up after a child
def _close_all_but(keep):
    """Close every fd above 2 except ``keep`` (a few ranged close calls, no fd moves)."""
    low = 3
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def enter_layers(keep, rlimits, ruleset, workdir, mode):
    """The inner layers of every sandboxed child, in this order: its own session, ``workdir`` (None: stay),
    Landlock (its ruleset is an fd: before the fds are closed), no fds but ``keep`` and 0-2, rlimits (NOFILE is
    low: after), seccomp. Under ``mode == "bwrap"`` a missing Landlock or seccomp ends the child (exit 71): the
    layer is promised there, so it fails closed."""
    os.setsid()
    if workdir is not None:
        os.chdir(workdir)
    if ruleset >= 0:
        landlock_enter(ruleset)
    elif mode == "bwrap":
        os._exit(71)
    _close_all_but(keep)
    apply_rlimits(rlimits)
    if not apply_seccomp() and mode == "bwrap":
        os._exit(71)


def remove_tree(top, keep_top=False, deadline=None) -> bool:
    """Remove ``top`` and all under it (iteratively: a child may nest dirs deeper than Python
    recurses), making dirs writable on the way (a child may chmod them); symlinks are removed,
    never followed. (Not shutil: importing it would map bz2, lzma and zlib into every fork.)
    True when it is all gone (``keep_top``: everything but ``top`` itself, left mode 0700); False
    when something could not be removed, or at ``deadline`` (time.monotonic()) if one is given."""
    dirs, stack, n = [], [top], 0

    def late():  # every 256 steps (a step: one entry, one dir), has the deadline passed?
        nonlocal n
        n += 1
        return deadline is not None and not n & 255 and time.monotonic() > deadline

    try:
        while stack:
            d = stack.pop()
            os.chmod(d, 0o700)
            dirs.append(d)
            with os.scandir(d) as entries:
                for e in entries:
                    if late():
                        return False
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    else:
                        os.unlink(e.path)
            if late():
                return False
        for d in reversed(dirs[1:] if keep_top else dirs):
            if late():
                return False
            os.rmdir(d)
        return True
    except OSError:
        return False
