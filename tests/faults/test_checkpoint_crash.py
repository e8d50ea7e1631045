"""A crash while a checkpoint is written never blocks the resume (trl_rlvr.faults.checkpoints).

A reference run (dynamic sampling, so the prompt stream's state is part of the checkpoint) saves checkpoint-1 and
checkpoint-2; inotify records the order in which checkpoint-2's files were written. For every file of that order, the
folder a SIGKILL at that file leaves (the files before it whole, that one cut in half, none after) is rebuilt next
to a whole checkpoint-1, and ``train(resume_from_checkpoint=True)`` must warn naming checkpoint-2, resume from
checkpoint-1, write checkpoint-2 again whole and end with the reference run's weights, bit for bit. A launched run
that really SIGKILLs itself in the middle of a save is resumed the same way.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import zipfile

import pytest
import torch

from trl_rlvr.faults.checkpoints import checkpoint_problem, checkpoint_to_resume, newest_complete_checkpoint

STREAM = "rlvr_prompt_stream.json"


# ------------------------------------------------------------------------------------------------ the checks
def _safetensors(path, tensors=2):
    header = {f"t{i}": {"dtype": "F32", "shape": [2], "data_offsets": [8 * i, 8 * i + 8]} for i in range(tensors)}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 8 * tensors)


def _complete(folder):
    folder.mkdir(parents=True)
    _safetensors(folder / "model.safetensors")
    torch.save({"x": torch.zeros(100)}, folder / "optimizer.pt")
    (folder / STREAM).write_text('{"epoch": 0, "offset": 4}')
    (folder / "trainer_state.json").write_text('{"global_step": 1}')
    return folder


def _cut(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_a_complete_folder_passes_and_each_cut_file_is_named(tmp_path):
    assert checkpoint_problem(str(_complete(tmp_path / "ok")), [STREAM]) is None
    cases = {
        "trainer_state.json": "not whole JSON", "model.safetensors": "cut off", "optimizer.pt": "cut off",
        STREAM: "not whole JSON",
    }
    for name, why in cases.items():
        folder = _complete(tmp_path / name)
        _cut(folder / name)
        problem = checkpoint_problem(str(folder), [STREAM])
        assert problem is not None and name in problem and why in problem, (name, problem)
    folder = _complete(tmp_path / "no_state")
    (folder / "trainer_state.json").unlink()
    assert "no trainer_state.json" in checkpoint_problem(str(folder))
    folder = _complete(tmp_path / "no_stream")
    (folder / STREAM).unlink()
    assert checkpoint_problem(str(folder)) is None  # not required: a trainer without a prompt stream
    assert f"no {STREAM}" in checkpoint_problem(str(folder), [STREAM])


def test_a_safetensors_file_cut_inside_its_header_or_its_data(tmp_path):
    path = tmp_path / "model.safetensors"
    for keep in (0.0, 0.05, 0.5, 0.99):
        _safetensors(path)
        _cut(path, keep)
        assert checkpoint_problem(str(tmp_path)) is not None or not path.exists()
    _safetensors(path)
    with zipfile.ZipFile(tmp_path / "x.zip", "w") as z:  # an unrelated zip file next to it is fine
        z.writestr("a", "b")
    (tmp_path / "trainer_state.json").write_text("{}")
    assert checkpoint_problem(str(tmp_path)) is None


def test_true_takes_the_newest_complete_checkpoint_and_warns_naming_the_partial_ones(tmp_path, caplog):
    for step in (1, 2, 3, 4):
        _complete(tmp_path / f"checkpoint-{step}")
    (tmp_path / "checkpoint-4" / "trainer_state.json").unlink()
    _cut(tmp_path / "checkpoint-3" / "optimizer.pt")
    (tmp_path / "checkpoint-10.tmp").mkdir()  # not a checkpoint folder
    with caplog.at_level(logging.WARNING, logger="trl_rlvr.faults.checkpoints"):
        assert checkpoint_to_resume(True, str(tmp_path)) == str(tmp_path / "checkpoint-2")
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "checkpoint-4 is incomplete" in warned[0] and "checkpoint-3 is incomplete" in warned[1]
    assert all(str(tmp_path / "checkpoint-2") in w for w in warned)
    assert checkpoint_to_resume("true", str(tmp_path)) == checkpoint_to_resume("last", str(tmp_path))
    assert checkpoint_to_resume(None, str(tmp_path)) is None and checkpoint_to_resume(False, str(tmp_path)) is None
    assert checkpoint_to_resume(str(tmp_path / "checkpoint-1"), str(tmp_path)) == str(tmp_path / "checkpoint-1")
    with pytest.raises(ValueError, match=r"checkpoint-4.* is not a complete checkpoint: it has no trainer_state.json"
                                         r".*newest complete checkpoint next to it is .*checkpoint-2"):
        checkpoint_to_resume(str(tmp_path / "checkpoint-4"), str(tmp_path))


def test_true_with_no_complete_checkpoint_is_an_error_naming_the_partial_ones(tmp_path):
    _complete(tmp_path / "checkpoint-3")
    (tmp_path / "checkpoint-3" / "trainer_state.json").unlink()
    with pytest.raises(ValueError, match=r"no complete checkpoint in .*\(incomplete: checkpoint-3;"):
        checkpoint_to_resume(True, str(tmp_path))
    assert newest_complete_checkpoint(str(tmp_path / "missing")) == (None, [])


# ------------------------------------------------------------------------------------------------ real runs
def _weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.fixture(scope="module")
def reference_run(tiny_model_dir, tmp_path_factory):
    """Two steps, a checkpoint after each; checkpoint-2's files in the order they were written."""
    from tests.harness.faults_harness import make_trainer
    from tests.harness.write_order import WriteOrder

    out = tmp_path_factory.mktemp("reference")
    (out / "checkpoint-2").mkdir()  # the Trainer creates it with exist_ok: created first, to be watched from the start
    watch = WriteOrder(out / "checkpoint-2")
    trainer = make_trainer(tiny_model_dir, out, max_steps=2)
    trainer.train()
    events = watch.events()
    watch.close()
    order = []
    for kind, name in events:  # a file's place: its creation, or its rename into place (an atomic write)
        if kind in ("create", "renamed") and ".tmp" not in name and name not in (n for n, _ in order):
            order.append((name, kind == "renamed"))
    assert {n for n, _ in order} == {p.name for p in (out / "checkpoint-2").iterdir()}, events
    assert order[0][0] == STREAM and order[-1][0] == "trainer_state.json", order  # what completeness relies on
    return out, order, _weights(trainer)


