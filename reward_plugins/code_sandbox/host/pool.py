"""Worker pool (host side): long-lived sandboxed fork servers, one request at a time each.

A request is a header with counts and limits plus file descriptors (memfds with the program, the
tests or stdin; the result pipe; stdout memfds): the worker never holds sample data itself. A
worker that dies, hangs past its deadline or answers nonsense is killed and replaced; the sample
it was running scores 0 and counts as an error.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import select
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..sandbox import protocol
from . import launcher
from .claim import PoolClaim

log = logging.getLogger(__package__)  # one logger for the whole package

MAX_RESULT_BYTES = 1 << 20
MAX_IO_CASES_PER_RUN = 100  # fds per message stay well under SCM_MAX_FD (253)


@dataclasses.dataclass(frozen=True)
class Limits:
    timeout: float = 5.0  # wall seconds per execution (an io case, or a whole assert/check run)
    memory_mb: int = 1024  # address space per sandboxed process
    max_output_bytes: int = 8 << 20  # stdout and any file a program writes
    max_processes: int = 64  # RLIMIT_NPROC of the sandbox uid (threads count; fork is denied anyway)
    max_value_bytes: int = 64 << 10  # value records of one sample (value path): more voids it; bounds host parsing
    sample_timeout: float | None = None  # wall seconds for all io cases of one sample (None: timeout)

    @property
    def io_budget(self) -> float:
        return self.timeout if self.sample_timeout is None else self.sample_timeout


@dataclasses.dataclass
class Job:
    mode: str  # "values" (verdicts on literal calls: routing.py), "call" (any asserts / check(candidate)) or "io"
    code: str
    n: int  # number of tests
    spec: dict | None = None  # call: tests for the tester process; values: {"exprs": [...]}
    inputs: list | None = None  # io: stdin per case
    expected: list | None = None  # io: expected stdout; values: routing.Expect per expression (never leave the host)
    one_test: bool = False  # values: the expressions form one test (a check() function) passing when all do
    budget: float | None = None  # io: wall seconds left for its cases (a part of a split sample gets what is left)


@dataclasses.dataclass
class Outcome:
    passed: list
    timeout: bool = False
    error: str | None = None  # "program" (did not load / crashed), "internal", "void"


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _header(limits: Limits) -> dict:
    """The limits as the worker applies them to each sandboxed process."""
    return {
        "timeout": limits.timeout,
        "sample": limits.io_budget,
        "cpu": int(limits.timeout) + 1,
        "mem": limits.memory_mb << 20,
        "fsize": limits.max_output_bytes,
        "nproc": limits.max_processes,
    }


class _Worker:
    def __init__(self, slot: int, uid: int | None, isolation_mode: str, python: str, code_dir: str, limits: Limits,
                 cgroup_name: str = ""):  # fmt: skip
        self.slot, self.mode = slot, isolation_mode
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = host
        argv = launcher.worker_command(isolation_mode, python, code_dir, child.fileno(), protocol.dumps(_header(limits)).decode())
        # cgroups under the pool's claim (claim.py), unique per worker start
        mem = 2 * (limits.memory_mb << 20) + (launcher.SCRATCH_MB << 20) + (256 << 20)
        self.proc, self.err, self.cgroups, argv = launcher.start_server(
            argv, child, uid, cgroup_name, mem, 2 * limits.max_processes + 16)
        ready, _, _ = select.select([self.sock], [], [], 30)
        hello = self.sock.recv(4096) if ready else b""
        if not hello:
            self.err.seek(0)
            why = self.err.read().decode(errors="replace").strip()[-2000:]
            self.kill()
            raise launcher.IsolationUnavailable(
                f"the sandbox worker did not start ({' '.join(argv[:1])} exited with "
                f"{self.proc.returncode}): {why or 'no message'}. " + launcher.INSTALL_HINT
            )
        caps = protocol.loads(hello)
        if caps.get("uid") == 0:
            self.kill()
            raise launcher.IsolationUnavailable("the sandbox worker runs as root; refusing")
        if isolation_mode == "bwrap" and not (caps.get("landlock") and caps.get("seccomp")):
            self.kill()
            raise launcher.IsolationUnavailable(
                f"Landlock (abi={caps.get('landlock')}) or seccomp (x86_64 only: {caps.get('seccomp')}) is not "
                "available in this kernel; the default isolation needs both. Use isolation='rlimits' to run weaker."
            )
        self.caps = caps

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, wait_s: float = 2.0) -> list[str]:
        """Kill the worker and remove its cgroups, waiting up to ``wait_s`` for them to empty.
        -> the cgroups still busy (the pool removes them later)."""
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
        return launcher.cgroup_remove(self.cgroups, wait_s)

    def run(self, job: Job, limits: Limits) -> Outcome:
        hdr = f"{job.mode} {job.n}"  # the worker has the pool's limits from its command line
        io_budget = limits.io_budget if job.budget is None else min(job.budget, limits.io_budget)
        hdr = (hdr + f" {max(1, int(io_budget * 1000))}" if job.mode == "io" else hdr).encode()
        code = job.code.encode("utf-8", errors="replace")
        if job.mode == "values":  # the calls only, never the expectations; then the program
            calls = "\n".join(["one" if job.one_test else "each", *job.spec["exprs"]]).encode()
            code_fd = _memfd("program", calls + b"\0" + code)
        else:
            code_fd = _memfd("program", code)
        if job.mode in ("call", "values"):
            res_r, res_w = os.pipe2(os.O_CLOEXEC)
            send, keep = [code_fd, res_w], [res_r]
            if job.mode == "call":
                send.insert(1, _memfd("tests", protocol.dumps(job.spec)))
            budget = limits.timeout + 10
        else:
            ins = [_memfd("stdin", (x or "").encode("utf-8", errors="replace")) for x in job.inputs]
            outs = [os.memfd_create("stdout", os.MFD_CLOEXEC) for _ in job.inputs]
            send, keep = [code_fd, *ins, *outs], outs
            budget = io_budget + 10
        deadline = time.monotonic() + budget
        try:
            try:
                socket.send_fds(self.sock, [hdr], send)
            finally:
                for fd in send:
                    if fd not in keep:
                        os.close(fd)
            raw, overflow = b"", False
            if job.mode != "io":
                cap = MAX_RESULT_BYTES if job.mode == "call" else limits.max_value_bytes
                raw, reply, overflow = self._results(res_r, deadline, cap)
                if overflow:  # closed there: its writer's next write fails at once
                    keep.remove(res_r)
            else:  # io: stdout is in the memfds, only the reply to wait for
                _, reply, _ = self._results(None, deadline, 0)
            if overflow:  # more than a sample may send: none of it is read
                return Outcome([False] * job.n, timeout=bool(reply.get("timeout")), error="void")
            if job.mode != "io":
                if job.mode == "call":  # reading what a sample sent never takes longer than it may run
                    passed, status, flags = protocol.parse_records(raw, job.n, seconds=limits.timeout)
                else:
                    passed, status, flags = protocol.parse_values(raw, job.expected, seconds=limits.timeout)
                    if job.one_test:
                        passed = [all(passed)]
                err = "void" if status != "ok" else ("program" if "load_error" in flags else None)
                return Outcome(passed, timeout=bool(reply.get("timeout")), error=err)
            cases = reply.get("cases")
            if type(cases) is not list or len(cases) != job.n:
                raise RuntimeError("bad io reply")
            passed, crashed = [], False
            for case, fd, want in zip(cases, outs, job.expected):
                if case is None:  # not run: an earlier case timed out
                    passed.append(False)
                    continue
                code, timed_out = case
                crashed |= code != 0 and not timed_out
                # read only what a matching output can be (the size from the memfd, not its bytes): comparing
                # costs the host time in the expected output's size, never in what the program chose to print
                size = os.fstat(fd).st_size
                if code != 0 or timed_out or size > min(limits.max_output_bytes, protocol.output_bound(want)):
                    passed.append(False)
                    continue
                os.lseek(fd, 0, os.SEEK_SET)
                passed.append(protocol.same_output(os.read(fd, size), want))
            return Outcome(passed, timeout=bool(reply.get("timeout")), error="program" if crashed else None)
        finally:
            for fd in keep:
                os.close(fd)

    def _results(self, fd, deadline, cap) -> tuple[bytes, dict, bool]:
        """The result pipe ``fd`` (None: none) to its end and the worker's reply, waited for together: one wakeup
        when both are there. -> (bytes, reply, overflow): past ``cap`` bytes the pipe is closed (overflow True:
        the caller must not close it again) and nothing more is read, so that reading costs at most ``cap``."""
        chunks, total, reply, overflow = [], 0, None, False
        while fd is not None or reply is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no end of results or no reply before the deadline")
            ready, _, _ = select.select([f for f in (fd, None if reply else self.sock) if f is not None], [], [], left)
            if self.sock in ready:
                reply = self._read_reply()
            if fd in ready:
                b = os.read(fd, min(65536, cap + 1 - total))
                total += len(b)
                if not b:
                    fd = None
                elif total > cap:
                    os.close(fd)
                    fd, overflow, chunks = None, True, []
                else:
                    chunks.append(b)
        return b"".join(chunks), reply, overflow

    def _read_reply(self) -> dict:
        msg = self.sock.recv(1 << 16)
        if not msg:
            raise EOFError("worker closed its channel")
        reply = protocol.loads(msg)
        if type(reply) is not dict or "internal" in reply:
            raise RuntimeError(f"worker error: {reply}")
        return reply


class SandboxPool:
    """``num_workers`` sandboxed fork servers; ``run(jobs)`` spreads a batch over them."""

    def __init__(self, isolation_mode: str = "bwrap", num_workers: int | None = None, limits: Limits = Limits()):
        if isolation_mode not in ("bwrap", "rlimits"):
            raise ValueError(f"isolation must be 'bwrap' or 'rlimits', not {isolation_mode!r}")
        if isolation_mode == "bwrap":
            launcher.find_bwrap()
        self.mode, self.limits = isolation_mode, limits
        # one more than the cores by default: the spare worker forks while another waits on the host
        # (or the host on it); with more, a long execution shares its core with more workers and
        # finishes last. The comparison (benchmarks/sandbox.py --workers N): docs/benchmarks.md.
        self.n = max(1, min(16, num_workers or len(os.sched_getaffinity(0)) + 1))
        self.python = launcher.sandbox_python()
        self.pid = os.getpid()
        self.claim = PoolClaim.acquire()  # a random id, claimed; what dead pools left is reclaimed first
        self.uids = [launcher.slot_uid(s, self.claim.id) for s in range(self.n)]
        self._dir = self.claim.code_dir
        launcher.install_sandbox_code(self._dir, "worker")
        self._idle: queue.Queue = queue.Queue()
        for slot in range(self.n):
            self._idle.put([slot, None])
        self._exec = ThreadPoolExecutor(self.n, thread_name_prefix="code_sandbox")
        self._lock = threading.Lock()
        self.closed = False
        self.restarts = 0
        self._starts = 0  # worker starts: each gets its own cgroups
        self._busy_cgroups: list[str] = []  # of killed workers, not empty yet: removed later

    def start(self):
        """Start every worker now (in parallel); raises IsolationUnavailable when it cannot."""
        slots = [self._idle.get() for _ in range(self.n)]
        try:
            list(self._exec.map(self._ensure, slots))
        finally:
            for s in slots:
                self._idle.put(s)

    def _ensure(self, slot):
        if slot[1] is None or not slot[1].alive():
            if slot[1] is not None:
                self._retire(slot[1])
                self.restarts += 1
            slot[1] = None
            with self._lock:
                self._starts += 1
                name = f"{self.claim.cgroup_name}/w{slot[0]}.{self._starts}"
                busy, self._busy_cgroups = self._busy_cgroups, []
            self._retire(None, busy)
            slot[1] = _Worker(slot[0], self.uids[slot[0]], self.mode, self.python, self._dir, self.limits, name)
        return slot[1]

    def _retire(self, worker, busy=()):
        """Kill ``worker`` without waiting for its cgroups to empty (a worker killed with a tmpfs
        full of files takes a while to go: not the sample's time); they, and ``busy``, are removed
        when empty, at a later start or at close."""
        left = launcher.cgroup_remove(busy, 0) + (worker.kill(wait_s=0) if worker is not None else [])
        with self._lock:
            self._busy_cgroups += left

    def _one(self, job: Job) -> Outcome:
        slot = self._idle.get()
        try:
            worker = self._ensure(slot)
            try:
                return worker.run(job, self.limits)
            except launcher.IsolationUnavailable:
                raise
            except Exception as e:  # noqa: BLE001 - never crash training: replace the worker, score 0
                log.warning("code_sandbox worker %d failed (%s); replacing it", slot[0], e)
                self._retire(worker)
                slot[1] = None
                self.restarts += 1
                return Outcome([False] * job.n, error="internal")
        finally:
            self._idle.put(slot)

    def run(self, jobs: list[Job]) -> list[Outcome]:
        out = []
        for job in jobs:  # split huge io test lists (fd-passing limit), keep order
            if job.mode == "io" and job.n > MAX_IO_CASES_PER_RUN:
                parts = []
                for k in range(0, job.n, MAX_IO_CASES_PER_RUN):
                    sl = slice(k, k + MAX_IO_CASES_PER_RUN)
                    parts.append(Job("io", job.code, len(job.inputs[sl]), inputs=job.inputs[sl], expected=job.expected[sl]))
                out.append(parts)
            else:
                out.append([job])
        flat = [j for parts in out for j in parts]
        shared = {}  # id(part) -> what the parts of one split io sample share: a timeout, and when it began
        for parts in out:
            if len(parts) > 1:
                sample = {"stop": threading.Event(), "start": []}
                shared.update((id(j), sample) for j in parts)

        def one(job: Job) -> Outcome:  # the parts of one io sample share its budget; none starts after a timeout
            sample = shared.get(id(job))
            if sample is None:
                return self._one(job)
            with self._lock:
                start = sample["start"] or [time.monotonic()]
                sample["start"] = start
            left = self.limits.io_budget - (time.monotonic() - start[0])
            if sample["stop"].is_set() or left <= 0:
                return Outcome([False] * job.n, timeout=True)
            outcome = self._one(dataclasses.replace(job, budget=left))
            if outcome.timeout:
                sample["stop"].set()
            return outcome

        results = iter(list(self._exec.map(one, flat)))
        merged = []
        for parts in out:
            rs = [next(results) for _ in parts]
            passed = [p for r in rs for p in r.passed]
            errs = [r.error for r in rs if r.error]
            merged.append(Outcome(passed, any(r.timeout for r in rs), errs[0] if errs else None))
        return merged

    def close(self):
        if self.closed:
            return
        self.closed = True
        if os.getpid() == self.pid:
            while True:
                try:
                    slot = self._idle.get_nowait()
                except queue.Empty:
                    break
                if slot[1] is not None:
                    self._retire(slot[1])
            self._exec.shutdown(wait=False)
            self.claim.release()  # every cgroup of the pool (killed workers' too) and the code dir

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
