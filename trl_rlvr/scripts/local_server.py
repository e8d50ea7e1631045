"""A vLLM server in a subprocess on this machine, started as a user starts it (``python -m
trl_rlvr.scripts.vllm_serve``): for the tool job's server-side RL stage (``examples/tool_r1.py --async``), tests and
benchmarks of ``RLVRTrainer``'s server mode and ``RLVRAsyncTrainer``; and what the server itself counts (its
Prometheus ``/metrics``).

    with served(model_dir, max_model_len=256) as server:
        RLVRConfig(use_vllm=True, vllm_mode="server", vllm_server_base_url=server.base_url, ...)
        server.counters()  # {"requests": ..., "generation_tokens": ..., "prompt_tokens": ...}

``served(..., cpus=[1])`` keeps the server on those cores (its processes' affinity and vLLM's OpenMP threads,
``VLLM_CPU_OMP_THREADS_BIND``), so that a trainer on the other cores does not compete with it. Needs vLLM (its CPU
build in its own venv on a CPU). The server's output goes to ``server.log_path``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

#: Prometheus counters of vLLM's server -> our names. vLLM counts a prompt sampled ``n`` times as ``n`` requests.
COUNTERS = {"vllm:request_success_total": "requests", "vllm:generation_tokens_total": "generation_tokens",
            "vllm:prompt_tokens_total": "prompt_tokens"}


@dataclass
class Server:
    """A running server: its URL, its process, where its output goes, the seconds it took to answer ``/health``."""

    base_url: str
    process: subprocess.Popen
    log_path: str
    command: list[str]
    startup_s: float = 0.0

    def counters(self) -> dict[str, float]:
        """The server's own counts since it started (summed over their labels, e.g. every finish reason)."""
        import requests

        text = requests.get(f"{self.base_url}/metrics", timeout=30).text
        counts = dict.fromkeys(COUNTERS.values(), 0.0)
        for line in text.splitlines():
            match = re.match(r"^([a-z_:]+)(?:\{[^}]*\})? ([0-9.e+-]+)$", line)
            if match and match.group(1) in COUNTERS:
                counts[COUNTERS[match.group(1)]] += float(match.group(2))
        return counts

    def log_tail(self, lines: int = 40) -> str:
        with open(self.log_path, errors="replace") as file:
            return "".join(file.readlines()[-lines:])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(server: Server, timeout: float) -> None:
    """Poll ``/health`` until it answers 200; fail with the server's last output when it exits or ``timeout``
    passes."""
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the vLLM server exited ({server.process.returncode}):\n{server.log_tail()}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{server.base_url}/health", timeout=5).status_code == 200:
                return
        time.sleep(1.0)
    raise TimeoutError(f"the vLLM server did not answer within {timeout:.0f} s:\n{server.log_tail()}")


@contextlib.contextmanager
def served(model_dir: str, *, max_model_len: int = 512, extra_args: tuple[str, ...] = (), timeout: float = 600.0,
           kv_cache_gib: int = 1, log_dir: str | None = None, port: int | None = None,
           cpus: Sequence[int] | None = None):
    """Start ``python -m trl_rlvr.scripts.vllm_serve --model MODEL_DIR`` on ``port`` (default: a free local one; its
    own process group, stopped at the end), wait until it answers, yield its :class:`Server`. ``cpus``: the cores the
    server's processes and vLLM's OpenMP threads may use (default: vLLM's own binding)."""
    port = port or free_port()
    command = [sys.executable, "-m", "trl_rlvr.scripts.vllm_serve", "--model", str(model_dir), "--host", "127.0.0.1",
               "--port", str(port), "--max_model_len", str(max_model_len), "--log_level", "warning", *extra_args]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "HF_HUB_OFFLINE": "1"}
    pin = None
    if cpus is not None:
        cores = sorted(set(cpus))
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))  # vLLM's CPU worker binds its threads there

        def pin():  # in the child, before exec: every process of the server inherits the affinity
            os.sched_setaffinity(0, cores)
    log_path = os.path.join(log_dir or tempfile.mkdtemp(prefix="vllm_server_"), "server.log")
    started = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=pin)
    server = Server(f"http://127.0.0.1:{port}", process, log_path, command)
    try:
        wait_until_up(server, timeout)
        server.startup_s = time.perf_counter() - started
        yield server
    finally:
        stop(process)


class ServerExited(Exception):
    """Raised in the thread using a server whose process exited (:func:`aborted_if_it_exits`)."""


def _raise_in_thread(ident: int, exc_type: type[BaseException] | None) -> None:
    """Have thread ``ident`` raise ``exc_type`` at its next Python instruction (None: cancel a pending one);
    CPython's ``PyThreadState_SetAsyncExc``, the only way to stop a thread that waits in a loop."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc_type) if exc_type else None)


@contextlib.contextmanager
def aborted_if_it_exits(server: Server, poll_s: float = 1.0):
    """Run the block; if the server's process exits before the block ends, stop the block (an exception raised in
    the thread that runs it, at its next Python instruction) and raise a ``RuntimeError`` with the server's last
    output, instead of clients retrying a dead server until their timeouts. A lock makes the watcher's decision and
    the block's end exclusive: an exit seen after the block ended raises nothing."""
    user, lock = threading.get_ident(), threading.Lock()
    done, exited = threading.Event(), threading.Event()

    def watch():
        while not done.wait(poll_s):
            with lock:
                if not done.is_set() and server.process.poll() is not None:
                    exited.set()
                    _raise_in_thread(user, ServerExited)
                    return

    watcher = threading.Thread(target=watch, name="vllm-server-watch", daemon=True)
    watcher.start()
    failure = None
    try:
        yield server
    except ServerExited:
        failure = "exited"
    finally:
        with lock:
            done.set()
            if exited.is_set() and failure is None:  # fired as the block ended: cancel it if still pending
                _raise_in_thread(user, None)
                failure = "exited"
        watcher.join()
    if failure:
        raise RuntimeError(f"the vLLM server exited ({server.process.returncode}) while it was in use; its last "
                           f"output ({server.log_path}):\n{server.log_tail()}")


def stop(process: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM to the server's process group (the API server and vLLM's engine process), SIGKILL after ``grace``."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
