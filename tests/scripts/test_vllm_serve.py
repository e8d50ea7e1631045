"""``python -m trl_rlvr.scripts.vllm_serve``: TRL's ``trl vllm-serve`` command plus the weight-reload extension; on
vLLM's CPU build, vLLM's API server module and no NCCL engine (no vLLM needed: the command is only built)."""

import pytest
from trl.scripts.vllm_serve import ScriptArguments, build_command

from trl_rlvr.scripts.vllm_serve import API_SERVER_MODULE, WORKER_EXTENSION, server_command, server_environment


def test_on_a_gpu_it_is_trls_command_plus_the_extension():
    args = ScriptArguments(model="Qwen/Qwen3-0.6B", port=8001)
    command = server_command(args, ["--seed", "1"], cli_starts=True, on_cpu=False)
    assert command == [*build_command(args, ["--seed", "1"]), "--worker-extension-cls", WORKER_EXTENSION]
    assert '{"backend": "nccl"}' in command  # TRL's NCCL weight transfer stays for trainers on a GPU


def test_on_vllms_cpu_build_it_runs_the_api_server_module_without_nccl():
    args = ScriptArguments(model="/models/smol", max_model_len=512)
    command = server_command(args, cli_starts=False, on_cpu=True)
    assert command[1:5] == ["-m", API_SERVER_MODULE, "--model", "/models/smol"]
    assert "serve" not in command and "--weight-transfer-config" not in command
    assert command[-2:] == ["--worker-extension-cls", WORKER_EXTENSION]
    for option in ("--max-model-len", "--logprobs-mode", "--max-logprobs", "--port"):
        assert option in command  # TRL's other settings kept


@pytest.mark.parametrize("given", [{}, {"VLLM_SERVER_DEV_MODE": "0", "OTHER": "x"}])
def test_the_server_runs_in_vllms_dev_mode(given):
    environment = server_environment(given)
    assert environment["VLLM_SERVER_DEV_MODE"] == "1" and all(environment[k] == v for k, v in given.items()
                                                                if k != "VLLM_SERVER_DEV_MODE")
