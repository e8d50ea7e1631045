"""SIGTERM to a launched run: a checkpoint of the step in progress, a clean exit (143), and a resume from it
(trl_rlvr.faults.preemption). With two processes only one receives the signal: both must stop at the same step."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.harness.launch import free_port, launch_on_cpu
from trl_rlvr.faults.checkpoints import checkpoint_folders, checkpoint_problem

STREAM = "rlvr_prompt_stream.json"
MAX_STEPS = 40  # far more than the run reaches before the signal: the checkpoint is the SIGTERM one
# each rank's summary, wherever it lands: rank 0's trainer prints its log dicts with print(), whose text and newline
# are two writes, so the other rank's summary can land between them, mid-line
SUMMARY = re.compile(r'\{"rank": \d+, "global_step": \d+\}')


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "ACCELERATE_USE_CPU": "1"}


def _wait_for(paths, proc, timeout=600):
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended before step 1: {proc.returncode}\n{err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("no step 1 in time")
        time.sleep(0.2)
    return [int(open(p).read()) for p in paths]


def _the_sigterm_checkpoint(output_dir):
    (found,) = checkpoint_folders(str(output_dir))  # save_strategy="no": the only checkpoint is the SIGTERM one
    step, path = found
    assert 2 <= step < MAX_STEPS
    assert checkpoint_problem(path, [STREAM]) is None
    with open(os.path.join(path, "trainer_state.json")) as f:
        assert json.load(f)["global_step"] == step
    return step, path


@pytest.mark.slow
def test_sigterm_saves_the_step_and_exits_143_then_the_run_resumes(tiny_model_dir, tmp_path):
    ready = tmp_path / "ready"
    cmd = [sys.executable, "-m", "tests.harness.faults_harness", str(tiny_model_dir), str(tmp_path / "out"),
           str(MAX_STEPS), "--save_strategy", "no", "--ready", str(ready)]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    (pid,) = _wait_for([f"{ready}.rank0"], proc)
    assert pid == proc.pid
    os.kill(pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err[-3000:]
    step, path = _the_sigterm_checkpoint(tmp_path / "out")
    assert f"SIGTERM received: saving checkpoint-{step}" in err
    assert "Traceback" not in err, err[-3000:]
    resumed = subprocess.run([*cmd[:5], str(step + 1), "--resume"], env=_env(), capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["global_step"] == step + 1


@pytest.mark.slow
def test_sigterm_to_one_of_two_processes_stops_both_at_the_same_step(tiny_model_dir, tmp_path):
    ready, output_dir = tmp_path / "ready", tmp_path / "out"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
           str(free_port()), "--module", "tests.harness.faults_harness", str(tiny_model_dir), str(output_dir),
           str(MAX_STEPS), "--save_strategy", "no", "--ready", str(ready)]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    _, rank1 = _wait_for([f"{ready}.rank0", f"{ready}.rank1"], proc)
    os.kill(rank1, signal.SIGTERM)  # rank 0 never receives it
    out, err = proc.communicate(timeout=600)
    step, path = _the_sigterm_checkpoint(output_dir)
    assert err.count(f"SIGTERM received: saving checkpoint-{step}") == 2, err[-3000:]  # both ranks, the same step
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(os.listdir(path))
    assert "exitcode  : 143" in err, err[-3000:]  # the launcher reports the workers' status
    proc = launch_on_cpu("--module", "tests.harness.faults_harness", tiny_model_dir, output_dir, step + 1, "--resume",
                         num_processes=2)
    summaries = [json.loads(found) for found in SUMMARY.findall(proc.stdout)]
    assert sorted(s["rank"] for s in summaries) == [0, 1], proc.stdout[-3000:]
    assert {s["global_step"] for s in summaries} == {step + 1}, proc.stdout[-3000:]


# ------------------------------------------------------------------------------------------------ in process
class _Trainer:
    """What SaveOnSigterm and sigterm_saves use of a trainer."""

    def __init__(self, output_dir="out"):
        from types import SimpleNamespace

        self.accelerator = SimpleNamespace(num_processes=1, wait_for_everyone=lambda: None)
        self.args = SimpleNamespace(output_dir=output_dir)
        self.callbacks = []

    def add_callback(self, callback):
        self.callbacks.append(callback)

    def remove_callback(self, callback):
        self.callbacks.remove(callback)


def test_the_handler_only_flags_and_the_step_end_saves_and_stops():
    from transformers import TrainerControl, TrainerState

    from trl_rlvr.faults import PREEMPTED_EXIT_STATUS, TrainingPreempted, sigterm_saves

    before = signal.getsignal(signal.SIGTERM)
    trainer, state = _Trainer(), TrainerState()
    with pytest.raises(TrainingPreempted) as raised:
        with sigterm_saves(trainer) as callback:
            assert trainer.callbacks == [callback] and signal.getsignal(signal.SIGTERM) == callback._on_sigterm
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # a second one changes nothing
            assert callback.requested
            state.global_step = 7
            control = callback.on_step_end(None, state, TrainerControl())
            assert control.should_save and control.should_training_stop
    assert raised.value.code == PREEMPTED_EXIT_STATUS == 143
    assert raised.value.checkpoint == os.path.join("out", "checkpoint-7") and raised.value.step == 7
    assert signal.getsignal(signal.SIGTERM) == before and trainer.callbacks == []


def test_a_sigterm_after_the_last_step_goes_to_the_previous_handler_and_off_leaves_it_alone():
    from trl_rlvr.faults import sigterm_saves

    got = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        with sigterm_saves(_Trainer()) as callback:
            assert callback is not None and not callback._installed  # another handler is there: left in place
        with sigterm_saves(_Trainer(), enabled=False) as callback:
            assert callback is None
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with sigterm_saves(_Trainer()) as callback:
            assert callback._installed  # over the default handler
            callback._previous = lambda signum, frame: got.append(("previous", signum))
            os.kill(os.getpid(), signal.SIGTERM)  # after the last step's end: no on_step_end follows
        assert got == [("previous", signal.SIGTERM)]
    finally:
        signal.signal(signal.SIGTERM, previous)
