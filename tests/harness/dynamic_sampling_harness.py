"""Dynamic sampling on a tiny model with a reward that makes some groups informative and others not.

Prompts "q{i}": i % 3 == 0 always right, i % 3 == 1 always wrong (zero-signal groups), i % 3 == 2 right
when the completion has an even number of characters (usually informative). Which groups are kept
differs from rank to rank, so the kept rows must be redistributed.

Run directly (also under `accelerate launch`) to write each rank's record to OUT.rank{r}.pt:
    python -m tests.harness.dynamic_sampling_harness MODEL_DIR OUT [max_steps [FIELD=VALUE ...]]
(FIELD=VALUE: RLVRConfig settings, the value a Python literal or a bare string; extra_rewards=NAME,...: reward
plugins by registry name beside the mixed reward). In TRL's vLLM server mode, the
main process's record also holds what its client received and whether each weight push reached the server.
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


def run(model_dir, reward=mixed_reward, record_prompts=None, callbacks=(), after_loss=None, prepare=None,
        **overrides):
    """Train; return (trainer, [advantages of every micro-batch that reached the loss]). ``reward``: a reward
    function, or a list of them and of registry names.

    With ``record_prompts`` (a list), every round of prompts the trainer generates for is appended to it;
    ``callbacks`` are added to the trainer; ``after_loss(trainer, inputs)`` is called after each micro-batch's loss;
    ``prepare(trainer)`` is called before training.
    """
    from tests.harness.loss_harness import make_trainer

    settings = dict(dynamic_sampling=True, max_steps=3, learning_rate=1e-3, per_device_train_batch_size=8,
                    gradient_accumulation_steps=2, max_completion_length=8)
    settings.update(overrides)
    trainer = make_trainer(model_dir, reward_funcs=reward if isinstance(reward, list) else [reward], **settings)
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
    if prepare is not None:
        prepare(trainer)
    trainer.train()
    return trainer, seen


def record_server_calls(record: dict):
    """For TRL's server mode: on the main process (the only one with a client), record each generation call (the
    sequences and completion tokens it received) and, after each weight push, whether the served final-norm weight
    equals the trainer's."""

    def prepare(trainer):
        client = getattr(trainer.vllm_generation, "vllm_client", None)
        if client is None:
            return
        from trl_rlvr._compat.vllm_server import served_parameter_matches

        generate, push = client.generate, client.update_named_params
        record.update(generations=[], pushes=[])

        def recorded_generate(prompts, n=1, **kwargs):
            output = generate(prompts, n=n, **kwargs)
            record["generations"].append({"sequences": len(prompts) * n,
                                          "tokens": sum(map(len, output["completion_ids"]))})
            return output

        def recorded_push(metadata, named_params):
            push(metadata, named_params)
            norm = next(p for n, p in trainer.model.named_parameters() if n.endswith("model.norm.weight"))
            record["pushes"].append({"step": trainer.state.global_step,
                                     "equal": served_parameter_matches(client.base_url, "model.norm.weight", norm)})

        client.generate, client.update_named_params = recorded_generate, recorded_push

    return prepare


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
    server, plugins = {}, settings.pop("extra_rewards", "")
    trainer, seen = run(model_dir, max_steps=int(sys.argv[3]) if len(sys.argv) > 3 else 3,
                        reward=[mixed_reward, *filter(None, plugins.split(","))],
                        prepare=record_server_calls(server) if settings.get("vllm_mode") == "server" else None,
                        **settings)
    rank = trainer.accelerator.process_index
    torch.save({"num_processes": trainer.accelerator.num_processes, "advantages": seen,
                "log_history": trainer.state.log_history, "server": server}, f"{out}.rank{rank}.pt")
