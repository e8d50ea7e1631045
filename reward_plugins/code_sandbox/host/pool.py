"""Untrusted code in a sandbox: the reward's pool of long-lived sandboxed fork servers, one job at a time each.

The contract: what runs is code a model wrote, so every worker is a sandbox server (``launcher.SandboxedServer``:
bubblewrap, an unprivileged uid, cgroups; inside, rlimits, Landlock and seccomp per process) and each execution's
limits are applied inside it. (Trusted checks of untrusted input, with a deadline but no sandbox, are
``boxed_math``'s ``DeadlinePool``.)

This module is transport only: a job (``verdict``) goes to a worker as a header with counts plus file descriptors
(memfds with the program, the tests or stdin; the result pipe; stdout memfds), so the worker never holds sample
data itself, and what comes back is read by ``verdict``. A worker that dies, hangs past its deadline or answers
nonsense is killed and replaced; the job it was running fails as ``internal``. A worker that cannot start (no hello
within ``launcher.SandboxedServer.HELLO_TIMEOUT``, or it exited first) is counted in ``start_failures``, never
raised; the job that needed it fails as ``unstarted``, and after ``START_ATTEMPTS`` x ``num_workers`` failed starts
in one ``run`` call the jobs that need a new worker fail so at once (a machine where nothing starts costs bounded
time). The pool only reports those two; the plugin runs such a job again and decides by a control sample
(``plugin.CodeSandboxReward.attribute``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .. import verdict
from ..sandbox import protocol
from . import launcher
from .claim import PoolClaim

log = logging.getLogger(__package__)  # one logger for the whole package

MAX_RESULT_BYTES = 1 << 20
MAX_IO_CASES_PER_RUN = 100  # fds per message stay well under SCM_MAX_FD (253)
#: Failed worker starts one ``run`` call may try, per worker of the pool, before it stops starting more.
START_ATTEMPTS = 2


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


class _Worker(launcher.SandboxedServer):
    """One sandboxed fork server (``sandbox/worker.py``) of a pool: one job at a time. ``run`` carries the job
    there and the raw results back; ``verdict`` reads them."""

    def __init__(self, uid: int | None, isolation_mode: str, python: str, code_dir: str, limits: Limits,
                 cgroup_name: str = ""):  # fmt: skip
        # cgroups under the pool's claim (claim.py), unique per worker start
        mem = 2 * (limits.memory_mb << 20) + (launcher.SCRATCH_MB << 20) + (256 << 20)
        header = protocol.dumps(_header(limits)).decode()
        command = lambda fd: launcher.worker_command(isolation_mode, python, code_dir, fd, header)  # noqa: E731
        super().__init__("the sandbox worker", isolation_mode, command, uid, cgroup_name, mem, 2 * limits.max_processes + 16)

    def run(self, job: verdict.Job, limits: Limits) -> verdict.Outcome:
        """Send ``job`` (its program and tests as memfds, a result pipe or stdout memfds) and read what comes back
        by its path's reader. Raises on a worker that breaks the protocol or misses its deadline (the pool replaces
        it)."""
        if isinstance(job, verdict.IoJob):
            return self._run_io(job, limits)
        code = job.code.encode("utf-8", errors="replace")
        if isinstance(job, verdict.ValuesJob):  # the calls only, never the expectations; then the program
            calls = "\n".join(["one" if job.one_test else "each", *job.calls]).encode()
            send = [_memfd("program", calls + b"\0" + code)]
            cap = limits.max_value_bytes
        else:
            send = [_memfd("program", code), _memfd("tests", protocol.dumps(job.tester_input()))]
            cap = MAX_RESULT_BYTES
        res_r, res_w = os.pipe2(os.O_CLOEXEC)
        keep = [res_r]
        try:
            self._send(f"{job.mode} {job.n}", [*send, res_w], keep)
            raw, reply, overflow = self._results(res_r, time.monotonic() + limits.timeout + 10, cap)
            if overflow:  # closed there: its writer's next write fails at once; none of it is read
                keep.remove(res_r)
                return verdict.failed(job, timeout=bool(reply.get("timeout")), error="void")
        finally:
            for fd in keep:
                os.close(fd)
        # reading what a sample sent never takes longer than it may run
        read = verdict.read_values if isinstance(job, verdict.ValuesJob) else verdict.read_records
        return read(job, raw, bool(reply.get("timeout")), limits.timeout)

    def _run_io(self, job: verdict.IoJob, limits: Limits) -> verdict.Outcome:
        budget = limits.io_budget if job.budget is None else min(job.budget, limits.io_budget)
        ins = [_memfd("stdin", (x or "").encode("utf-8", errors="replace")) for x in job.inputs]
        outs = [os.memfd_create("stdout", os.MFD_CLOEXEC) for _ in job.inputs]
        code_fd = _memfd("program", job.code.encode("utf-8", errors="replace"))
        try:
            self._send(f"io {job.n} {max(1, int(budget * 1000))}", [code_fd, *ins, *outs], outs)
            _, reply, _ = self._results(None, time.monotonic() + budget + 10, 0)  # stdout is in the memfds
            return verdict.read_io(job, reply.get("cases"), outs, bool(reply.get("timeout")), limits.max_output_bytes)
        finally:
            for fd in outs:
                os.close(fd)

    def _send(self, header: str, fds: list[int], keep: list[int]) -> None:
        """``header`` (the worker has the pool's limits from its command line) and ``fds``; ours of them are closed
        after, but for ``keep``."""
        try:
            socket.send_fds(self.sock, [header.encode()], fds)
        finally:
            for fd in fds:
                if fd not in keep:
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


class _Starts:
    """The worker starts that failed during one ``run`` call (its threads share it), up to ``limit``."""

    def __init__(self, limit: int):
        self.limit, self.failed = limit, 0
        self._lock = threading.Lock()

    def exhausted(self) -> bool:
        return self.failed >= self.limit

    def fail(self) -> None:
        with self._lock:
            self.failed += 1


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
        self.start_failures = 0  # workers that could not start, over the pool's life
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
            slot[1] = _Worker(self.uids[slot[0]], self.mode, self.python, self._dir, self.limits, name)
        return slot[1]

    def _retire(self, worker, busy=()):
        """Kill ``worker`` without waiting for its cgroups to empty (a worker killed with a tmpfs
        full of files takes a while to go: not the sample's time); they, and ``busy``, are removed
        when empty, at a later start or at close."""
        left = launcher.cgroup_remove(busy, 0) + (worker.kill(wait_s=0) if worker is not None else [])
        with self._lock:
            self._busy_cgroups += left

    def run_one(self, job: verdict.Job, starts: _Starts | None = None) -> verdict.Outcome:
        """Run one job on the next idle worker. A worker that fails (dies, misses its deadline, breaks the
        protocol) is replaced; the job fails with an ``internal`` error. A worker that cannot start, or one not
        started because ``starts`` is exhausted: the job fails with an ``unstarted`` error, never raised (the
        plugin tells both apart from a wrong answer)."""
        slot = self._idle.get()
        try:
            if starts is not None and starts.exhausted() and (slot[1] is None or not slot[1].alive()):
                return verdict.failed(job, error="unstarted")
            try:
                worker = self._ensure(slot)
            except launcher.ServerDidNotStart as e:  # no hello: a loaded machine, or a broken one; counted
                return self._start_failed(slot, job, e, starts)
            except launcher.IsolationUnavailable:  # a server that started and showed the isolation missing
                raise
            except Exception as e:  # noqa: BLE001 - no sandbox could start: the machinery's failure, never the sample's
                return self._start_failed(slot, job, e, starts)
            try:
                return worker.run(job, self.limits)
            except launcher.IsolationUnavailable:
                raise
            except Exception as e:  # noqa: BLE001 - never crash training: replace the worker, score 0
                log.warning("code_sandbox worker %d failed (%s); replacing it", slot[0], e)
                self._retire(worker)
                slot[1] = None
                self.restarts += 1
                return verdict.failed(job, error="internal")
        finally:
            self._idle.put(slot)

    def _start_failed(self, slot, job: verdict.Job, error: Exception, starts: _Starts | None) -> verdict.Outcome:
        log.warning("code_sandbox worker %d could not start (%s)", slot[0], error)
        slot[1] = None
        with self._lock:
            self.start_failures += 1
        if starts is not None:
            starts.fail()
        return verdict.failed(job, error="unstarted")

    def run(self, jobs: list[verdict.Job]) -> list[verdict.Outcome]:
        """The outcomes of ``jobs``, in order, spread over the workers. An io job with more cases than one message
        may carry runs in parts that share its budget (``Limits.io_budget``): none starts after one timed out."""
        starts = _Starts(START_ATTEMPTS * self.n)
        split = [job.parts(MAX_IO_CASES_PER_RUN) if isinstance(job, verdict.IoJob) else [job] for job in jobs]
        shared = {}  # id(part) -> what the parts of one split io sample share: a timeout, and when it began
        for parts in split:
            if len(parts) > 1:
                sample = {"stop": threading.Event(), "start": []}
                shared.update((id(j), sample) for j in parts)

        def one(job: verdict.Job) -> verdict.Outcome:
            sample = shared.get(id(job))
            if sample is None:
                return self.run_one(job, starts)
            with self._lock:
                start = sample["start"] or [time.monotonic()]
                sample["start"] = start
            left = self.limits.io_budget - (time.monotonic() - start[0])
            if sample["stop"].is_set() or left <= 0:
                return verdict.failed(job, timeout=True)
            outcome = self.run_one(dataclasses.replace(job, budget=left), starts)
            if outcome.timeout:
                sample["stop"].set()
            return outcome

        results = iter(list(self._exec.map(one, [j for parts in split for j in parts])))
        return [verdict.merge([next(results) for _ in parts]) for parts in split]

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
