"""What a run survives: checkpoints a crash cannot make unusable, and a checkpoint on SIGTERM (docs/faults.md).

- :mod:`.checkpoints`: whether a ``checkpoint-N`` folder is complete, and which one ``resume_from_checkpoint=True``
  takes (the newest complete one, with a warning naming any newer partial one), and
  :func:`write_json_atomically`, how a checkpoint's own files are written;
- :mod:`.preemption`: SIGTERM -> a checkpoint at the end of the optimizer step in progress (every process agreeing
  on the step), then :class:`TrainingPreempted` (exit status 143).
"""

from trl_rlvr.faults.checkpoints import (
    UnusableCheckpointError,
    checkpoint_problem,
    checkpoint_to_resume,
    newest_complete_checkpoint,
    write_json_atomically,
)
from trl_rlvr.faults.preemption import PREEMPTED_EXIT_STATUS, SaveOnSigterm, TrainingPreempted, sigterm_saves

__all__ = [
    "PREEMPTED_EXIT_STATUS",
    "SaveOnSigterm",
    "TrainingPreempted",
    "UnusableCheckpointError",
    "checkpoint_problem",
    "checkpoint_to_resume",
    "newest_complete_checkpoint",
    "sigterm_saves",
    "write_json_atomically",
]
