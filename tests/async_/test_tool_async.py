"""The tool job's RL stage on the asynchronous trainer (``examples/tool_r1.py --async``, trl_rlvr.tasks.tool_async),
the parts that need no vLLM server: the run's settings carried into an RLVRAsyncConfig, the cores split between
the server and the trainer, and the trainer's model evaluated as a plain model (TRL's tree attention set aside).
The job end to end against its own server: tests/engines/test_vllm_tool_job.py (vLLM's venv)."""

import dataclasses
import os

import pytest
import torch

pytest.importorskip("trl.experimental.async_grpo")

from trl.experimental.async_grpo.packing import TREE_ATTENTION  # noqa: E402

from trl_rlvr._compat.async_adapter import plain_attention  # noqa: E402
from trl_rlvr.async_grpo import RLVRAsyncConfig  # noqa: E402
from trl_rlvr.config import RLVRConfig  # noqa: E402
from trl_rlvr.tasks.tool_arithmetic import parse_args  # noqa: E402
from trl_rlvr.tasks.tool_async import CARRIED, async_training_args, split_cores  # noqa: E402


def tool_job_args(tmp_path, *argv):
    return parse_args(["--output_dir", str(tmp_path), *argv])


def test_the_server_gets_the_last_cores_and_the_trainer_the_others():
    assert split_cores(1, {0, 1}) == ([1], [0])
    assert split_cores(2, [3, 0, 2, 1]) == ([2, 3], [0, 1])
    for server_cpus, cores in [(1, {0}), (2, {0, 1}), (0, {0, 1})]:
        with pytest.raises(ValueError, match="server_cpus"):
            split_cores(server_cpus, cores)


def test_the_runs_settings_carry_into_the_async_config(tmp_path):
    script_args, training_args, _ = tool_job_args(tmp_path, "--async", "--max_staleness", "3", "--epsilon_high",
                                                  "0.3", "--loss_normalization", "constant")
    assert script_args.async_rl and script_args.server_cpus == 1
    args = async_training_args(training_args, script_args, "http://127.0.0.1:1234")
    assert isinstance(args, RLVRAsyncConfig)
    sync_fields = {f.name for f in dataclasses.fields(RLVRConfig)}
    async_fields = {f.name for f in dataclasses.fields(RLVRAsyncConfig)}
    assert set(CARRIED) <= sync_fields & async_fields
    filled_in = {"loss_constant", "alarm_thresholds"}  # RLVRAsyncConfig fills them in from the same defaults
    for name in set(CARRIED) - filled_in:
        assert getattr(args, name) == getattr(training_args, name), name
    assert training_args.loss_constant is None and args.loss_constant == training_args.max_completion_length
    assert training_args.alarm_thresholds is None and args.alarm_thresholds == RLVRAsyncConfig(
        output_dir=str(tmp_path), bf16=False, use_cpu=True).alarm_thresholds
    # the tool job's own settings, among them
    assert (args.max_steps, args.learning_rate, args.num_generations, args.max_completion_length) == (18, 8e-6, 4, 96)
    assert (args.per_device_train_batch_size * args.gradient_accumulation_steps, args.epsilon_high) == (32, 0.3)
    assert (args.loss_normalization, args.loss_constant, args.dynamic_sampling) == ("constant", 96, True)
    assert (args.overlong_buffer_length, args.success_reward, args.max_tool_calling_iterations) == (32, "boxed_math", 2)
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in async_fields else "gradient_checkpointing"
    assert getattr(args, checkpointing) is True
    assert (args.vllm_server_base_url, args.max_staleness, args.token_budget) == ("http://127.0.0.1:1234", 3, 0)


def test_settings_without_an_async_meaning_are_refused(tmp_path):
    script_args, training_args, _ = tool_job_args(tmp_path, "--async", "--scale_rewards", "batch")
    with pytest.raises(ValueError, match="scale_rewards='batch'"):
        async_training_args(training_args, script_args, "http://127.0.0.1:1234")
    with pytest.raises(ValueError, match="server_cpus"):
        tool_job_args(tmp_path, "--async", "--server_cpus", "0")


def test_the_async_trainers_model_generates_as_a_plain_model(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from tests.async_.test_async_trainer import make_trainer

    trainer = make_trainer(tiny_model_dir, tmp_path, reward_options={"boxed_math": {"prestart": False}})
    model = trainer.model
    assert model.config._attn_implementation == TREE_ATTENTION  # TRL's: packed rows only
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="eager")
    plain.load_state_dict(model.state_dict(), strict=False)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad(), plain_attention(model):
        assert model.config._attn_implementation == "sdpa"
        logits = model(input_ids=ids).logits
        generated = model.generate(ids, max_new_tokens=4, do_sample=False)
    with torch.no_grad():
        torch.testing.assert_close(logits, plain(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
        assert torch.equal(generated, plain.generate(ids, max_new_tokens=4, do_sample=False))
    assert model.config._attn_implementation == TREE_ATTENTION  # TRL's again, for the next step


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity")
def test_pinned_restores_the_cores_and_threads():
    from trl_rlvr.tasks.tool_async import pinned

    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    first = min(cores)
    with pinned([first]):
        assert os.sched_getaffinity(0) == {first} and torch.get_num_threads() == 1
    assert os.sched_getaffinity(0) == cores and torch.get_num_threads() == threads
