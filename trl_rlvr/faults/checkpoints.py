"""Which ``checkpoint-N`` folder a run can resume from, so that a crash while one is written never blocks a resume.

transformers' ``Trainer._save_checkpoint`` writes a checkpoint in place, file after file: the model (config,
weights, tokenizer), ``training_args.bin``, the optimizer and scheduler, each process's RNG state, and
``trainer_state.json`` last; only then does it rotate old checkpoints away (``save_total_limit``). RLVRTrainer
writes the prompt stream's position (``rlvr_prompt_stream.json``, dynamic and selective sampling) first, atomically,
and waits for every process's RNG state before ``trainer_state.json`` is written. A run killed in the middle leaves a
folder with some of the files, one of them possibly cut off; ``transformers.trainer_utils.get_last_checkpoint``
takes the highest step regardless, and ``resume_from_checkpoint=True`` then fails on the missing
``trainer_state.json``.

A folder is *complete* (:func:`checkpoint_problem` returns None) when

- ``trainer_state.json`` is there and is whole JSON (it is written last, so every file before it was written);
- each file the trainer needs on top (``required``: the prompt stream's state when it has one) is whole JSON;
- no file is cut off, which a crash of the machine (not only of the process) could leave behind an existing
  ``trainer_state.json``: every ``*.json`` parses, every ``*.safetensors`` is as long as its header says, and every
  zip-format torch file (``*.bin``, ``*.pt``, ``*.pth``: what ``torch.save`` writes) ends with its central directory.

These checks read headers and the JSON files only (no tensor is loaded).
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import zipfile
from collections.abc import Sequence

logger = logging.getLogger(__name__)

#: transformers' names (``transformers.trainer.TRAINER_STATE_NAME``, ``trainer_utils.PREFIX_CHECKPOINT_DIR``).
TRAINER_STATE_NAME = "trainer_state.json"
CHECKPOINT_FOLDER = re.compile(r"^checkpoint-(\d+)$")
#: What ``resume_from_checkpoint`` may say on the command line for "the newest complete checkpoint".
RESUME_LAST = ("true", "last")


class UnusableCheckpointError(ValueError):
    """``resume_from_checkpoint`` names no complete checkpoint (the message says which one to use instead)."""


def checkpoint_problem(folder: str, required: Sequence[str] = ()) -> str | None:
    """Why ``folder`` is not a complete checkpoint (a sentence naming the file), or None when it is complete."""
    if not os.path.isdir(folder):
        return "it is not a folder"
    state = os.path.join(folder, TRAINER_STATE_NAME)
    if not os.path.isfile(state):
        return f"it has no {TRAINER_STATE_NAME} (the Trainer writes it last: the save did not finish)"
    for name in (TRAINER_STATE_NAME, *required):
        if not os.path.isfile(os.path.join(folder, name)):
            return f"it has no {name}"
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            problem = _file_problem(os.path.join(root, name))
            if problem:
                return f"{os.path.relpath(os.path.join(root, name), folder)} {problem}"
    return None


def _file_problem(path: str) -> str | None:
    """Why the file at ``path`` is cut off, for the formats a checkpoint holds; None when whole or not checkable."""
    name = os.path.basename(path)
    try:
        if name.endswith(".json"):
            with open(path, "rb") as f:
                json.loads(f.read())
        elif name.endswith(".safetensors"):
            return _safetensors_problem(path)
        elif name.endswith((".bin", ".pt", ".pth")):
            with open(path, "rb") as f:
                magic = f.read(4)
            if magic[:2] == b"PK" and not zipfile.is_zipfile(path):  # torch.save's zip format, cut off
                return "is cut off (no zip central directory at its end)"
            if not magic:
                return "is empty"
    except (ValueError, UnicodeDecodeError):
        return "is not whole JSON (cut off)"
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    return None


def _safetensors_problem(path: str) -> str | None:
    """A safetensors file is an 8-byte little-endian header length, the JSON header, then the tensor bytes, whose
    extent the header's ``data_offsets`` give: the file is whole when its size is exactly that."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return "is cut off (no header)"
        (header_len,) = struct.unpack("<Q", head)
        if 8 + header_len > size:
            return "is cut off (inside its header)"
        header = json.loads(f.read(header_len))
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end != size:
        return f"is cut off ({size} bytes of {8 + header_len + end})"
    return None


