"""Selective sampling: skip, before generating, the prompts whose recent groups had no signal.

A group of G answers to a prompt answered right with probability p has no signal (every reward equal, zero
advantage) with probability p^G + (1-p)^G, and p moves slowly: a prompt whose last groups were all equal is
likely to give an all-equal group again. GRESO (Zheng et al. 2025, "Act Only When It Pays") skips such prompts
with a probability and revisits them otherwise; here the rule is fixed and the revisit probability a setting:

    predicted zero-signal  <=>  the prompt's last ``window`` groups were all zero-signal (never seen: False)
    skip                   <=>  predicted zero-signal  and  u >= revisit_probability  and  skips < K(r)

``u`` is a uniform draw determined by (seed, pass, position in the pass) alone, so every process that holds the
same history takes the same decisions without communicating, and a resumed run repeats them. ``K(r)`` bounds
the consecutive skips of one prompt (:func:`max_consecutive_skips`), so no prompt is starved: a skipped prompt
comes back within K(r) + 1 of its passes whatever the draws.

Everything here is pure or plain state with ``state_dict``/``load_state_dict``; the trainer records the outcome
of every generated group (from the gathered rewards, identically on every rank) and the prompt stream asks
:meth:`PromptHistory.skip` for each candidate prompt.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

#: The random revisit schedule is overridden (a revisit forced) only where it would have skipped a prompt more
#: than K times in a row, an event of probability (1 - r)^K <= this value.
FORCED_REVISIT_TAIL = 0.01


def predicts_zero_signal(zero_signal_history: Sequence[bool], window: int) -> bool:
    """True when the last ``window`` groups of a prompt were all zero-signal; a prompt with fewer groups seen
    (never seen included) is predicted informative, so it is always sampled."""
    return len(zero_signal_history) >= window and all(zero_signal_history[-window:])


def max_consecutive_skips(revisit_probability: float) -> int:
    """K(r): the smallest K with (1 - r)^K <= FORCED_REVISIT_TAIL (0 when r = 1: nothing is ever skipped)."""
    if not 0 < revisit_probability <= 1:
        raise ValueError(f"revisit_probability must be in (0, 1], got {revisit_probability!r}")
    if revisit_probability == 1:
        return 0
    return math.ceil(math.log(FORCED_REVISIT_TAIL) / math.log1p(-revisit_probability))


def revisit_draw(seed: int, epoch: int, position: int) -> float:
    """The uniform draw in [0, 1) for the candidate at ``position`` of pass ``epoch``: a function of its
    arguments only (string seeds are hashed with SHA-512 by :class:`random.Random`, independent of PYTHONHASHSEED)."""
    return random.Random(f"selective/{seed}/{epoch}/{position}").random()


def should_skip(predicted_zero_signal: bool, consecutive_skips: int, draw: float, revisit_probability: float) -> bool:
    """The skip decision for one candidate prompt (see the module docstring)."""
    return (
        predicted_zero_signal
        and draw >= revisit_probability
        and consecutive_skips < max_consecutive_skips(revisit_probability)
    )


class PromptHistory:
    """Per prompt (dataset index): the outcomes of its last ``window`` groups as (success rate, zero-signal),
    and how many times in a row it has been skipped since it was last taken."""

    def __init__(self, window: int, revisit_probability: float, seed: int):
        if window < 1:
            raise ValueError(f"selective_sampling_window must be >= 1, got {window!r}")
        max_consecutive_skips(revisit_probability)  # validates it
        self.window, self.revisit_probability, self.seed = window, revisit_probability, seed
        self.outcomes: dict[int, list[tuple[float, bool]]] = {}
        self.skips: dict[int, int] = {}

    def predicts_zero_signal(self, index: int) -> bool:
        return predicts_zero_signal([zero for _, zero in self.outcomes.get(index, ())], self.window)

    def skip(self, index: int, epoch: int, position: int) -> bool:
        """Decide for the candidate ``index`` drawn at (epoch, position); a skip is counted against the prompt."""
        predicted = self.predicts_zero_signal(index)
        if not predicted:  # no draw needed: the common case costs no hashing
            return False
        skipped = should_skip(predicted, self.skips.get(index, 0), revisit_draw(self.seed, epoch, position),
                              self.revisit_probability)
        if skipped:
            self.skips[index] = self.skips.get(index, 0) + 1
        else:  # taken: the count of consecutive skips starts again
            self.skips.pop(index, None)
        return skipped

    def record(self, index: int, success_rate: float, zero_signal: bool) -> bool:
        """Add the outcome of a group generated for ``index``; return whether it had been predicted zero-signal
        (a revisit), read before this outcome is added."""
        was_predicted = self.predicts_zero_signal(index)
        recent = self.outcomes.setdefault(index, [])
        recent.append((float(success_rate), bool(zero_signal)))
        del recent[: -self.window]
        return was_predicted

    def state_dict(self) -> dict:
        """JSON-ready; floats round-trip exactly through JSON (shortest repr)."""
        return {
            "window": self.window,
            "outcomes": {str(i): [[rate, zero] for rate, zero in recent] for i, recent in self.outcomes.items()},
            "skips": {str(i): n for i, n in self.skips.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        if int(state["window"]) != self.window:
            raise ValueError(
                f"the checkpoint's selective sampling history keeps {state['window']} groups per prompt; this run's "
                f"selective_sampling_window is {self.window}"
            )
        self.outcomes = {int(i): [(float(r), bool(z)) for r, z in recent] for i, recent in state["outcomes"].items()}
        self.skips = {int(i): int(n) for i, n in state["skips"].items()}


def record_groups(history: PromptHistory, prompt_indices: Sequence[int], success_rates: Sequence[float],
                  zero_signal: Sequence[bool]) -> tuple[int, int]:
    """Record one round's groups (one prompt index each, in order); return (revisits, revisits that were indeed
    zero-signal): the prompts that had been predicted zero-signal, and how often that prediction held."""
    if not len(prompt_indices) == len(success_rates) == len(zero_signal):
        raise ValueError(
            f"one outcome per group: {len(prompt_indices)} prompts, {len(success_rates)} success rates, "
            f"{len(zero_signal)} zero-signal flags"
        )
    revisits = held = 0
    for index, rate, zero in zip(prompt_indices, success_rates, zero_signal):
        if history.record(index, rate, zero):
            revisits += 1
            held += bool(zero)
    return revisits, held
