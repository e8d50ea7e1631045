"""Waiting on processes a test killed (Linux /proc)."""

import time


def wait_gone(pid: int, timeout: float = 10.0, poll: float = 0.005) -> None:
    """Wait until ``pid`` is dead (a zombie or reaped); AssertionError after ``timeout`` seconds."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError:
            return
        time.sleep(poll)
    raise AssertionError(f"process {pid} did not die")
