r"""Multi-turn (tool-integrated) stabilizers, as pure functions on plain lists and tensors.

TRL's multi-turn loop has none of them; each is a published fix for a way tool RL collapses or narrows. The
trainer calls them between scoring and the advantages (docs/tool_rl.md has the config fields, all off by default,
and the order of the calls). A *rollout* here is TRL's conversational completion: a list of messages, the
assistant's turns (``{"role": "assistant", "content": ..., "tool_calls": [...]}``) and the tools' replies
(``{"role": "tool", ...}``), as ``GRPOTrainer._tool_call_loop`` builds it.

- **Void turns** (SimpleTIR: Xue et al., 2025, "SimpleTIR: End-to-End Reinforcement Learning for Multi-Turn
  Tool-Integrated Reasoning", arXiv 2509.02479): a turn that holds neither a tool call nor a final answer. Their
  trajectories carry the low-probability tokens whose gradients blow up multi-turn training; SimpleTIR filters
  them out of the loss. :func:`void_turn_rollouts` finds them, :func:`void_turn_filter` zeroes their advantage
  or drops them from the loss (their tokens then leave the token count too); or they score as a wrong answer
  (:func:`score_as_wrong`), so that giving no answer never beats a wrong guess.
- **A cap on tool calls per answer**: :func:`tool_call_counts` and :func:`over_tool_call_cap`; a rollout over the
  cap scores as a wrong answer (:func:`score_as_wrong`), so the policy is never paid for looping on the tool.
- **Tool error replies cut to their last traceback line** (ToRL: Li et al., 2025, "ToRL: Scaling Tool-Integrated
  RL", arXiv 2503.23383: when a cell fails, the model is shown only the last line of its error message):
  :func:`last_error_line`. Short replies keep the budget for the model's own tokens.
- **Resample-on-correct** (rStar2-Agent: Shang et al., 2025, "rStar2-Agent: Agentic Reasoning Technical Report",
  arXiv 2508.20722, GRPO-RoC): sample ``k * G`` rollouts per question, keep the right ones with the fewest tool
  errors and a uniform draw of the wrong ones, ``G`` in all (:func:`resample_on_correct`). The errors are those a
  rollout shows (cells that raised, timed out or exited, and cells whose output shows a traceback or an error
  line: ``PythonEnvironment.stats``), so a policy cannot hide one by catching it and printing it.

None of them raises a rollout's total reward: the cap and ``"score_as_wrong"`` lower it (:func:`score_as_wrong`),
void turns leave the loss or its gradient, resample-on-correct drops rollouts, the error cut shortens replies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

#: ``void_turn_action`` values: leave the rollout alone, zero its advantage, drop it from the loss, or score it as
#: a wrong answer (:func:`score_as_wrong`).
VOID_TURN_ACTIONS = ("off", "zero_advantage", "drop", "score_as_wrong")
#: The ``void_turn_action`` values that act on the advantages (the others act on the rewards, or not at all).
VOID_TURN_ADVANTAGE_ACTIONS = ("zero_advantage", "drop")
#: ``tool_error_reply`` values: the environment's reply as it is, or the last line of a failed call's error.
TOOL_ERROR_REPLIES = ("full", "last_line")


def _assistant_turns(rollout) -> list[dict]:
    if not isinstance(rollout, list):  # a plain-text completion has no turns to judge
        return []
    return [m for m in rollout if isinstance(m, dict) and m.get("role") == "assistant"]


def _text(content) -> str:
    """A message's text: a string, or the text parts of a list of content blocks; anything else is no text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def void_turn_rollouts(rollouts: Sequence, is_final_answer: Callable[[str], bool]) -> list[bool]:
    """Per rollout, whether one of its assistant turns is *void*: no tool call and no final answer (SimpleTIR).

    ``rollouts``: TRL's conversational completions (lists of messages). ``is_final_answer(text)``: whether a turn's
    text gives the final answer (for ``boxed_math``: ``len(find_boxes(text)) == 1``); it is the caller's, so the
    rule follows the task's reward. A turn with ``tool_calls`` is never void (a call that parsed); a turn whose
    call did not parse is text, so it is void unless it also answers. A rollout with no assistant turn at all (a
    completion cut to nothing) is void: it neither called nor answered. A plain-text rollout (a string) is judged
    as one turn.
    """
    out = []
    for rollout in rollouts:
        if isinstance(rollout, str):
            out.append(not is_final_answer(rollout))
            continue
        turns = _assistant_turns(rollout)
        out.append(not turns or any(not m.get("tool_calls") and not is_final_answer(_text(m.get("content")))
                                    for m in turns))
    return out


