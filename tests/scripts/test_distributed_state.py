"""The scripts' process state: right on a gloo launch, and its process group destroyed when the script exits, as it
is when a script builds only the trainer."""

import atexit
import re
from types import SimpleNamespace

import pytest

from tests.harness.launch import launch_on_cpu
from trl_rlvr._compat.gloo_exit import destroy_gloo_process_group
from trl_rlvr.scripts.distributed import distributed_state


@pytest.mark.parametrize("built", ["script_state", "bare_trainer"])
def test_a_gloo_launch_destroys_its_process_group_at_exit(built, request):
    model_dir = [request.getfixturevalue("tiny_model_dir")] if built == "bare_trainer" else []
    proc = launch_on_cpu("--module", "tests.harness.process_group_exit", *model_dir, timeout=300)
    # the ranks share one stdout pipe: their lines may interleave, so each report is found, not each line
    reports = sorted(re.findall(r"rank (\d): sum (\d+), before exit (\w+), after exit (True|False)", proc.stdout))
    assert reports == [(rank, "3", "gloo", "False") for rank in "01"], proc.stdout + proc.stderr[-3000:]


def test_a_script_that_builds_its_state_twice_has_one_handler(monkeypatch):
    import accelerate

    handlers = []
    monkeypatch.setattr(atexit, "register", handlers.append)
    monkeypatch.setattr(atexit, "unregister", lambda f: handlers.remove(f) if f in handlers else None)
    monkeypatch.setattr(accelerate, "PartialState", lambda cpu: SimpleNamespace(num_processes=2))
    distributed_state()
    distributed_state()
    assert handlers == [destroy_gloo_process_group]


def test_one_process_registers_nothing_and_the_handler_is_a_no_op_without_a_group(monkeypatch):
    calls, register = [], atexit.register
    monkeypatch.setattr(atexit, "register", lambda f, *a, **k: calls.append(f) or register(f, *a, **k))
    state = distributed_state(use_cpu=True)
    assert state.num_processes == 1 and destroy_gloo_process_group not in calls
    destroy_gloo_process_group()  # no group: nothing to do, no error


ABORT = ("terminate called without an active exception\n"
         "E1206 torch/distributed/elastic/multiprocessing/api.py] failed (exitcode: -6) local_rank: 0\n"
         "Traceback (most recent call last):\n  ChildFailedError\n")


def _launch_that_fails(tmp_path, first: str, second: str | None = None):
    """A command that writes ``first`` to stderr and fails on its first run, then ``second`` (or succeeds)."""
    import sys

    marker = tmp_path / "ran"
    script = (f"import pathlib, sys\nm = pathlib.Path({str(marker)!r})\nsecond = {second!r}\n"
              f"if m.exists():\n    sys.stderr.write(second or ''); sys.exit(1 if second else 0)\n"
              f"m.write_text('1'); sys.stderr.write({first!r}); sys.exit(1)\n")
    return [sys.executable, "-c", script]


def test_a_launch_a_rank_aborted_in_gloo_teardown_runs_once_more_with_a_warning(tmp_path):
    from tests.harness.launch import run_launch

    with pytest.warns(UserWarning, match="aborted in gloo's teardown"):
        assert run_launch(_launch_that_fails(tmp_path, ABORT), cwd=tmp_path, env=None, timeout=60).returncode == 0


@pytest.mark.parametrize("first, second", [
    (ABORT, ABORT),  # aborts twice: fails
    ("Traceback (most recent call last):\n  ValueError\n" + ABORT, None),  # a rank's error first: not run again
    ("failed (exitcode: 1) local_rank: 0\n", None),  # any other failure: not run again
])
def test_any_other_failed_launch_fails(tmp_path, first, second):
    from tests.harness.launch import run_launch

    with pytest.raises(AssertionError):
        run_launch(_launch_that_fails(tmp_path, first, second), cwd=tmp_path, env=None, timeout=60)