def _crash_at(reference, order, k, into):
    """``into`` with checkpoint-1 whole and checkpoint-2 as a SIGKILL while writing its k-th file leaves it."""
    shutil.copytree(reference / "checkpoint-1", into / "checkpoint-1")
    (into / "checkpoint-2").mkdir()
    for name, _ in order[:k]:
        shutil.copy2(reference / "checkpoint-2" / name, into / "checkpoint-2" / name)
    name, atomic = order[k]
    data = (reference / "checkpoint-2" / name).read_bytes()
    torn = into / "checkpoint-2" / (f"{name}.tmp-12345" if atomic else name)  # an atomic write: its temporary file
    torn.write_bytes(data[: len(data) // 2])
    return into


@pytest.mark.slow
def test_a_crash_at_every_file_of_a_checkpoint_resumes_from_the_previous_one(reference_run, tiny_model_dir,
                                                                            tmp_path, caplog):
    from tests.harness.faults_harness import make_trainer

    reference, order, final = reference_run
    for k, (name, _) in enumerate(order):
        out = _crash_at(reference, order, k, tmp_path / f"crash-{k}")
        caplog.clear()
        trainer = make_trainer(tiny_model_dir, out, max_steps=2)
        with caplog.at_level(logging.WARNING, logger="trl_rlvr.faults.checkpoints"):
            trainer.train(resume_from_checkpoint=True)
        warned = [r.getMessage() for r in caplog.records if "is incomplete" in r.getMessage()]
        assert len(warned) == 1 and str(out / "checkpoint-2") in warned[0], (name, warned)
        assert f"resumes from {out / 'checkpoint-1'}" in warned[0], warned
        assert checkpoint_problem(str(out / "checkpoint-2"), [STREAM]) is None, name  # written again, whole
        for key, value in _weights(trainer).items():
            assert torch.equal(value, final[key]), (name, key)  # as if never interrupted
        shutil.rmtree(out)


@pytest.mark.slow
def test_a_run_sigkilled_while_writing_a_checkpoint_resumes_with_true(tiny_model_dir, tmp_path):
    """The crash the Trainer alone cannot resume from: checkpoint-2 without trainer_state.json (a real SIGKILL)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    harness = [sys.executable, "-m", "tests.harness.faults_harness", str(tiny_model_dir), str(tmp_path)]
    killed = subprocess.run([*harness, "3", "--kill_before_trainer_state", "2"], env=env, capture_output=True,
                            text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert checkpoint_problem(str(tmp_path / "checkpoint-2")).startswith("it has no trainer_state.json")
    assert (tmp_path / "checkpoint-2" / "model.safetensors").exists()  # the save was well under way
    resumed = subprocess.run([*harness, "3", "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["global_step"] == 3
    assert "checkpoint-2 is incomplete" in resumed.stderr and "resumes from" in resumed.stderr
    for step in (1, 2, 3):
        assert checkpoint_problem(str(tmp_path / f"checkpoint-{step}"), [STREAM]) is None


def test_trl_rlvr_train_says_which_checkpoint_before_the_model_loads(tmp_path, tiny_model_dir, capsys, monkeypatch):
    """`trl-rlvr train --resume_from_checkpoint ...` with no usable checkpoint: exit status 2 and the reason, no
    traceback, and no model loaded."""
    import trl_rlvr.trainer
    from trl_rlvr.scripts.cli import main

    def no_model(*args, **kwargs):
        raise AssertionError("the trainer (and the model) must not be built")

    monkeypatch.setattr(trl_rlvr.trainer.RLVRTrainer, "__init__", no_model)
    out = tmp_path / "out"
    (out / "checkpoint-3").mkdir(parents=True)  # partial: no trainer_state.json
    base = ["train", "--model_name_or_path", str(tiny_model_dir), "--reward_funcs", "boxed_math", "--output_dir",
            str(out), "--use_cpu", "true", "--bf16", "false"]
    assert main([*base, "--resume_from_checkpoint", "true"]) == 2
    err = capsys.readouterr().err
    assert "no complete checkpoint" in err and "checkpoint-3" in err and "Traceback" not in err
    assert main([*base, "--resume_from_checkpoint", str(out / "checkpoint-3")]) == 2
    assert "is not a complete checkpoint" in capsys.readouterr().err