def void_turn_filter(advantages: torch.Tensor, void: torch.Tensor, action: str = "zero_advantage"
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, keep): the advantages with those of void rollouts set to 0 (``"zero_advantage"``) and the mask
    of rollouts that stay in the loss (``"drop"``: void ones leave it, and their tokens leave the loss's token
    count, SimpleTIR's filtering); ``"off"`` and ``"score_as_wrong"`` (which acts on the rewards, before the
    advantages: :func:`score_as_wrong`) return both unchanged. ``advantages``: (N,) or (N, T) per token;
    ``void``: (N,) bool.

    Either way a void rollout stops counting in the gradient, right or wrong: a wrong guess in its group is still
    pushed down, so under ``"zero_advantage"`` and ``"drop"`` giving no answer beats a wrong one (the trade-off
    of SimpleTIR's filter; ``"score_as_wrong"`` does not make it)."""
    if action not in VOID_TURN_ACTIONS:
        raise ValueError(f"void_turn_action={action!r} is not valid; allowed values: "
                         f"{', '.join(map(repr, VOID_TURN_ACTIONS))}")
    void = void.to(torch.bool)
    if void.shape != advantages.shape[:1]:
        raise ValueError(f"void has shape {tuple(void.shape)}, the advantages {tuple(advantages.shape)}: one flag "
                         "per rollout")
    keep = ~void if action in VOID_TURN_ADVANTAGE_ACTIONS else torch.ones_like(void)
    if action not in VOID_TURN_ADVANTAGE_ACTIONS:
        return advantages, keep
    shape = (-1,) + (1,) * (advantages.dim() - 1)
    return torch.where(void.view(shape), torch.zeros_like(advantages), advantages), keep


def tool_call_counts(rollouts: Sequence) -> list[int]:
    """Per rollout, the tool calls its assistant turns made (every entry of every turn's ``tool_calls``)."""
    return [sum(len(m.get("tool_calls") or ()) for m in _assistant_turns(r)) for r in rollouts]


def over_tool_call_cap(counts: Sequence[int] | torch.Tensor, cap: int) -> torch.Tensor:
    """(N,) bool: rollouts with more than ``cap`` tool calls (``cap >= 1``)."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"max_tool_calls_per_answer must be an integer >= 1, not {cap!r}")
    return torch.as_tensor(counts) > cap


def score_as_wrong(rewards: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``rewards`` (N, F) per function, before the weights, with the rollouts of ``rows`` (N,) bool scored as a wrong
    answer: every term that raises the total is removed, every term that lowers it (a penalty) is kept.

    With ``weights`` (F,) ``w``, a row's total is ``sum_f w_f r_f`` (the weighted sum the advantages are computed
    from). A flagged row's reward ``r_f`` is kept where ``w_f r_f < 0`` and set to 0 elsewhere, so its total becomes
    ``sum_f min(w_f r_f, 0)``: at most its total before (each term is at most what it was), at most 0 (the score of
    a wrong answer under a 0/1 correctness reward, before any penalty), and every penalty kept, whatever the signs
    of the weights (a negative weight on a positive score is a penalty too). A NaN (not scored) stays NaN: scoring
    as wrong never makes an unscored function, or an unscorable row, scored. Rewards whose wrong answers score below
    0 (a -1/+1 correctness reward) keep that: a flagged right answer then scores 0, above a wrong one; use 0/1."""
    if rewards.dim() != 2 or weights.shape != rewards.shape[1:]:
        raise ValueError(f"rewards must be (N, F) and weights (F,), got {tuple(rewards.shape)} and "
                         f"{tuple(weights.shape)}")
    weights = weights.to(rewards.device, rewards.dtype)
    keep = (rewards * weights < 0) | torch.isnan(rewards) | ~rows.to(rewards.device, torch.bool)[:, None]
    return torch.where(keep, rewards, torch.zeros_like(rewards))


#: The longest error line kept (a hostile exception message can be as long as the reply's bound).
ERROR_LINE_CHARS = 300


def last_error_line(reply: str, max_chars: int = ERROR_LINE_CHARS) -> str:
    """The last non-blank line of an error reply (``NameError: name 'x' is not defined``), at most ``max_chars``
    characters (its head and its end around ``...``): ToRL's error replies. The caller applies it to replies of
    cells that *raised* (``PythonEnvironment.stats["errors"]`` went up), never to a cell's printed output: a cell
    can print a fake traceback. A reply with no non-blank line is returned as it is."""
    if max_chars < 20:
        raise ValueError(f"max_chars must be at least 20, not {max_chars}")
    lines = [line.strip() for line in reply.splitlines() if line.strip()]
    if not lines:
        return reply
    line = lines[-1]
    if len(line) > max_chars:
        keep = max_chars - 5
        line = line[: keep * 2 // 3] + " ... " + line[len(line) - (keep - keep * 2 // 3):]
    return line


def resample_on_correct(rewards: torch.Tensor, tool_errors: torch.Tensor, sampled_per_group: int, group_size: int,
                        success_threshold: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Indices of the ``group_size`` rollouts kept from each group of ``sampled_per_group`` (rStar2-Agent's
    GRPO-RoC, "Resample-on-Correct"), group after group, each group's indices ascending.

    ``rewards``: (num_groups * sampled_per_group,) success scores (right: ``>= success_threshold``; NaN: wrong);
    ``tool_errors``: the same shape, each rollout's tool errors (errors + timeouts). The group keeps its share of
    right answers (rounded, and at least one right and one wrong when it had both, so that no group loses its
    signal); the right ones are those with the fewest tool errors (ties broken at random), the wrong ones a
    uniform draw (rStar2 keeps failures diverse, and filters only successes, where a lucky answer after broken
    code would otherwise be reinforced). rStar2 samples successes with probability inversely proportional to
    their error and format penalties; the fewest-errors rule is its deterministic limit. ``generator`` seeds the
    draws.
    """
    if sampled_per_group < group_size or group_size < 2:
        raise ValueError(f"resample_on_correct needs sampled_per_group ({sampled_per_group}) >= group_size "
                         f"({group_size}) >= 2")
    if rewards.numel() % sampled_per_group or rewards.shape != tool_errors.shape:
        raise ValueError(f"rewards ({tuple(rewards.shape)}) and tool_errors ({tuple(tool_errors.shape)}) must have the "
                         f"same shape, a multiple of sampled_per_group={sampled_per_group}")
    right_all = (rewards >= success_threshold).view(-1, sampled_per_group)
    errors_all = tool_errors.to(torch.float64).view(-1, sampled_per_group)
    kept = []
    for g, (right, errors) in enumerate(zip(right_all, errors_all)):
        n_right = int(right.sum())
        n_wrong = sampled_per_group - n_right
        take_right = round(group_size * n_right / sampled_per_group)
        if n_right and n_wrong:
            take_right = min(max(take_right, 1), group_size - 1)
        take_right = min(take_right, n_right)
        take_right = max(take_right, group_size - n_wrong)  # too few wrong ones: fill with right ones
        right_idx = right.nonzero().flatten()
        wrong_idx = (~right).nonzero().flatten()
        jitter = torch.rand(n_right, generator=generator, dtype=torch.float64)  # ties between equal error counts
        order = torch.argsort(errors[right_idx] + 0.5 * jitter, stable=True)  # errors are integers: jitter < 1
        chosen = right_idx[order[:take_right]]
        draw = torch.randperm(n_wrong, generator=generator)[: group_size - take_right]
        chosen = torch.cat([chosen, wrong_idx[draw]])
        kept.append(torch.sort(chosen).values + g * sampled_per_group)
    return torch.cat(kept) if kept else torch.zeros(0, dtype=torch.long)
