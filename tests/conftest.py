"""Shared fixtures. Tests never read ../shared and never touch the Hugging Face hub."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen2 + char tokenizer on local disk (see trl_rlvr/testing.py)."""
    from trl_rlvr.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"))
