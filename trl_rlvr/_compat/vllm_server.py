"""TRL's vLLM server mode with a trainer on a CPU: the weight push through a safetensors file instead of NCCL.

What crosses the process boundary in TRL 1.16's server mode (``VLLMGeneration``, ``VLLMClient``), all HTTP from the
main training process to vLLM's OpenAI-compatible server (``trl vllm-serve`` runs ``vllm serve`` with
``VLLM_SERVER_DEV_MODE=1``):

- at construction: ``GET /health`` (until up), ``GET /v1/models``; then ``init_communicator``: ``GET /server_info``,
  ``GET /get_world_size``, ``POST /init_weight_transfer_engine`` while the trainer joins an NCCL group as rank 0;
- per optimizer step, before the step's first generation (``sync_weights``): ``POST /start_weight_update``,
  ``POST /update_weights`` while every parameter is broadcast over NCCL, ``POST /finish_weight_update``,
  ``POST /reset_prefix_cache``;
- per generation call (every dynamic-sampling round; every tool turn): one ``POST /v1/completions`` with the
  unique prompts as token ids, ``n = num_generations``, ``logprobs=0`` (the sampled token's log-prob, which TRL's
  importance-sampling correction uses), ``return_token_ids``; the other processes get their slice by a broadcast.

``init_communicator`` raises ``NotImplementedError`` for any device but CUDA, so on a CPU the trainer cannot even
be built. :class:`FileWeightSyncClient` is TRL's ``VLLMClient`` with the two weight-transfer methods replaced when
the device TRL passes is not CUDA (on CUDA both call TRL's own, unchanged):

- ``init_communicator``: no NCCL group; a handshake with the server's worker extension
  (:class:`trl_rlvr._compat.vllm_cpu.WeightReloadExtension`, which ``python -m trl_rlvr.scripts.vllm_serve`` adds)
  through ``POST /collective_rpc``: the server must read a probe file the trainer wrote, so it shares the
  trainer's file system (the same machine: ``/dev/shm``);
- ``update_named_params``: the parameters TRL streams are written, one at a time as TRL gathers them, into one
  safetensors file (its header from the metadata TRL collects on its first sync), then one ``POST /collective_rpc``
  makes every worker reload the model from it in place (vLLM's ``reload_weights``, as in colocate mode), and the
  file is removed. TRL's ``reset_prefix_cache`` follows, unchanged.

:func:`server_client_without_nccl` puts the class where ``VLLMGeneration`` builds its client, while
``GRPOTrainer.__init__`` runs (declared in trl_rlvr._compat.trl_contract: ``VLLM_SERVER_CLIENT``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import struct
import tempfile
import time

import torch
from trl.generation.vllm_client import VLLMClient

#: Where the weights file is written: this environment variable, else shared memory, else the temp directory. The
#: server must see the same path (same machine, or a file system both mount).
WEIGHTS_DIR_VARIABLE = "TRL_RLVR_VLLM_WEIGHTS_DIR"

#: The server's worker-extension methods (trl_rlvr._compat.vllm_cpu.WeightReloadExtension).
HANDSHAKE, RELOAD = "trl_rlvr_weight_sync", "trl_rlvr_reload_weights"

#: safetensors' dtype names, by TRL's metadata dtype names (``str(param.dtype)`` without ``torch.``).
SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64"}

#: Seconds a reload may take before the push fails (a 7B model reloads in well under this on a CPU).
RELOAD_TIMEOUT_S = 600.0

START_THE_SERVER = (
    "start it with `python -m trl_rlvr.scripts.vllm_serve --model MODEL ...` (or add `--worker-extension-cls "
    "trl_rlvr._compat.vllm_cpu.WeightReloadExtension` and VLLM_SERVER_DEV_MODE=1 to your `vllm serve`)")


def weights_dir() -> str:
    """The folder the weights file goes to (:data:`WEIGHTS_DIR_VARIABLE`, ``/dev/shm``, the temp directory)."""
    chosen = os.environ.get(WEIGHTS_DIR_VARIABLE)
    if chosen:
        return chosen
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def collective_rpc(base_url: str, method: str, *args: str, timeout: float = 60.0) -> list:
    """Call ``method(*args)`` on every worker of the vLLM server (its dev-mode ``/collective_rpc``); one result per
    worker. No retry: a reload that failed is reported, not sent again."""
    import requests  # TRL's client needs it too; imported here so that building any trainer does not

    response = requests.post(f"{base_url}/collective_rpc", json={"method": method, "args": list(args)},
                             timeout=timeout)
    if response.status_code == 404:
        raise RuntimeError(f"The vLLM server at {base_url} has no /collective_rpc endpoint (vLLM's dev mode): "
                           f"{START_THE_SERVER}.")
    if response.status_code != 200:
        raise RuntimeError(f"The vLLM server at {base_url} failed {method}: {response.status_code} {response.text}")
    return response.json()["results"]


def safetensors_header(metadata: list[tuple[str, str, list[int]]]) -> tuple[bytes, list[int]]:
    """The header of a safetensors file holding ``metadata``'s tensors in order (format: a little-endian u64 length,
    then the JSON header padded with spaces to 8 bytes), and each tensor's size in bytes."""
    entries, sizes, offset = {}, [], 0
    for name, dtype, shape in metadata:
        if dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"weight push: {name} has dtype {dtype}, which the file push does not write")
        size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        for dim in shape:
            size *= dim
        entries[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        sizes.append(size)
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, sizes


def write_safetensors(path: str, metadata: list[tuple[str, str, list[int]]], named_params) -> int:
    """Write ``named_params`` ((name, tensor) pairs, in ``metadata``'s order, as TRL streams them) to ``path``, each
    tensor as it comes: nothing is held after its turn (under ZeRO-3 a gathered parameter is released after it).
    Fails when the stream differs from ``metadata``. Returns the bytes written."""
    header, sizes = safetensors_header(metadata)
    written = 0
    with open(path, "wb") as file:
        file.write(header)
        count = 0
        for (name, tensor), (expected, dtype, shape), size in zip(named_params, metadata, sizes, strict=True):
            if name != expected or str(tensor.dtype) != f"torch.{dtype}" or list(tensor.shape) != list(shape):
                raise ValueError(f"weight push: got {name} {tensor.dtype} {list(tensor.shape)} where TRL's metadata "
                                 f"has {expected} {dtype} {shape}")
            data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
            assert data.nbytes == size
            file.write(memoryview(data))
            written += size
            count += 1
    return len(header) + written


def make_weights_dir() -> str:
    """A fresh folder for the weight files, under :func:`weights_dir`, removed at exit."""
    file_dir = tempfile.mkdtemp(prefix="trl_rlvr_weights_", dir=weights_dir())
    atexit.register(shutil.rmtree, file_dir, ignore_errors=True)
    return file_dir


def check_file_weight_sync(base_url: str, file_dir: str) -> None:
    """The server's workers have the reload extension and read the trainer's files: each must return the token of a
    probe file written to ``file_dir``."""
    token = secrets.token_hex(8)
    probe = os.path.join(file_dir, "probe")
    with open(probe, "w") as file:
        file.write(token)
    try:
        results = collective_rpc(base_url, HANDSHAKE, probe)
    except RuntimeError as error:
        raise RuntimeError(f"{error}\nThe trainer runs on a CPU, without NCCL: it pushes its weights through a "
                           f"file the server reloads; {START_THE_SERVER}.") from None
    finally:
        os.unlink(probe)
    unread = [r for r in results if not isinstance(r, dict) or r.get("probe") != token]
    if unread:
        raise RuntimeError(f"The vLLM server at {base_url} cannot read the trainer's weight files in {file_dir} "
                           f"({unread}): run it on the same machine, or set {WEIGHTS_DIR_VARIABLE} to a folder both "
                           "mount.")


def push_weights_file(base_url: str, file_dir: str, metadata: list[tuple[str, str, list[int]]], named_params,
                      timeout: float = RELOAD_TIMEOUT_S) -> dict:
    """Write ``named_params`` (in ``metadata``'s order) to one safetensors file in ``file_dir``, make every worker of
    the server reload its model from it in place, remove the file. Returns the push's bytes, tensors and seconds."""
    path = os.path.join(file_dir, f"weights-{secrets.token_hex(4)}.safetensors")
    start = time.perf_counter()
    try:
        size = write_safetensors(path + ".partial", metadata, named_params)
        os.replace(path + ".partial", path)
        written = time.perf_counter()
        results = collective_rpc(base_url, RELOAD, path, timeout=timeout)
    finally:
        for leftover in (path, path + ".partial"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
    return {"bytes": size, "tensors": len(metadata), "write_s": written - start,
            "reload_s": time.perf_counter() - written, "server_reload_s": max(r["seconds"] for r in results)}


class FileWeightSyncClient(VLLMClient):
    """TRL's ``VLLMClient``; when the trainer's device is not CUDA, its weight push goes through a safetensors file
    and the server's in-place reload (module docstring). ``last_push``: the last push's bytes and seconds."""

    file_dir: str | None = None  # set by init_communicator when the push goes through files
    last_push: dict | None = None

    def init_communicator(self, device: torch.device | str | int = 0):
        if (torch.device("cuda", device) if isinstance(device, int) else torch.device(device)).type == "cuda":
            return super().init_communicator(device)  # TRL's NCCL weight transfer, untouched
        self.file_dir = make_weights_dir()
        self.check_file_weight_sync()

    def check_file_weight_sync(self) -> None:
        """:func:`check_file_weight_sync` on this client's server and folder."""
        check_file_weight_sync(self.base_url, self.file_dir)

    def update_named_params(self, metadata, named_params):
        if self.file_dir is None:
            return super().update_named_params(metadata, named_params)
        self.last_push = push_weights_file(self.base_url, self.file_dir, metadata, named_params)


def served_parameter_matches(base_url: str, name: str, trained: torch.Tensor) -> bool:
    """Whether every worker of the server holds parameter ``name`` equal to ``trained`` (the trainer's, cast to the
    dtype the server holds it in): the weight-push check of the tests and the benchmark."""
    for served in collective_rpc(base_url, "trl_rlvr_parameter", name):
        expected = trained.detach().to("cpu", getattr(torch, served["dtype"])).float().flatten().tolist()
        if served["values"] != expected:
            return False
    return True


@contextlib.contextmanager
def server_client_without_nccl(args):
    """Within the block (``GRPOTrainer.__init__``), TRL's server mode builds :class:`FileWeightSyncClient`: TRL's
    client, whose weight push works without NCCL where the trainer has no CUDA device. Other modes: nothing."""
    if not (getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", None) == "server"):
        yield
        return
    from trl.generation import vllm_generation

    from trl_rlvr._compat.swaps import swapped

    with swapped(vllm_generation, "VLLMClient", FileWeightSyncClient):
        yield
