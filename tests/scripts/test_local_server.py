"""trl_rlvr.scripts.local_server without vLLM: a server process that exits while it is in use stops the block that
uses it with its last output (no client retrying a dead server until its timeouts), and a block that ends first
leaves nothing running."""

import subprocess
import sys
import threading
import time

import pytest

from trl_rlvr.scripts.local_server import Server, aborted_if_it_exits


def stand_in_server(tmp_path, seconds: float) -> Server:
    """A process that prints a line and exits after ``seconds``, in a server's place."""
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        command = [sys.executable, "-c", f"import time; print('engine core died', flush=True); time.sleep({seconds})"]
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return Server("http://127.0.0.1:1", process, str(log_path), command)


def test_a_server_that_exits_stops_the_block_with_its_last_output(tmp_path):
    server = stand_in_server(tmp_path, 0.5)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="(?s)the vLLM server exited.*engine core died"):
        with aborted_if_it_exits(server, poll_s=0.1):
            while time.monotonic() - started < 60:  # a trainer waiting on rollouts
                time.sleep(0.05)
    assert time.monotonic() - started < 10


def test_a_block_that_ends_first_is_left_alone(tmp_path):
    server = stand_in_server(tmp_path, 30)
    try:
        with aborted_if_it_exits(server, poll_s=0.1) as same:
            assert same is server
        with pytest.raises(KeyboardInterrupt):  # the user's own interrupt goes through unchanged
            with aborted_if_it_exits(server, poll_s=0.1):
                raise KeyboardInterrupt
    finally:
        server.process.kill()
        server.process.wait()
    time.sleep(0.3)  # the server is gone, the watchers stopped with their blocks: nothing interrupts this thread


def test_it_stops_the_block_in_any_thread(tmp_path):
    """The block may run outside the main thread (a test runner's worker thread, a trainer started from a thread)."""
    outcome = {}

    def use():
        server = stand_in_server(tmp_path, 0.3)
        try:
            with aborted_if_it_exits(server, poll_s=0.1):
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    time.sleep(0.05)
        except RuntimeError as err:
            outcome["error"] = str(err)
        outcome["elapsed"] = True

    thread = threading.Thread(target=use)
    started = time.monotonic()
    thread.start()
    thread.join(30)
    assert "engine core died" in outcome.get("error", "") and time.monotonic() - started < 10
