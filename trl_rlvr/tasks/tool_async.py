"""The tool job's RL stage on TRL's asynchronous trainer (``examples/tool_r1.py --async``; docs/async.md, "The tool
job in async mode").

``RLVRAsyncTrainer`` with the job's rewards (``boxed_math``, ``tool_format``, the overlong penalty) and its tool
(``PythonEnvironment``), generating on a vLLM server on this machine: the server serves the RL start on the last
``server_cpus`` cores and generates the next rollouts while the trainer trains on the others, and the trainer pushes
its weights to it after each step (``FileWeightTransfer`` on a CPU, TRL's NCCL transfer on a GPU).

- :func:`async_training_args`: the run's ``RLVRConfig`` as an ``RLVRAsyncConfig``: the fields of :data:`CARRIED`
  with the run's values, the server's URL, ``max_staleness``, and fixed-count micro-batches (``token_budget=0``:
  ``per_device_train_batch_size x gradient_accumulation_steps`` rollouts a step, as the synchronous step);
- :func:`build_async_rl_trainer`: the trainer (no server needed yet: the cold start is evaluated before it starts);
- :func:`rl_server`: the server for the RL stage, and this process on the other cores, while it runs.

What does not carry over (the synchronous trainer's generation batches and rounds): ``max_sampling_rounds``,
``generation_batch_size``, ``steps_per_generation``. Dynamic sampling here refills: a zero-signal group is dropped in
the rollout process and the next prompt generated in its place (docs/dynamic_sampling.md).
"""

from __future__ import annotations

import contextlib
import os
from urllib.parse import urlparse

#: ``RLVRConfig`` fields an ``RLVRAsyncConfig`` takes with the same meaning: the optimizer, schedule and logging
#: (TrainingArguments'), the sampling and the clip (GRPOConfig's), the RLVR switches that hold off-policy; and
#: activation checkpointing, under the name this transformers gives it (below 5.2x: ``gradient_checkpointing``).
CARRIED = (
    "output_dir", "seed", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps",
    "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "optim", "max_steps",
    "per_device_train_batch_size", "gradient_accumulation_steps", "logging_steps",
    "report_to", "run_name", "save_strategy", "save_steps", "save_total_limit", "use_cpu", "bf16", "fp16",
    "disable_tqdm", "model_init_kwargs",
    "num_generations", "max_completion_length", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "max_tool_calling_iterations", "chat_template_kwargs", "epsilon", "epsilon_high", "reward_weights",
    "loss_normalization", "loss_constant", "reward_options", "success_reward", "correctness_rewards",
    "overlong_buffer_length", "overlong_penalty_factor", "scale_rewards", "dynamic_sampling",
    "dynamic_sampling_tolerance", "advantage_baseline", "advantage_std", "success_threshold", "alarms",
    "alarm_thresholds",
)

#: The server's context: the job's prompts (system turn, tool schema, question) and completion budget fit with room
#: (the tiny smoke model's tokenizer spells them out in characters).
SERVER_MAX_MODEL_LEN = 2048
#: Every prompt prefilled in one piece: TRL's rollout process seeds each request, and vLLM 0.31 on a CPU fails on a
#: seeded request whose prefill is split over scheduler steps (its CPU generator has no offset to rewind: "CPU
#: Generator does not use offset", the engine dies); 32+ prompts of ~250 tokens in flight split without this.
SERVER_ARGS = ("--no-enable-chunked-prefill", "--max-num-batched-tokens", str(SERVER_MAX_MODEL_LEN))


def split_cores(server_cpus: int, cores=None) -> tuple[list[int], list[int]]:
    """(the server's cores, the trainer's): the last ``server_cpus`` of ``cores`` (default: this process's
    affinity) for the server, the others for the trainer; both must be non-empty."""
    cores = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if not 1 <= server_cpus < len(cores):
        raise ValueError(f"server_cpus={server_cpus}: the server and the trainer each need at least one of the "
                         f"{len(cores)} cores this process may use ({cores})")
    return cores[-server_cpus:], cores[:-server_cpus]


def async_training_args(training_args, script_args, base_url: str):
    """``training_args`` (an ``RLVRConfig``) as an ``RLVRAsyncConfig``: every :data:`CARRIED` field with its value,
    the server at ``base_url``, ``script_args.max_staleness``, ``token_budget=0`` (fixed-count micro-batches)."""
    from trl_rlvr.async_grpo import RLVRAsyncConfig

    if training_args.scale_rewards == "batch":
        raise ValueError("scale_rewards='batch' does not exist in async mode (a group is scored before its batch "
                         "exists): use 'group' or 'none'")
    values = {name: getattr(training_args, name) for name in CARRIED}
    fields = RLVRAsyncConfig.__dataclass_fields__
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    values[checkpointing] = training_args.activation_checkpointing  # RLVRConfig has both names on every version
    return RLVRAsyncConfig(**values, vllm_server_base_url=base_url, max_staleness=script_args.max_staleness,
                           token_budget=0)


def build_async_rl_trainer(model_path, tokenizer, script_args, training_args, reward_funcs, train_dataset,
                           environment_factory):
    """``RLVRAsyncTrainer`` for the tool arm (its rewards and environment factory must pickle into TRL's rollout
    process: the job's do), its server's URL on a free local port (the server starts with :func:`rl_server`)."""
    from trl_rlvr.async_grpo import RLVRAsyncTrainer
    from trl_rlvr.scripts.local_server import free_port

    args = async_training_args(training_args, script_args, f"http://127.0.0.1:{free_port()}")
    return RLVRAsyncTrainer(model=str(model_path), reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                            processing_class=tokenizer, environment_factory=environment_factory)


@contextlib.contextmanager
def pinned(cpus):
    """This process (its calling thread, and the processes it starts from here on) on ``cpus``, torch with as many
    threads; both restored at the end."""
    import torch

    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)


@contextlib.contextmanager
def rl_server(trainer, script_args, log_dir: str):
    """The vLLM server of ``trainer`` (an ``RLVRAsyncTrainer``) serving the RL start on its URL's port and the last
    ``script_args.server_cpus`` cores, this process on the others, while the block runs; yields the
    :class:`~trl_rlvr.scripts.local_server.Server` (its ``startup_s``). The server's output: ``log_dir/server.log``;
    a server that exits meanwhile stops the block with it (:func:`~trl_rlvr.scripts.local_server.aborted_if_it_exits`).
    """
    from trl_rlvr.scripts.local_server import aborted_if_it_exits, served

    server_cpus, trainer_cpus = split_cores(script_args.server_cpus)
    os.makedirs(log_dir, exist_ok=True)
    with served(trainer.model.name_or_path, port=urlparse(trainer.args.vllm_server_base_url).port,
                max_model_len=SERVER_MAX_MODEL_LEN, extra_args=SERVER_ARGS, cpus=server_cpus, log_dir=log_dir) as server, \
            aborted_if_it_exits(server), pinned(trainer_cpus):
        yield server
