"""Test helpers for trl-rlvr and its plugin authors: a tiny random causal LM and a character-level tokenizer, built locally (no hub access).

``build_tiny_model(path)`` writes a 2-layer Qwen2 (hidden 64) and its tokenizer to ``path``.
Load the tokenizer with ``PreTrainedTokenizerFast.from_pretrained(path)`` (``AutoTokenizer``
would turn it into a Qwen2Tokenizer that drops spaces).
"""

from __future__ import annotations

import string
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<unk>", "<user>", "<assistant>", "<system>"]
    chars = list(dict.fromkeys(string.printable))
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
        additional_special_tokens=["<user>", "<assistant>", "<system>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(path: str | Path, seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> Path:
    """Write a tiny random Qwen2 causal LM and its tokenizer to ``path``; return the path."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    path = Path(path)
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def load_tokenizer(path: str | Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path))
