"""The vLLM server the server-mode tests share (tests/engines/test_vllm_server*.py): one start per session."""

import pytest


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """``(model_dir, server)``: the tiny model (4 heads of 64: vLLM's CPU attention wants head sizes from 32 up)
    served by ``python -m trl_rlvr.scripts.vllm_serve`` (trl_rlvr.scripts.local_server), stopped at the session's
    end. Tests that push weights leave theirs on it: a test that needs the model's own weights pushes them."""
    from trl_rlvr.scripts.local_server import served
    from trl_rlvr.testing import build_tiny_model

    model_dir = str(build_tiny_model(tmp_path_factory.mktemp("tiny_server"), hidden_size=256))
    with served(model_dir, max_model_len=256, log_dir=str(tmp_path_factory.mktemp("server_log"))) as server:
        yield model_dir, server
