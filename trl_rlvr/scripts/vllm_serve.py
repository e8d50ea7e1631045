"""``python -m trl_rlvr.scripts.vllm_serve --model DIR [options of `trl vllm-serve`] [options of `vllm serve`]``:
the vLLM server of ``RLVRTrainer(args=RLVRConfig(use_vllm=True, vllm_mode="server"))``, on a GPU or on a CPU.

It runs the server TRL's own ``trl vllm-serve`` runs (TRL 1.16's ``build_command``: vLLM's OpenAI-compatible server
with ``VLLM_SERVER_DEV_MODE=1``, the NCCL weight-transfer engine, ``--logprobs-mode processed_logprobs``,
``--max-logprobs -1``) with two changes:

- ``--worker-extension-cls trl_rlvr._compat.vllm_cpu.WeightReloadExtension``: a method on vLLM's workers that
  reloads the weights from a safetensors file, called through the dev-mode ``/collective_rpc`` endpoint. A trainer
  on a CPU pushes its weights that way (no NCCL there: trl_rlvr._compat.vllm_server); a trainer on a GPU still
  uses TRL's NCCL engine, which stays configured where the server runs on a GPU.
- vLLM's CPU build (``vllm-cpu``) installs its metadata as ``vllm_cpu``, and ``vllm serve`` stops at once reading
  the version of ``vllm`` (``PackageNotFoundError``); there the same server is started as
  ``python -m vllm.entrypoints.openai.api_server --model DIR`` (same options), and the NCCL weight-transfer engine,
  which needs CUDA, is left out.

The command it runs is printed first. docs/engines.md, "Server mode on a CPU", says which weight push is used when.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import sys

#: The worker extension that gives the server its file-based weight reload (``trl_rlvr._compat.vllm_cpu``).
WORKER_EXTENSION = "trl_rlvr._compat.vllm_cpu.WeightReloadExtension"

#: vLLM's server entry that does not read vLLM's package version (the ``vllm serve`` CLI does).
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def vllm_cli_starts() -> bool:
    """Whether ``vllm serve`` can start here: its CLI reads the version of the ``vllm`` distribution, which the CPU
    build (``vllm-cpu``) does not install under that name."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def vllm_runs_on_cpu() -> bool:
    """Whether vLLM's platform here is its CPU backend."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def without_option(command: list[str], option: str) -> list[str]:
    """``command`` without ``option`` and the value that follows it."""
    if option not in command:
        return command
    at = command.index(option)
    return command[:at] + command[at + 2 :]


def server_command(script_args, extra_args: list[str] | None = None, *, cli_starts: bool | None = None,
                   on_cpu: bool | None = None) -> list[str]:
    """The command line that serves ``script_args`` (TRL's ``ScriptArguments``) for RLVRTrainer's server mode:
    TRL's ``trl vllm-serve`` command plus the weight-reload worker extension; on vLLM's CPU build, vLLM's API server
    module instead of its CLI and no NCCL weight-transfer engine."""
    from trl.scripts.vllm_serve import build_command

    command = build_command(script_args, extra_args)
    if not (vllm_cli_starts() if cli_starts is None else cli_starts):
        serve = command.index("serve")  # [python, -m, vllm.entrypoints.cli.main, serve, MODEL, ...]
        command = [command[0], "-m", API_SERVER_MODULE, "--model", command[serve + 1], *command[serve + 2 :]]
    if vllm_runs_on_cpu() if on_cpu is None else on_cpu:
        command = without_option(command, "--weight-transfer-config")
    return [*command, "--worker-extension-cls", WORKER_EXTENSION]


def server_environment(environ=None) -> dict[str, str]:
    """The server's environment: vLLM's dev-mode endpoints on (``/collective_rpc``, the weight-update and prefix-cache
    endpoints TRL's client calls), as ``trl vllm-serve`` sets it."""
    return {**(os.environ if environ is None else environ), "VLLM_SERVER_DEV_MODE": "1"}


def main(argv: list[str] | None = None) -> None:
    from trl.scripts.vllm_serve import make_parser

    parser = make_parser(prog="python -m trl_rlvr.scripts.vllm_serve")
    script_args, extra_args = parser.parse_args_and_config(args=argv, return_remaining_strings=True)
    command = server_command(script_args, extra_args)
    print("VLLM_SERVER_DEV_MODE=1 " + shlex.join(command), flush=True)
    os.execve(command[0], command, server_environment())


if __name__ == "__main__":
    main(sys.argv[1:])
