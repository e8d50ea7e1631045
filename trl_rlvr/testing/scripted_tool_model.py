"""A tiny causal LM that uses a tool, for tests of tool rollouts: the random tiny model (``build_tiny_model``) with
its next-token logits pushed toward scripted turns, so that sampling it gives tool calls, answers, and now and
then a malformed call, a call of an unknown tool or a stray token, each with a probability set by the script.

The model reads its whole context at every step (``generate`` hands it and its attention mask to
``prepare_inputs_for_generation``), decodes the tokens the mask keeps with the character tokenizer
and finds the current assistant turn and what came before it. ``script(question, reply)`` (``reply``: the last
tool reply, None on the first turn) gives the turns it may write, each with a weight; every character that
continues one of them gets ``bias + weight`` added to its logit (the largest, when several share it). A sample
that leaves all of them is the random model's from there on. The generation, parsing, tool and scoring code
under test is the real one: only the policy is scripted.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path

from trl_rlvr.testing import TOOL_CHAT_TEMPLATE, load_tool_tokenizer, tool_call_text

Script = Callable[[str, "str | None"], list[tuple[str, float]]]


def arithmetic_script(question: str, reply: str | None) -> list[tuple[str, float]]:
    """For ``What is A*B?``: mostly a Python call that prints the product, then ``\\boxed{<the tool's reply>}``;
    sometimes an answer without the tool, a call of an unknown tool, a call whose JSON does not parse, or code
    that raises."""
    if reply is not None:
        return [(f"\\boxed{{{reply.strip()}}}<eos>", 0.0)]
    m = re.search(r"(\d+)\s*\*\s*(\d+)", question)
    expr = f"{m.group(1)}*{m.group(2)}" if m else "0"
    return [
        (tool_call_text("python", code=f"print({expr})") + "<eos>", 0.0),
        (f"\\boxed{{{m.group(1) if m else 0}}}<eos>", -2.0),  # an answer from its head (wrong)
        (tool_call_text("calculator", expression=expr) + "<eos>", -2.5),  # a tool that does not exist
        ('<call>{"name": "python", "arguments": {"code": print(' + expr + ")}}</call><eos>", -2.5),  # bad JSON
        (tool_call_text("python", code=f"print({expr} / 0)") + "<eos>", -3.0),  # raises in the interpreter
    ]


def _turn_context(text: str) -> tuple[str, str | None, str]:
    """(the question, the last tool reply before the current turn or None, the current turn so far) of a context
    rendered by ``TOOL_CHAT_TEMPLATE``."""
    head, _, turn = text.rpartition("<assistant>")
    users = re.findall(r"<user>(.*?)<eos>", head, flags=re.S)
    question = next((u for u in users if not u.startswith("output: ")), "")
    last = head[head.rfind("<user>"):]
    opener = "<user>output: "
    reply = last[len(opener):-len("<eos>")] if last.startswith(opener) and last.endswith("<eos>") else None
    return question, reply, turn


def load_scripted_tool_model(path: str | Path, script: Script = arithmetic_script, bias: float = 12.0):
    """``(model, tokenizer)``: the tiny model at ``path`` driven by ``script``, and its tool-calling tokenizer
    (``load_tool_tokenizer``). ``bias`` (logits) sets how faithfully the script is followed: with the tiny random
    model, a character leaves every scripted turn with a probability of about ``vocab / e**bias``."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = load_tool_tokenizer(path)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id

    def next_ids(turn: str, alternatives) -> dict[int, float]:
        boost: dict[int, float] = {}
        for target, weight in alternatives:
            if not target.startswith(turn) or len(target) == len(turn):
                continue
            rest = target[len(turn):]
            token = eos if rest.startswith("<eos>") else tokenizer.convert_tokens_to_ids(rest[0])
            boost[token] = max(boost.get(token, -float("inf")), bias + weight)
        return boost

    class ScriptedToolModel(type(base)):
        def prepare_inputs_for_generation(self, input_ids, *args, **kwargs):
            # the whole context and its mask; the step's inputs are only its new tokens (KV cache)
            self._context = (input_ids, kwargs.get("attention_mask"))
            return super().prepare_inputs_for_generation(input_ids, *args, **kwargs)

        def forward(self, input_ids=None, **kwargs):
            out = super().forward(input_ids=input_ids, **kwargs)
            context, mask = getattr(self, "_context", None) or (None, None)
            if context is None or context.shape[0] != input_ids.shape[0]:
                context, mask = input_ids, kwargs.get("attention_mask")
            self._context = None
            logits = out.logits[:, -1, :].clone()
            masks = mask.tolist() if mask is not None and mask.shape == context.shape else None
            for r, row in enumerate(context.tolist()):
                # the row's own tokens: not its padding, not what a continued turn masked (cached_turns)
                ids = [t for c, t in enumerate(row) if (masks[r][c] if masks else t != pad)]
                question, reply, turn = _turn_context(tokenizer.decode(ids, skip_special_tokens=False))
                for token, b in next_ids(turn, script(question, reply)).items():
                    logits[r, token] += b
            out.logits = out.logits.clone()
            out.logits[:, -1, :] = logits
            return out

    ScriptedToolModel.forward.__signature__ = inspect.signature(type(base).forward)  # generate checks its kwargs
    base.__class__ = ScriptedToolModel
    base.eval()
    assert tokenizer.chat_template == TOOL_CHAT_TEMPLATE
    return base, tokenizer
