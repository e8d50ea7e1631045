"""The multi-turn stabilisers of ``RLVRConfig``, applied to one round (docs/tool_rl.md).

:mod:`trl_rlvr.algorithms.multi_turn` holds the rules as pure functions; this module applies them to a round while
TRL scores it, from inside two of RLVRTrainer's hooks:

- :meth:`RoundStabilisers.score` (in ``_calculate_rewards``, after TRL has gathered the rewards and before it
  computes the advantages): the tool-call cap (``max_tool_calls_per_answer``) and ``void_turn_action=
  "score_as_wrong"`` score their rollouts as a wrong answer (:func:`~trl_rlvr.algorithms.multi_turn.score_as_wrong`:
  no term that raises the total, every penalty kept); and what the later steps need of each rollout, gathered so
  that every process holds the same flags: whether it is void (``void_turn_action``), the tool errors it shows
  (``resample_on_correct``, read by the round driver's selection,
  :meth:`trl_rlvr.sampling.driver.RoundDriver.kept_rows`).
- :meth:`RoundStabilisers.void_turns` (in ``_score_round``, after the advantages): with ``"zero_advantage"``
  zero the advantage of void rollouts, with ``"drop"`` drop them from the loss (completion mask 0; the step's
  token count without them).

Both act only in training (an evaluation scores what the model does, unchanged). The error-reply cut
(``tool_error_reply``) is the environments' own option (``PythonEnvironment(error_reply=...)``),
resample-on-correct in the round driver.
"""

from __future__ import annotations

import torch

from trl_rlvr.algorithms.metrics import shown_tool_errors
from trl_rlvr.algorithms.multi_turn import (
    VOID_TURN_ADVANTAGE_ACTIONS,
    over_tool_call_cap,
    score_as_wrong,
    tool_call_counts,
    void_turn_filter,
    void_turn_rollouts,
)


def final_answer_rule(reward_func, name: str):
    """The success reward's ``is_final_answer(text) -> bool`` (``boxed_math``: a box), which decides whether a turn
    answers; a ``ValueError`` naming ``void_turn_action`` when the reward has none."""
    rule = getattr(reward_func, "is_final_answer", None)
    if not callable(rule):
        raise ValueError(
            f"void_turn_action needs the success reward ({name!r}) to say what a final answer is: give it a method or "
            "attribute is_final_answer(text) -> bool (boxed_math has one), or set success_reward to a reward that has"
        )
    return rule


class RoundStabilisers:
    """The switches of ``args`` on the rounds of one trainer (``accelerator``: to gather per-rollout flags;
    ``metrics``: the trainer's ``{"train": ..., "eval": ...}``; ``is_final_answer``: None unless void turns act;
    ``reward_weights`` (F,): TRL's, which decide what a penalty is for :func:`score_as_wrong`)."""

    def __init__(self, args, accelerator, metrics: dict, is_final_answer=None, reward_weights=None):
        self.action, self.cap = args.void_turn_action, args.max_tool_calls_per_answer
        self.need_errors = args.resample_on_correct
        self.accelerator, self.metrics, self.is_final_answer = accelerator, metrics, is_final_answer
        self.reward_weights = reward_weights

    @classmethod
    def of(cls, trainer) -> RoundStabilisers:
        """The stabilisers of an RLVRTrainer's config; void turns read its success reward's ``is_final_answer``."""
        rule, index = None, trainer.success_reward_index
        if trainer.args.void_turn_action != "off":
            if index is None:
                raise ValueError("void_turn_action needs a reward function that says what a final answer is")
            rule = final_answer_rule(trainer.reward_funcs[index], trainer.reward_func_names[index])
        return cls(trainer.args, trainer.accelerator, trainer._metrics, rule, trainer.reward_weights)

    def _gather(self, values) -> torch.Tensor:
        return self.accelerator.gather(torch.tensor(values, dtype=torch.float32, device=self.accelerator.device))

    def score(self, notes, rewards_per_func: torch.Tensor, completions: list, environments) -> torch.Tensor:
        """The round's (N, F) gathered rewards with the cap (and ``"score_as_wrong"`` void turns) scored as wrong
        answers; notes ``void`` and ``tool_errors`` (N,). Never raises a row's total (:func:`score_as_wrong`)."""
        if self.cap is not None:
            over = over_tool_call_cap(self._gather(tool_call_counts(completions)).long(), self.cap)
            rewards_per_func = score_as_wrong(rewards_per_func, over, self.reward_weights)
            self.metrics["train"]["rlvr/over_tool_call_cap"].append(over.float().mean().item())
        if self.action != "off":
            notes.void = self._gather(void_turn_rollouts(completions, self.is_final_answer)).bool()
            self.metrics["train"]["rlvr/void_turn_rollouts"].append(notes.void.float().mean().item())
            if self.action == "score_as_wrong":
                rewards_per_func = score_as_wrong(rewards_per_func, notes.void, self.reward_weights)
        if self.need_errors:  # the errors each rollout shows (PythonEnvironment's stats; 0 without stats)
            notes.tool_errors = self._gather(shown_tool_errors(environments or [None] * len(completions)))
        return rewards_per_func

    def void_turns(self, output: dict, advantages: torch.Tensor, void: torch.Tensor | None) -> torch.Tensor:
        """The round's (N,) global advantages with void rollouts' set to 0; this process's rows of ``output`` (TRL's
        batch) changed alike, and with ``"drop"`` their completion mask 0 and the token count without them."""
        if void is None or self.action not in VOID_TURN_ADVANTAGE_ACTIONS:
            return advantages
        advantages, keep = void_turn_filter(advantages, void.to(advantages.device), self.action)
        rows = len(output["advantages"])
        start = self.accelerator.process_index * rows
        mine = keep[start : start + rows].to(output["advantages"].device)
        output["advantages"] = output["advantages"] * mine.to(output["advantages"].dtype)
        if self.action == "drop":
            mask = output["completion_mask"]
            loss_mask = mask if output.get("tool_mask") is None else mask * output["tool_mask"]
            dropped = self.accelerator.gather(loss_mask[~mine].sum().reshape(1).float()).sum()
            output["completion_mask"] = mask * mine[:, None].to(mask.dtype)
            if "num_items_in_batch" in output:
                output["num_items_in_batch"] = output["num_items_in_batch"] - dropped.to(output["num_items_in_batch"])
        return advantages
