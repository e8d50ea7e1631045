"""Test helpers for trl-rlvr and its plugin authors: a tiny random causal LM and a character-level tokenizer, built locally (no hub access).

``build_tiny_model(path)`` writes a 2-layer Qwen2 (hidden 64) and its tokenizer to ``path``.
Load the tokenizer with ``PreTrainedTokenizerFast.from_pretrained(path)`` (``AutoTokenizer``
would turn it into a Qwen2Tokenizer that drops spaces).

``load_tool_tokenizer(path)`` is the same tokenizer with a tool-calling chat template
(``TOOL_CHAT_TEMPLATE``) and the response template TRL parses tool calls with
(``TOOL_RESPONSE_TEMPLATE``): an assistant turn is ``<assistant>text<call>{"name": ..., "arguments":
{...}}</call><eos>``, a tool's result ``<user>output: ...<eos>``. Same vocabulary, so the same tiny model.
"""

from __future__ import annotations

import string
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


#: A chat template that renders a whole tool-calling conversation (TRL's ``supports_tool_calling``) and keeps each
#: conversation's rendering a prefix of the next one's (``is_chat_template_prefix_preserving``). The markers are
#: plain characters of the char tokenizer: the tools' names only, so that prompts stay short.
TOOL_CHAT_TEMPLATE = (
    "{%- if tools -%}<system>tools:{% for tool in tools %} {{ tool['function']['name'] }}{% endfor %}<eos>{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}<assistant>{{ message['content'] }}"
    "{%- for call in message.get('tool_calls') or [] -%}<call>{{ call['function'] | tojson }}</call>{%- endfor -%}<eos>"
    "{%- elif message['role'] == 'tool' -%}<user>output: {{ message['content'] }}<eos>"
    "{%- else -%}<{{ message['role'] }}>{{ message['content'] }}<eos>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<assistant>{%- endif -%}"
)
#: transformers' response template for ``TOOL_CHAT_TEMPLATE`` (what ``tokenizer.parse_response`` reads).
TOOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<assistant>",
    "fields": {
        "tool_calls": {"open": "<call>", "close_pattern": r"</call>", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<eos>", "content": "text"},
    },
}  # fmt: skip


def tool_call_text(name: str, **arguments) -> str:
    """What the model writes to call tool ``name`` under ``TOOL_CHAT_TEMPLATE``."""
    import json

    return f"<call>{json.dumps({'name': name, 'arguments': arguments})}</call>"


def char_tokenizer():
    """The character-level ``tokenizers.Tokenizer`` under :func:`build_tokenizer` (no transformers import): one id
    per printable ASCII character, ``<unk>`` for any other."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    specials = ["<pad>", "<eos>", "<unk>", "<user>", "<assistant>", "<system>"]
    chars = list(dict.fromkeys(string.printable))
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return tok


def build_tokenizer():
    from transformers import PreTrainedTokenizerFast

    tok = char_tokenizer()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
        additional_special_tokens=["<user>", "<assistant>", "<system>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_chatml_tokenizer():
    """The char tokenizer plus ChatML's ``<|im_start|>`` and ``<|im_end|>`` as special tokens, ``<|im_end|>`` its end of
    turn (EOS): what a ChatML chat template (``examples/chat_templates/chatml_tools.jinja``) needs."""
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    return tokenizer


def build_tiny_chatml_model(path: str | Path, seed: int = 0, hidden_size: int = 64) -> Path:
    """:func:`build_tiny_model` with :func:`build_chatml_tokenizer` and 2048 positions (a tool prompt rendered in
    characters is long); ``hidden_size=256`` gives heads of 64, a size vLLM's CPU attention takes."""
    return build_tiny_model(path, seed, hidden_size=hidden_size, tokenizer=build_chatml_tokenizer(),
                            max_position_embeddings=2048)


def build_tiny_model(path: str | Path, seed: int = 0, hidden_size: int = 64, num_layers: int = 2, *, tokenizer=None,
                     max_position_embeddings: int = 512) -> Path:
    """Write a tiny random Qwen2 causal LM and its tokenizer (default: :func:`build_tokenizer`) to ``path``; return
    the path."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    path = Path(path)
    tokenizer = tokenizer if tokenizer is not None else build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
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


def load_tool_tokenizer(path: str | Path):
    """``load_tokenizer`` with the tool-calling chat and response templates."""
    tokenizer = load_tokenizer(path)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = TOOL_RESPONSE_TEMPLATE
    return tokenizer