def checkpoint_folders(output_dir: str) -> list[tuple[int, str]]:
    """The ``checkpoint-N`` folders of ``output_dir`` as (N, path), by step."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        match = CHECKPOINT_FOLDER.match(name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            found.append((int(match.group(1)), os.path.join(output_dir, name)))
    return sorted(found)


def newest_complete_checkpoint(output_dir: str, required: Sequence[str] = ()) -> tuple[str | None, list[tuple[str, str]]]:
    """The newest complete checkpoint of ``output_dir`` (None when there is none) and the partial ones newer than it,
    as (path, why), newest first."""
    partial = []
    for _, path in reversed(checkpoint_folders(output_dir)):
        problem = checkpoint_problem(path, required)
        if problem is None:
            return path, partial
        partial.append((path, problem))
    return None, partial


def checkpoint_to_resume(resume_from_checkpoint, output_dir: str, required: Sequence[str] = ()):
    """What to hand ``Trainer.train`` for ``resume_from_checkpoint``: None (no resume) or a complete checkpoint.

    ``True`` (or the string ``"true"``/``"last"`` from a command line, unless such a folder exists) -> the newest
    complete checkpoint of ``output_dir``, with a warning naming each newer partial one; an
    :class:`UnusableCheckpointError` when there is none. A path -> itself when complete, else an
    :class:`UnusableCheckpointError` saying what is missing and which checkpoint is the newest complete one. ``required``: files the trainer needs besides the Trainer's.
    """
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() in RESUME_LAST \
            and not os.path.isdir(resume_from_checkpoint):
        resume_from_checkpoint = True
    if resume_from_checkpoint is True:
        found, partial = newest_complete_checkpoint(output_dir, required)
        for path, why in partial:
            logger.warning(
                "resume_from_checkpoint=True: %s is incomplete (%s), so the run resumes from %s; the partial folder "
                "is left as it is and is written again when the run reaches its step", path, why,
                found or "no checkpoint",
            )
        if found is None:
            partial_names = ", ".join(os.path.basename(p) for p, _ in partial)
            raise UnusableCheckpointError(
                f"resume_from_checkpoint=True: no complete checkpoint in {output_dir}"
                + (f" (incomplete: {partial_names}; see the warnings above)" if partial else "")
                + "; start without resume_from_checkpoint"
            )
        return found
    path = os.fspath(resume_from_checkpoint)
    problem = checkpoint_problem(path)
    if problem is not None:
        newest, _ = newest_complete_checkpoint(os.path.dirname(os.path.abspath(path)), required)
        hint = f"; the newest complete checkpoint next to it is {newest}" if newest else ""
        raise UnusableCheckpointError(f"resume_from_checkpoint={path!r} is not a complete checkpoint: {problem}{hint}")
    return path


def write_json_atomically(path: str, data) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file in the same folder and ``os.replace``: a reader
    (or a crash) sees the old file or the whole new one, never a part. Creates the folder if needed."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


#: The prompt stream's position in a checkpoint folder (dynamic, selective sampling, resample-on-correct).
PROMPT_STREAM_STATE_FILE = "rlvr_prompt_stream.json"


def save_prompt_stream(stream, checkpoint_folder: str) -> None:
    """The prompt stream's position into ``checkpoint_folder``, atomically (written before the checkpoint's other
    files: a checkpoint that rotation may keep as the last one always has it)."""
    write_json_atomically(os.path.join(checkpoint_folder, PROMPT_STREAM_STATE_FILE), stream.state_dict())


def load_prompt_stream(stream, checkpoint: str) -> None:
    """The prompt stream's position from ``checkpoint``; a warning, and the stream from the start, without one."""
    path = os.path.join(checkpoint, PROMPT_STREAM_STATE_FILE)
    if not os.path.exists(path):
        logger.warning(
            "dynamic sampling: the checkpoint %s has no %s (written without dynamic or selective sampling, or "
            "not by RLVRTrainer): the prompt stream restarts from the beginning of the dataset, so prompts already "
            "trained on are drawn again", checkpoint, PROMPT_STREAM_STATE_FILE,
        )
        return
    with open(path) as f:
        stream.load_state_dict(json.load(f))
