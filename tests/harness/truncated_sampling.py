"""vLLM's truncated sampling in torch: the log-probs its sampler returns under min-p / top-k / top-p."""

import math

import torch


def processed_logprobs(logits: torch.Tensor, top_k: int, top_p: float, min_p: float | None) -> torch.Tensor:
    """The log-probs vLLM's sampler returns in ``processed_logprobs`` mode (vllm/v1/sample: min-p as a logits
    processor, then top-k, then top-p, then ``log_softmax`` of what is left); -inf where a token was cut."""
    logits = logits.clone()
    if min_p:
        probs = logits.softmax(-1)
        logits[probs < min_p * probs.max()] = -math.inf
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.numel())).values[-1]
        logits[logits < kth] = -math.inf
    if top_p < 1:
        order = logits.argsort()  # ascending: cut the smallest tokens whose mass stays within 1 - top_p
        cut = logits[order].softmax(-1).cumsum(-1) <= 1 - top_p
        cut[-1] = False  # the most likely token always stays
        logits[order[cut]] = -math.inf
    return logits.log_softmax(-1)
