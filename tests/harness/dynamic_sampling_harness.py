"""Dynamic sampling on a tiny model with a reward that makes some groups informative and others not.

Prompts "q{i}": i % 3 == 0 always right, i % 3 == 1 always wrong (zero-signal groups), i % 3 == 2 right
when the completion has an even number of characters (usually informative). Which groups are kept
differs from rank to rank, so the kept rows must be redistributed.

Run directly (also under `accelerate launch`) to write each rank's record to OUT.rank{r}.pt:
    python -m tests.harness.dynamic_sampling_harness MODEL_DIR OUT [max_steps [FIELD=VALUE ...]]
(FIELD=VALUE: RLVRConfig settings, the value a Python literal or a bare string).
"""

from __future__ import annotations

import sys

import torch


def mixed_reward(prompts, completions, **kwargs):
    rewards = []
    for prompt, completion in zip(prompts, completions):
        i = int(prompt[1:])
        rewards.append(1.0 if i % 3 == 0 else 0.0 if i % 3 == 1 else float(len(completion) % 2 == 0))
    return rewards


def constant_reward(prompts, completions, **kwargs):
    return [1.0] * len(completions)


def run(model_dir, reward=mixed_reward, record_prompts=None, callbacks=(), after_loss=None, **overrides):
    """Train; return (trainer, [advantages of every micro-batch that reached the loss]).

    With ``record_prompts`` (a list), every round of prompts the trainer generates for is appended to it;
    ``callbacks`` are added to the trainer; ``after_loss(trainer, inputs)`` is called after each micro-batch's loss.
    """
    from tests.harness.loss_harness import make_trainer

    settings = dict(dynamic_sampling=True, max_steps=3, learning_rate=1e-3, per_device_train_batch_size=8,
                    gradient_accumulation_steps=2, max_completion_length=8)
    settings.update(overrides)
    trainer = make_trainer(model_dir, reward_funcs=[reward], **settings)
    for callback in callbacks:
        trainer.add_callback(callback)
    seen = []
    compute_loss = trainer.compute_loss

    def recording(model, inputs, *args, **kwargs):
        seen.append(inputs["advantages"].detach().clone())
        out = compute_loss(model, inputs, *args, **kwargs)
        if after_loss is not None:
            after_loss(trainer, inputs)
        return out

    trainer.compute_loss = recording
    if record_prompts is not None:
        next_prompts = trainer._round_driver.next_prompts

        def recording_prompts(*args):
            rows, groups = next_prompts(*args)
            record_prompts.append(rows)
            return rows, groups

        trainer._round_driver.next_prompts = recording_prompts
    trainer.train()
    return trainer, seen


def _literal(text: str):
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


if __name__ == "__main__":
    model_dir, out = sys.argv[1], sys.argv[2]
    settings = dict(per_device_train_batch_size=4)
    settings.update((key, _literal(value)) for key, value in (a.split("=", 1) for a in sys.argv[4:]))
    trainer, seen = run(model_dir, max_steps=int(sys.argv[3]) if len(sys.argv) > 3 else 3, **settings)
    rank = trainer.accelerator.process_index
    torch.save({"num_processes": trainer.accelerator.num_processes, "advantages": seen,
                "log_history": trainer.state.log_history}, f"{out}.rank{rank}.pt")
