"""A tiny causal LM *trained* to use a tool, for tests of tool rollouts on an engine that loads a model from its
folder (vLLM): ``scripted_tool_model`` steers HF ``forward``, which such an engine never runs.

:func:`build_trained_tool_model` trains the tiny model (``build_tiny_model``, character tokenizer,
``TOOL_CHAT_TEMPLATE``) on a handful of whole conversations until it has them by heart: the question
``What is A*B?``, a ``python`` tool call that prints the product, the tool's reply, and ``\\boxed{<the reply>}``.
Greedy decoding then replays the trace; sampling at temperature 1 replays it whole about half the time and
otherwise leaves it somewhere (a call that does not parse, other digits, another answer), which is what seeded
sampling needs to show. The questions it learns are :data:`QUESTIONS` (those of tests/harness/tool_eval_harness.py).
"""

from __future__ import annotations

from pathlib import Path

#: (a, b) of the questions ``What is a*b?`` the model learns to answer with the tool
QUESTIONS = ((12, 34), (56, 78), (91, 23), (45, 67), (11, 99), (38, 72), (64, 15))
#: the ``tools`` the conversations are rendered with: the names only matter to ``TOOL_CHAT_TEMPLATE``
PYTHON_TOOL = {"type": "function", "function": {"name": "python", "description": "Run Python code.",
                                                "parameters": {"type": "object", "properties": {
                                                    "code": {"type": "string"}}, "required": ["code"]}}}


def tool_conversation(a: int, b: int) -> list[dict]:
    """The trace learned for ``What is a*b?``: call ``print(a*b)``, read the reply (as ``PythonEnvironment``
    prints it), box it."""
    return [
        {"role": "user", "content": f"What is {a}*{b}?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "python", "arguments": {"code": f"print({a}*{b})"}}}]},
        {"role": "tool", "name": "python", "content": f"{a * b}\n"},
        {"role": "assistant", "content": f"\\boxed{{{a * b}}}"},
    ]


def assistant_tokens(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """The conversation's tokens (rendered with the ``python`` tool) and a flag per token: 1 on the assistant's
    turns (what the model learns to write), 0 on the prompt and the tool's replies."""
    def render(part, **kw):
        return tokenizer.apply_chat_template(part, tools=[PYTHON_TOOL], tokenize=True, return_dict=False, **kw)

    ids = render(messages)
    flags = [0] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            start, end = len(render(messages[:i], add_generation_prompt=True)), len(render(messages[: i + 1]))
            flags[start:end] = [1] * (end - start)
    return ids, flags


def build_trained_tool_model(path: str | Path, *, max_steps: int = 300, target_loss: float = 0.01, seed: int = 0,
                             hidden_size: int = 256, learning_rate: float = 1e-3) -> Path:
    """Write to ``path`` the tiny model trained on :func:`tool_conversation` of every :data:`QUESTIONS` pair
    (next-token loss on the assistant's turns, Adam, full-batch steps until the loss is below ``target_loss``; seconds on a
    CPU) and its tokenizer (load it with ``load_tool_tokenizer``). Returns ``path``. Raises RuntimeError when the
    loss is still above ``target_loss`` after ``max_steps`` (the model would not replay the traces)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trl_rlvr.testing import build_tiny_model, load_tool_tokenizer

    path = Path(path)
    build_tiny_model(path, seed=seed, hidden_size=hidden_size)
    tokenizer = load_tool_tokenizer(path)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rows = [assistant_tokens(tokenizer, tool_conversation(a, b)) for a, b in QUESTIONS]
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.tensor([ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids, _ in rows])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    learned = torch.tensor([flags + [0] * (width - len(flags)) for _, flags in rows])
    labels = input_ids.masked_fill(learned == 0, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    model.train()
    for _ in range(max_steps):
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        if loss.item() < target_loss:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    else:
        raise RuntimeError(f"build_trained_tool_model: the loss is {loss.item():.3f} after {max_steps} steps")
    model.eval()
    model.save_pretrained(path)
    return path
