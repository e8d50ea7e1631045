"""Row rules: the stabilizers of ``RLVRConfig``, each one rule over a round's rows, run by the round driver.

A rule may act at two points of a round (docs/trainer.md, "One round pipeline"):

- **score time**, :meth:`RowRule.score`, after the reward functions and before any advantage: it may lower a
  row's rewards (never raise a row's weighted total) and note per-row values the keep step needs (``notes``);
- **keep time**, :meth:`RowRule.keep`, on the round's record: a :class:`RowDecision` that says which rows of each
  sampled group are kept (``sampled``), which are trained with advantage 0 (``zero_advantage``) and which leave the
  loss and its token count (``out_of_loss``).

The round driver (:mod:`trl_rlvr.sampling.driver`) merges the decisions of every rule, computes the advantages once
over the kept rows, and writes the loss's token count once from the record. Every value a rule uses is gathered, so
every process takes the same decisions. Rules act in training only (an evaluation scores what the model does).

The built-in rules (the pure functions are in :mod:`trl_rlvr.algorithms.multi_turn`):

=========================  ==============================  ===================================================
rule                       config field                    acts
=========================  ==============================  ===================================================
:class:`ToolCallCap`       ``max_tool_calls_per_answer``   score: a rollout over the cap scores as wrong
:class:`VoidTurns`         ``void_turn_action``            score (``score_as_wrong``) or keep (advantage 0 / out)
:class:`ResampleOnCorrect` ``resample_on_correct``         score: notes tool errors; keep: G of k x G per prompt
=========================  ==============================  ===================================================

A new stabilizer is one :class:`RowRule` subclass registered with :func:`row_rule` and one config field
(tests/sampling/test_row_rules.py adds one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from trl_rlvr.algorithms.metrics import shown_tool_errors
from trl_rlvr.algorithms.multi_turn import (
    over_tool_call_cap,
    resample_on_correct,
    score_as_wrong,
    tool_call_counts,
    void_turn_rollouts,
)

#: The rule classes every RLVRTrainer builds from its config, in the order they act (:func:`row_rule` adds one).
ROW_RULES: list[type[RowRule]] = []


def row_rule(cls: type[RowRule]) -> type[RowRule]:
    """Class decorator: register ``cls`` in :data:`ROW_RULES`."""
    ROW_RULES.append(cls)
    return cls


@dataclass
class ScoredRows:
    """What a rule sees at score time: the round's (N, F) gathered rewards, per function before the weights (NaN:
    not scored), this process's completions and environments (TRL's), and how to gather a per-row value."""

    rewards_per_func: torch.Tensor
    completions: list
    environments: list | None
    reward_weights: torch.Tensor
    gather: Callable[[list], torch.Tensor]  # this process's per-row values -> (N,) float32, every process's rows
    log_metric: Callable[[str, float], None]
    notes: dict[str, torch.Tensor] = field(default_factory=dict)  # (N,) per-row values for the keep step


@dataclass(frozen=True)
class RowDecision:
    """A rule's keep-time decision over a round's N rows (None: no change)."""

    sampled: torch.Tensor | None = None  # (N,) bool: the rows kept of each sampled group (G of each k x G)
    zero_advantage: torch.Tensor | None = None  # (N,) bool: trained with advantage 0, still in the token count
    out_of_loss: torch.Tensor | None = None  # (N,) bool: advantage 0, completion mask 0, not in the token count

    @staticmethod
    def merge(decisions: list[RowDecision]) -> RowDecision:
        """One decision: the rows every rule keeps; the rows any rule zeroes or takes out."""
        def combine(name: str, op) -> torch.Tensor | None:
            masks = [getattr(d, name).cpu().bool() for d in decisions if getattr(d, name) is not None]
            out = None
            for mask in masks:
                out = mask if out is None else op(out, mask)
            return out

        return RowDecision(combine("sampled", torch.logical_and), combine("zero_advantage", torch.logical_or),
                           combine("out_of_loss", torch.logical_or))

    def advantage_mask(self, rows: int) -> torch.Tensor:
        """(N,) bool: rows whose advantage is set to 0."""
        masks = [m for m in (self.zero_advantage, self.out_of_loss) if m is not None]
        return torch.stack(masks).any(dim=0) if masks else torch.zeros(rows, dtype=torch.bool)


class RowRule:
    """One stabilizer. ``of(trainer)`` builds it from the trainer's config (None: the rule is off); ``score`` and
    ``keep`` are its two steps (each optional). ``sampled_group_factor`` > 1 asks the driver for that many times
    ``num_generations`` rollouts per prompt (the rule's ``keep`` then keeps ``num_generations`` of each)."""

    sampled_group_factor: int = 1

    @classmethod
    def of(cls, trainer) -> RowRule | None:
        raise NotImplementedError

    def score(self, rows: ScoredRows) -> torch.Tensor:
        """The round's (N, F) rewards after the rule: a row's weighted total may only go down."""
        return rows.rewards_per_func

    def keep(self, record) -> RowDecision:
        return RowDecision()


@row_rule
class ToolCallCap(RowRule):
    """``max_tool_calls_per_answer``: a rollout with more tool calls than the cap scores as a wrong answer
    (:func:`~trl_rlvr.algorithms.multi_turn.score_as_wrong`: every penalty kept). Logged: rlvr/over_tool_call_cap."""

    def __init__(self, cap: int):
        self.cap = cap

    @classmethod
    def of(cls, trainer) -> ToolCallCap | None:
        cap = trainer.args.max_tool_calls_per_answer
        return None if cap is None else cls(cap)

    def score(self, rows: ScoredRows) -> torch.Tensor:
        over = over_tool_call_cap(rows.gather(tool_call_counts(rows.completions)).long(), self.cap)
        rows.log_metric("rlvr/over_tool_call_cap", over.float().mean().item())
        return score_as_wrong(rows.rewards_per_func, over, rows.reward_weights)


@row_rule
class VoidTurns(RowRule):
    """``void_turn_action``: a rollout with a turn that neither calls a tool nor answers (SimpleTIR) scores as wrong
    (``"score_as_wrong"``), is trained with advantage 0 (``"zero_advantage"``) or leaves the loss (``"drop"``).
    The success reward's ``is_final_answer(text)`` says what answers. Logged: rlvr/void_turn_rollouts."""

    def __init__(self, action: str, is_final_answer: Callable[[str], bool]):
        self.action, self.is_final_answer = action, is_final_answer

    @classmethod
    def of(cls, trainer) -> VoidTurns | None:
        action = trainer.args.void_turn_action
        if action == "off":
            return None
        index = trainer.success_reward_index
        if index is None:
            raise ValueError("void_turn_action needs a reward function that says what a final answer is")
        return cls(action, final_answer_rule(trainer.reward_funcs[index], trainer.reward_func_names[index]))

    def score(self, rows: ScoredRows) -> torch.Tensor:
        void = rows.gather(void_turn_rollouts(rows.completions, self.is_final_answer)).bool()
        rows.notes["void"] = void
        rows.log_metric("rlvr/void_turn_rollouts", void.float().mean().item())
        if self.action == "score_as_wrong":
            return score_as_wrong(rows.rewards_per_func, void, rows.reward_weights)
        return rows.rewards_per_func

    def keep(self, record) -> RowDecision:
        void = record.notes["void"]
        if self.action == "zero_advantage":
            return RowDecision(zero_advantage=void)
        return RowDecision(out_of_loss=void) if self.action == "drop" else RowDecision()


@row_rule
class ResampleOnCorrect(RowRule):
    """``resample_on_correct`` (rStar2-Agent's GRPO-RoC): k x G rollouts per prompt, G kept: the right answers
    with the fewest tool errors they show, a uniform draw of the wrong ones
    (:func:`~trl_rlvr.algorithms.multi_turn.resample_on_correct`), drawn from one generator seeded with ``seed``, in
    lockstep on every process. Logged: rlvr/sampled_right_tool_errors, rlvr/resampled_right_tool_errors."""

    def __init__(self, oversample: int, group_size: int, success_index: int, threshold: float, seed: int, log_metric):
        self.sampled_group_factor, self.group_size = oversample, group_size
        self.success_index, self.threshold, self.log_metric = success_index, threshold, log_metric
        self.generator = torch.Generator().manual_seed(seed)

    @classmethod
    def of(cls, trainer) -> ResampleOnCorrect | None:
        args = trainer.args
        if not args.resample_on_correct:
            return None
        if trainer.success_reward_index is None:
            raise ValueError("resample_on_correct needs a reward that says which answers are right (success_reward)")
        return cls(args.resample_on_correct_oversample, trainer.num_generations, trainer.success_reward_index,
                   args.success_threshold, args.seed,
                   lambda name, value: trainer.metrics_to_log("train")[name].append(value))

    def score(self, rows: ScoredRows) -> torch.Tensor:
        # the errors each rollout shows (PythonEnvironment's stats; 0 for an environment without stats)
        environments = rows.environments or [None] * len(rows.completions)
        rows.notes["tool_errors"] = rows.gather(shown_tool_errors(environments))
        return rows.rewards_per_func

    def keep(self, record) -> RowDecision:
        success = record.rewards_per_func[:, self.success_index].float().cpu()
        errors = record.notes["tool_errors"].cpu()
        sampled_group = self.group_size * self.sampled_group_factor
        kept = resample_on_correct(success, errors, sampled_group, self.group_size, self.threshold,
                                   generator=self.generator)
        right = success >= self.threshold
        if right.any():
            self.log_metric("rlvr/sampled_right_tool_errors", errors[right].mean().item())
            self.log_metric("rlvr/resampled_right_tool_errors", errors[kept][right[kept]].mean().item())
        sampled = torch.zeros(len(success), dtype=torch.bool)
        sampled[kept] = True
        return RowDecision(sampled=sampled)


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


def score_rows(rules: list[RowRule], rows: ScoredRows) -> torch.Tensor:
    """The round's (N, F) rewards after every rule's score step, in order (per-row values noted in ``rows.notes``)."""
    for rule in rules:
        rows.rewards_per_func = rule.score(rows)
    return rows.rewards_per_func


def row_rules_of(trainer) -> list[RowRule]:
    """The rules of the trainer's config, in :data:`ROW_RULES` order (at most one may oversample)."""
    rules = [rule for cls in ROW_RULES if (rule := cls.of(trainer)) is not None]
    if sum(rule.sampled_group_factor > 1 for rule in rules) > 1:
        raise ValueError("at most one row rule may oversample the groups")
    return rules
