"""A short dynamic-sampling run on the tiny model that checkpoints every step, for killing and resuming from outside.

    python -m tests.harness.faults_harness MODEL_DIR OUTPUT_DIR MAX_STEPS [--resume] [--ready FILE]
        [--kill_before_trainer_state STEP]

- ``--ready FILE``: each process writes ``FILE.rank{r}`` (its pid) once step 1 is done, so that a test can signal a
  run that is known to be training;
- ``--kill_before_trainer_state STEP``: the process SIGKILLs itself while checkpoint-STEP is being written, after
  the model, optimizer and RNG files and before ``trainer_state.json`` (where a real crash left a folder that
  blocked ``resume_from_checkpoint=True``);
- ``--resume``: ``train(resume_from_checkpoint=True)``.

Also under ``accelerate launch``. The last line each process prints is a JSON summary (rank, global_step).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys


def make_trainer(model_dir, output_dir, max_steps, **overrides):
    from tests.harness.dynamic_sampling_harness import mixed_reward
    from tests.harness.loss_harness import make_trainer as tiny_trainer

    settings = dict(dynamic_sampling=True, learning_rate=1e-3, per_device_train_batch_size=8,
                    max_completion_length=8, output_dir=str(output_dir), save_strategy="steps", save_steps=1,
                    max_steps=max_steps)
    settings.update(overrides)
    return tiny_trainer(model_dir, reward_funcs=[mixed_reward], **settings)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("output_dir")
    parser.add_argument("max_steps", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--ready")
    parser.add_argument("--kill_before_trainer_state", type=int)
    parser.add_argument("--save_strategy", default="steps")
    args = parser.parse_args(argv)

    from transformers import TrainerCallback
    from transformers.trainer_callback import TrainerState

    trainer = make_trainer(args.model_dir, args.output_dir, args.max_steps, save_strategy=args.save_strategy)
    rank = trainer.accelerator.process_index

    class Ready(TrainerCallback):
        def on_step_end(self, targs, state, control, **kwargs):
            if args.ready and state.global_step == 1:
                with open(f"{args.ready}.rank{rank}", "w") as f:
                    f.write(str(os.getpid()))

    trainer.add_callback(Ready())
    if args.kill_before_trainer_state is not None:
        save_to_json = TrainerState.save_to_json

        def crash_first(self, path):
            if self.global_step == args.kill_before_trainer_state:
                os.kill(os.getpid(), signal.SIGKILL)
            save_to_json(self, path)

        TrainerState.save_to_json = crash_first
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    # one write, the newline in it: print's two writes (text, then "\n") from two ranks on one unbuffered pipe
    # can interleave into '{...}{...}' on one line
    sys.stdout.write(json.dumps({"rank": rank, "global_step": trainer.state.global_step}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
