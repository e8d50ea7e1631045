"""The trainer's side of server mode without NCCL (trl_rlvr/_compat/vllm_server.py), with no vLLM and no server: the
streamed safetensors file, the client's choice between TRL's NCCL path and the file push, the handshake's failures,
and the swap of TRL's client class during construction. The push against a real server: tests/engines/
test_vllm_server.py (vLLM venv)."""

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from trl_rlvr._compat import vllm_server
from trl_rlvr._compat.vllm_server import FileWeightSyncClient, safetensors_header, write_safetensors

DTYPES = ("float32", "bfloat16", "float16", "float64")


def metadata_of(named):
    return [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in named]


@st.composite
def named_tensors(draw):
    count = draw(st.integers(1, 5))
    named = []
    for i in range(count):
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        dtype = getattr(torch, draw(st.sampled_from(DTYPES)))
        seed = draw(st.integers(0, 2**16))
        values = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
        named.append((f"layers.{i}.weight", values))
    return named


@settings(max_examples=60, deadline=None)
@given(named=named_tensors(), transposed=st.booleans())
def test_the_streamed_file_is_a_safetensors_file_of_exactly_the_tensors(tmp_path_factory, named, transposed):
    """Whatever the dtypes, shapes (0-d, empty) and memory layout, safetensors reads back each tensor bit for bit, under
    its name, and the file is the header plus the tensors' bytes."""
    if transposed:  # a non-contiguous view, as a transposed parameter would be
        named = [(name, t.t() if t.dim() == 2 else t) for name, t in named]
    path = str(tmp_path_factory.mktemp("push") / "w.safetensors")
    size = write_safetensors(path, metadata_of(named), iter(named))
    assert size == os.path.getsize(path)
    with safe_open(path, framework="pt") as weights:
        assert list(weights.keys()) == sorted(name for name, _ in named)
        for name, tensor in named:
            loaded = weights.get_tensor(name)
            assert loaded.dtype == tensor.dtype and loaded.shape == tensor.shape
            assert torch.equal(loaded.view(-1).view(torch.uint8), tensor.contiguous().view(-1).view(torch.uint8))


@pytest.mark.parametrize("change", ["name", "dtype", "shape", "missing", "extra"])
def test_a_stream_that_differs_from_trls_metadata_fails(tmp_path, change):
    named = [("a", torch.zeros(2, 3)), ("b", torch.ones(4))]
    metadata = metadata_of(named)
    stream = list(named)
    if change == "name":
        stream[1] = ("c", stream[1][1])
    elif change == "dtype":
        stream[1] = ("b", stream[1][1].double())
    elif change == "shape":
        stream[1] = ("b", torch.ones(5))
    elif change == "missing":
        stream = stream[:1]
    else:
        stream.append(("d", torch.ones(1)))
    with pytest.raises(ValueError):
        write_safetensors(str(tmp_path / "w.safetensors"), metadata, iter(stream))


def test_an_unsupported_dtype_is_named():
    with pytest.raises(ValueError, match="int8"):
        safetensors_header([("q", "int8", [2])])


def bare_client(base_url="http://server:8000"):
    """A FileWeightSyncClient without TRL's __init__ (which needs vLLM and a live server)."""
    client = FileWeightSyncClient.__new__(FileWeightSyncClient)
    client.base_url = base_url
    return client


def test_on_cuda_the_client_is_trls_nccl_client(monkeypatch):
    calls = []
    monkeypatch.setattr(vllm_server.VLLMClient, "init_communicator", lambda self, device=0: calls.append(("init", device)))
    monkeypatch.setattr(vllm_server.VLLMClient, "update_named_params", lambda self, m, p: calls.append(("push", m)))
    monkeypatch.setattr(vllm_server, "collective_rpc", lambda *a, **k: pytest.fail("the file path was used on CUDA"))
    for device in (0, "cuda", "cuda:1", torch.device("cuda", 0)):
        client = bare_client()
        client.init_communicator(device)
        client.update_named_params([("a", "float32", [1])], iter([]))
        assert client.file_dir is None
    assert [c[0] for c in calls] == ["init", "push"] * 4


def test_on_a_cpu_the_push_is_one_file_the_server_reloads_then_removed(monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_server.WEIGHTS_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setattr(vllm_server.VLLMClient, "init_communicator", lambda *a, **k: pytest.fail("NCCL on a CPU"))
    seen = []

    def server(base_url, method, *args, timeout=60.0):
        if method == vllm_server.HANDSHAKE:
            with open(args[0]) as file:
                return [{"probe": file.read(), "device": "cpu"}]
        assert method == vllm_server.RELOAD
        with safe_open(args[0], framework="pt") as weights:
            seen.append({name: weights.get_tensor(name) for name in weights.keys()})
        return [{"tensors": len(seen[-1]), "seconds": 0.01}]

    monkeypatch.setattr(vllm_server, "collective_rpc", server)
    client = bare_client()
    client.init_communicator(torch.device("cpu"))
    assert os.path.dirname(client.file_dir) == str(tmp_path)
    named = [("model.norm.weight", torch.arange(4.0)), ("model.embed_tokens.weight", torch.ones(3, 2))]
    client.update_named_params(metadata_of(named), iter(named))
    assert len(seen) == 1 and all(torch.equal(seen[0][n], t) for n, t in named)
    assert os.listdir(client.file_dir) == []  # the file (and the probe) removed: shared memory freed
    assert client.last_push["tensors"] == 2 and client.last_push["bytes"] > 4 * 4 + 6 * 4


def test_a_server_that_cannot_read_the_trainers_files_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_server.WEIGHTS_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setattr(vllm_server, "collective_rpc", lambda *a, **k: [{"probe": "something else"}])
    with pytest.raises(RuntimeError, match=vllm_server.WEIGHTS_DIR_VARIABLE):
        bare_client().init_communicator("cpu")


def test_a_server_without_the_extension_is_told_how_to_start(monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_server.WEIGHTS_DIR_VARIABLE, str(tmp_path))

    class Response:
        status_code, text = 500, "'CPUWorker' object has no attribute 'trl_rlvr_weight_sync'"

    monkeypatch.setattr("requests.post", lambda *a, **k: Response())
    with pytest.raises(RuntimeError, match="trl_rlvr.scripts.vllm_serve"):
        bare_client().init_communicator("cpu")


def test_the_client_class_is_swapped_only_in_server_mode_and_only_during_the_block():
    from types import SimpleNamespace

    from trl.generation import vllm_generation

    original = vllm_generation.VLLMClient
    with vllm_server.server_client_without_nccl(SimpleNamespace(use_vllm=True, vllm_mode="colocate")):
        assert vllm_generation.VLLMClient is original
    with pytest.raises(KeyError), vllm_server.server_client_without_nccl(SimpleNamespace(use_vllm=True,
                                                                                        vllm_mode="server")):
        assert vllm_generation.VLLMClient is FileWeightSyncClient
        raise KeyError
    assert vllm_generation.VLLMClient is original
