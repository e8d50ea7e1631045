"""The asynchronous trainer's weight sync without CUDA (trl_rlvr._compat.async_adapter.FileWeightTransfer), with no
vLLM and no server: RLVRAsyncTrainer builds it in place of TRL's NCCL client, with TRL's manifest; one sync is
TRL's pause, one file the server reloads (then removed), TRL's resume. Against a real server:
tests/engines/test_async_server.py (vLLM venv)."""

import os

import pytest
import torch
from safetensors import safe_open

pytest.importorskip("trl.experimental.async_grpo")

from tests.async_.test_async_trainer import StubWorker  # noqa: E402
from trl_rlvr._compat import vllm_server  # noqa: E402
from trl_rlvr._compat.async_adapter import FileWeightTransfer  # noqa: E402


class RecordingClient:
    """TRL's async ``VLLMClient`` as FileWeightTransfer calls it."""

    server_url = "http://server"

    def __init__(self):
        self.calls = []

    def wait_for_server_ready(self):
        self.calls.append("ready")

    def pause(self, timeout=None):
        self.calls.append("pause")

    def resume(self, timeout=None):
        self.calls.append("resume")


def fake_server(seen: list):
    def collective_rpc(base_url, method, *args, timeout=60.0):
        if method == vllm_server.HANDSHAKE:
            with open(args[0]) as file:
                return [{"probe": file.read()}]
        assert method == vllm_server.RELOAD
        with safe_open(args[0], framework="pt") as weights:
            seen.append({name: weights.get_tensor(name) for name in weights.keys()})
        return [{"seconds": 0.01}]

    return collective_rpc


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, TRL's NCCL client is kept")
def test_without_cuda_the_trainer_builds_the_file_transfer_with_trls_manifest(tiny_model_dir, tmp_path):
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast

    from trl_rlvr.async_grpo import RLVRAsyncConfig, RLVRAsyncTrainer

    args = RLVRAsyncConfig(output_dir=str(tmp_path), bf16=False, use_cpu=True, max_steps=1, report_to=[],
                           token_budget=0, per_device_train_batch_size=2, num_generations=2)
    trainer = RLVRAsyncTrainer(model=str(tiny_model_dir), reward_funcs=["think_format"], args=args,
                               train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}),
                               processing_class=PreTrainedTokenizerFast.from_pretrained(tiny_model_dir),
                               rollout_worker=StubWorker())
    transfer = trainer.weight_transfer
    assert type(transfer) is FileWeightTransfer and transfer.vllm is trainer.vllm_client
    names = [name for name, _ in trainer.model.named_parameters()]
    assert [m[0] for m in transfer.metadata] == names and {m[1] for m in transfer.metadata} == {"float32"}
    from trl.experimental.async_grpo import async_grpo_trainer

    assert async_grpo_trainer.WeightTransferClient.__name__ == "WeightTransferClient"  # TRL's, put back


def test_one_sync_is_a_pause_one_file_the_server_reloads_and_a_resume(monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_server.WEIGHTS_DIR_VARIABLE, str(tmp_path))
    seen = []
    monkeypatch.setattr(vllm_server, "collective_rpc", fake_server(seen))
    named = [("model.norm.weight", torch.arange(4.0)), ("model.embed_tokens.weight", torch.ones(3, 2))]
    client = RecordingClient()
    transfer = FileWeightTransfer(client, {"names": [n for n, _ in named], "dtype_names": ["float32"] * 2,
                                           "shapes": [list(t.shape) for _, t in named]})
    with pytest.raises(RuntimeError, match="before init_weight_transfer"):
        transfer.send_weights(iter(named))
    transfer.init_weight_transfer()
    for _ in range(2):  # as TRL's _sync_weight_merged calls it
        transfer.pause()
        transfer.send_weights(iter(named))
        transfer.resume()
    assert client.calls == ["ready", "pause", "resume", "pause", "resume"]
    assert len(seen) == 2 and all(torch.equal(seen[-1][n], t) for n, t in named)
    assert os.listdir(transfer.file_dir) == []  # each file (and the probe) removed
    assert transfer.pushes == 2 and transfer.last_push["tensors"] == 2
    file_dir = transfer.file_dir
    transfer.destroy()
    assert not os.path.exists(file_dir)


def test_a_stream_that_is_not_the_manifest_fails(monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_server.WEIGHTS_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setattr(vllm_server, "collective_rpc", fake_server([]))
    transfer = FileWeightTransfer(RecordingClient(), {"names": ["a"], "dtype_names": ["float32"], "shapes": [[2]]})
    transfer.init_weight_transfer()
    with pytest.raises(ValueError, match="TRL's metadata"):
        transfer.send_weights(iter([("a", torch.zeros(3))]))
    assert transfer.pushes == 0 and os.listdir(transfer.file_dir) == []
