r"""What one generated batch says about a run, as verdicts: pure functions of measured numbers and settings.

Each ``*_verdict`` function takes numbers measured on one real batch (or settings) and returns a :class:`Check`:
a verdict (``ok`` / ``warn`` / ``fail``), what was measured, and what to change. ``trl-rlvr doctor``
(:mod:`trl_rlvr.scripts.doctor`) measures the numbers and prints the checks; the thresholds are arguments with
documented defaults, so a caller (or a test) can hold them to its own.

- truncation: the share of answers cut off at ``max_completion_length``. A truncated answer carries no final
  answer (a verifier scores it 0) and, with ``mask_truncated_completions``, no loss at all;
- each reward: its mean and spread, the share of answers it did not score (``None``), and the counters it reports
  through TRL's ``log_metric`` (:data:`UNREADABLE_COUNTERS`: answers it could not read, e.g. ``boxed_math/no_box``;
  ``errors`` and ``timeouts``: answers it failed to check, scored 0);
- zero-signal groups: groups whose rewards are all equal have zero advantage and teach nothing. Measured against
  \(p^G + (1-p)^G\), the share expected if every question were answered right with the measured success rate p;
  dynamic sampling (DAPO) replaces them by generating about \(1/(1-z)\) times the answers (z = the measured share);
- the loss normalization: what the summed token losses of one optimizer step are divided by, and how far TRL's
  estimate of DAPO's token count (the generation batch's tokens x gradient_accumulation_steps /
  steps_per_generation) is from each step's exact count on this batch;
- the machine: settings it cannot run (bf16 without a GPU, vLLM not installed);
- vLLM's importance-sampling correction: biased when top_p / top_k / min_p truncate the sampling
  (:func:`trl_rlvr.checks.settings.biased_importance_sampling`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from trl_rlvr.algorithms.advantages import expected_zero_signal_frac

VERDICTS = ("ok", "warn", "fail")
#: Counter names (the part after ``<reward>/``) that count answers the reward could not read: no box, no format,
#: a box the rules do not read as one answer, an over-long or unbalanced box.
UNREADABLE_COUNTERS = ("no_box", "no_answer", "no_format", "unparsed", "rejected")
#: Counter names that count answers the reward failed to check (scored 0).
FAILURE_COUNTERS = ("errors", "timeouts")
#: Counter names that count answers the reward's own machinery failed to check (a worker lost, a sandbox that did
#: not start): not scored (None: out of the group's baseline, advantage 0), never the candidate's fault.
INFRA_COUNTERS = ("infra_errors",)


@dataclass(frozen=True)
class Check:
    """One verdict: ``name`` (what was checked), ``verdict`` (ok / warn / fail), ``summary`` (what was measured),
    ``advice`` (what to change; empty when nothing), ``numbers`` (the measured values, for ``--json``)."""

    name: str
    verdict: str
    summary: str
    advice: str = ""
    numbers: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def _grade(value: float, warn_at: float, fail_at: float) -> str:
    return "fail" if value >= fail_at else "warn" if value >= warn_at else "ok"


def worst_verdict(checks: Sequence[Check]) -> str:
    return max((c.verdict for c in checks), key=VERDICTS.index, default="ok")


def exit_code(checks: Sequence[Check]) -> int:
    """0 when no check failed, 1 when one did (2, "could not run", is the caller's)."""
    return 1 if worst_verdict(checks) == "fail" else 0


# ------------------------------------------------------------------------------------------------ truncation
def truncation_verdict(truncated: Sequence[bool], lengths: Sequence[int], max_completion_length: int, *,
                     mask_truncated_completions: bool = False, warn_at: float = 0.1, fail_at: float = 0.9) -> Check:
    """The share of answers that hit ``max_completion_length``: warn from ``warn_at`` (answers lost to the budget),
    fail from ``fail_at`` (almost no answer finishes, so a verifier has almost nothing to score)."""
    n = len(truncated)
    frac = sum(map(bool, truncated)) / n if n else 0.0
    finished = [length for length, cut in zip(lengths, truncated, strict=True) if not cut]
    numbers = {"truncated_frac": frac, "answers": n, "max_completion_length": max_completion_length,
               "mean_length_finished": sum(finished) / len(finished) if finished else None}
    summary = f"{frac:.0%} of {n} answers cut off at max_completion_length={max_completion_length}"
    if finished:
        summary += f"; finished answers average {numbers['mean_length_finished']:.0f} tokens"
    verdict = _grade(frac, warn_at, fail_at)
    advice = ""
    if verdict != "ok":
        advice = (f"raise max_completion_length (e.g. --max_completion_length {2 * max_completion_length}) or ask for "
                  "shorter answers in the prompt: a cut-off answer has no final answer to verify")
        if mask_truncated_completions:
            advice += ", and with mask_truncated_completions=True it gets no loss either"
    return Check("truncation", verdict, summary, advice, numbers)


# ------------------------------------------------------------------------------------------------ rewards
def reward_summary(scores: Sequence[float | None], counters: dict[str, float]) -> dict:
    """Mean, spread and shares of one reward over a batch. ``scores``: one per answer (None or NaN = not scored);
    ``counters``: the reward's ``log_metric`` counts for this batch, keyed by the name after ``<reward>/``."""
    n = len(scores)
    scored = [float(s) for s in scores if s is not None and not math.isnan(float(s))]
    mean = sum(scored) / len(scored) if scored else None
    std = math.sqrt(sum((s - mean) ** 2 for s in scored) / len(scored)) if scored else None

    def share(keys):
        return min(1.0, sum(counters.get(k, 0.0) for k in keys) / n) if n else 0.0

    return {
        "answers": n, "mean": mean, "std": std, "min": min(scored) if scored else None,
        "max": max(scored) if scored else None, "not_scored_frac": (n - len(scored)) / n if n else 0.0,
        "unreadable_frac": share(UNREADABLE_COUNTERS), "failed_frac": share(FAILURE_COUNTERS),
        "errors": counters.get("errors", 0.0), "timeouts": counters.get("timeouts", 0.0),
        "counters": dict(counters),
    }


def reward_verdict(name: str, scores: Sequence[float | None], counters: dict[str, float], *,
                 others_have_signal: bool = False, unreadable_warn: float = 0.5, failed_warn: float = 1e-9,
                 failed_fail: float = 0.1) -> Check:
    """One reward on one batch. Fails when it could read no answer at all (unless ``others_have_signal``: another
    reward tells this batch's answers apart, so the run learns from it until the answers take the form this one
    reads, e.g. R1-Zero's format reward before the first box; then it warns), when it failed to check (errors,
    timeouts) ``failed_fail`` of them or more, or when it scored none; warns from ``unreadable_warn`` unreadable
    answers, at any failed check, and when it gives every answer the same score (no signal from this reward)."""
    s = reward_summary(scores, counters)
    n = s["answers"]
    parts = [f"mean {s['mean']:.3f}, std {s['std']:.3f}" if s["mean"] is not None else "no answer scored"]
    if s["unreadable_frac"]:
        parts.append(f"{s['unreadable_frac']:.0%} unreadable ({_counter_text(counters, UNREADABLE_COUNTERS)})")
    if s["errors"] or s["timeouts"]:
        parts.append(f"{s['errors']:.0f} errors, {s['timeouts']:.0f} timeouts")
    if s["not_scored_frac"]:
        parts.append(f"{s['not_scored_frac']:.0%} not scored (None)")
    verdicts, advice = [], []
    if s["mean"] is None:
        verdicts.append("fail")
        advice.append(f"{name} returned None for every answer: check its reference column and options")
    if s["failed_frac"] >= failed_warn:
        verdicts.append(_grade(s["failed_frac"], failed_warn, failed_fail))
        advice.append(f"{name} failed to check {s['failed_frac']:.0%} of the answers (scored 0): raise its timeout "
                      f"(reward_options {{\"{name}\": {{\"timeout\": ...}}}}) or look at the answers it errs on")
    if s["unreadable_frac"] >= 1.0:
        verdicts.append("warn" if others_have_signal else "fail")
        advice.append(f"{name} could read no answer: the prompt must ask for the form it reads (e.g. \\boxed{{}}), "
                      "the completion budget must leave room for it, and its options must match the prompt "
                      "(prefilled, think_tag)" + ("; until then the run learns only from the other rewards"
                                                  if others_have_signal else ""))
    elif s["unreadable_frac"] >= unreadable_warn:
        verdicts.append("warn")
        advice.append(f"{name} could not read {s['unreadable_frac']:.0%} of the answers: they all score 0; a "
                      "format reward, a one-shot example in the prompt or a larger budget gives them a way in")
    if s["std"] == 0 and n > 1 and "fail" not in verdicts and s["unreadable_frac"] < 1.0:
        verdicts.append("warn")
        advice.append(f"{name} gave every answer {s['mean']:g}: no signal from it on this batch")
    verdict = max(verdicts, key=VERDICTS.index, default="ok")
    return Check(f"reward {name}", verdict, "; ".join(parts), "; ".join(advice), s)


def _counter_text(counters: dict[str, float], keys) -> str:
    return ", ".join(f"{k} {counters[k]:.0f}" for k in keys if counters.get(k))


# ------------------------------------------------------------------------------------------------ zero signal
def dynamic_sampling_cost(zero_signal_frac: float) -> float:
    """Answers generated per answer kept when groups with no signal are dropped and replaced: 1 / (1 - z)
    (inf when every group has no signal)."""
    return math.inf if zero_signal_frac >= 1.0 else 1.0 / (1.0 - zero_signal_frac)


def zero_signal_verdict(zero_signal: Sequence[bool], success_rate: float, group_size: int, *,
                      success_zero_signal: Sequence[bool] | None = None, dynamic_sampling: bool = False,
                      max_sampling_rounds: int = 3, selective_sampling: bool = False, warn_at: float = 0.5,
                      fail_at: float = 1.0) -> Check:
    """The share z of groups whose rewards are all equal, against p^G + (1-p)^G (p = ``success_rate``).

    Fails when no group has signal (nothing to learn from this batch), warns from ``warn_at``. The advice gives
    what dynamic sampling would cost (1/(1-z) answers per kept answer, at most ``max_sampling_rounds`` rounds) and,
    when z exceeds the expected share, points at selective sampling: the difficulty is uneven, so the same prompts
    are likely to stay solved (or unsolved) and can be skipped before generating. ``success_zero_signal``: the same
    per group for the success reward alone; when no group varies in it but some vary in the total reward, the
    signal comes from shaping terms only (format, length), which warns."""
    groups = len(zero_signal)
    z = sum(map(bool, zero_signal)) / groups if groups else 0.0
    expected = expected_zero_signal_frac(success_rate, group_size)
    cost = dynamic_sampling_cost(z)
    numbers = {"zero_signal_frac": z, "groups": groups, "group_size": group_size, "success_rate": success_rate,
               "expected_zero_signal_frac": expected, "dynamic_sampling_cost": None if math.isinf(cost) else cost}
    summary = (f"{z:.0%} of {groups} groups have no signal (all rewards equal); p^G + (1-p)^G = {expected:.0%} "
               f"at success rate p = {success_rate:.0%}, G = {group_size}")
    verdict = _grade(z, warn_at, fail_at)
    wasteful = verdict != "ok"
    advice = []
    if success_zero_signal is not None and groups and all(success_zero_signal) and z < 1.0:
        numbers["success_zero_signal_frac"] = 1.0
        summary += "; no group varies in correctness"
        verdict = max(verdict, "warn", key=VERDICTS.index)
        advice.append("every group's answers are all right or all wrong: the signal comes from the shaping rewards "
                      "alone (format, length), which teach form, not correctness")
    if z >= 1.0:
        advice.append("no group has signal: every answer of a question scores the same, so this batch gives no "
                      "gradient; make the task easier (or the budget larger) until some answers are right, or add a "
                      "reward that tells answers apart (a format reward)")
        if dynamic_sampling:
            advice.append(f"dynamic sampling would find nothing to keep and stop after max_sampling_rounds="
                          f"{max_sampling_rounds} rounds")
    elif wasteful:
        if dynamic_sampling:
            advice.append(f"dynamic sampling is on: it generates about {cost:.1f}x the answers to fill a batch "
                          f"(at most max_sampling_rounds={max_sampling_rounds} rounds)")
        else:
            advice.append(f"--dynamic_sampling true would train on informative groups only, at about {cost:.1f}x "
                          "the generation per step")
        if z > expected and not selective_sampling:
            advice.append("more groups have no signal than an even difficulty predicts: --selective_sampling true "
                          "skips prompts that had no signal before, before generating")
    return Check("zero-signal groups", verdict, summary, "; ".join(advice), numbers)


# ------------------------------------------------------------------------------------------------ loss
def step_token_counts(tokens_per_row: Sequence[int], per_device_batch_size: int, steps_per_generation: int,
                      gradient_accumulation_steps: int, seed: int = 0) -> tuple[list[int], list[float]]:
    """(exact, estimated) loss tokens of each optimizer step fed by one process's generation batch.

    TRL shuffles the generation batch's rows and cuts them into ``steps_per_generation`` micro-batches of
    ``per_device_batch_size`` rows; each run of ``gradient_accumulation_steps`` micro-batches is one optimizer
    step. The exact count of a step is the sum of its micro-batches' tokens (DAPO's T_s); TRL's estimate is the
    generation batch's tokens x gradient_accumulation_steps / steps_per_generation, the same for every step.
    (With ``steps_per_generation`` not a multiple of ``gradient_accumulation_steps`` a step takes micro-batches of
    two generation batches; the micro-batches are then counted in order, as if the next batch were like this one.)
    """
    rows = list(tokens_per_row)
    random.Random(seed).shuffle(rows)
    micro = [sum(rows[i * per_device_batch_size:(i + 1) * per_device_batch_size]) for i in range(steps_per_generation)]
    ga = gradient_accumulation_steps
    steps = math.lcm(steps_per_generation, ga) // ga
    cycle = micro * (steps * ga // steps_per_generation)
    exact = [sum(cycle[s * ga:(s + 1) * ga]) for s in range(steps)]
    estimate = sum(micro) * ga / steps_per_generation
    return exact, [estimate] * steps


def loss_normalization_verdict(loss_normalization: str | None, loss_type: str, tokens_per_row: Sequence[int], *,
                             per_device_batch_size: int, steps_per_generation: int, gradient_accumulation_steps: int,
                             token_count_scope: str = "optimizer_step", loss_constant: int | None = None,
                             max_completion_length: int | None = None, num_processes: int = 1,
                             warn_at: float = 0.05, seed: int = 0) -> Check:
    """What the summed token losses of one optimizer step are divided by, with this batch's token counts.

    For ``per_batch_token`` (DAPO) the exact divisor is T_s, the loss tokens of step s; RLVRTrainer uses it when
    ``token_count_scope='optimizer_step'`` and ``steps_per_generation`` is a multiple of
    ``gradient_accumulation_steps``, TRL's estimate otherwise. Warns when the estimate is used and is off by
    ``warn_at`` or more (relative) for some step of this batch."""
    exact, estimate = step_token_counts(tokens_per_row, per_device_batch_size, steps_per_generation,
                                        gradient_accumulation_steps, seed)
    numbers = {"loss_normalization": loss_normalization, "loss_type": loss_type, "tokens_per_step": exact,
               "num_processes": num_processes, "steps_per_generation": steps_per_generation,
               "gradient_accumulation_steps": gradient_accumulation_steps}
    per_step = f"{min(exact)}-{max(exact)}" if min(exact) != max(exact) else f"{exact[0]}"
    tokens = f"loss tokens per optimizer step on this process: {per_step}"
    if loss_normalization == "per_answer":
        return Check("loss normalization", "ok", f"per_answer (GRPO): each answer's loss / its own length; {tokens}",
                     numbers=numbers)
    if loss_normalization == "constant":
        c = loss_constant if loss_constant is not None else max_completion_length
        rows = per_device_batch_size * gradient_accumulation_steps * num_processes
        return Check("loss normalization", "ok", f"constant (Dr. GRPO): summed token losses / ({rows} answers x "
                     f"C={c}); {tokens}", numbers={**numbers, "loss_constant": c})
    if loss_normalization != "per_batch_token":
        return Check("loss normalization", "ok", f"TRL's loss_type={loss_type!r}; {tokens}", numbers=numbers)
    exact_used = token_count_scope == "optimizer_step" and steps_per_generation % gradient_accumulation_steps == 0
    errors = [abs(e / t - 1.0) if t else (0.0 if e == 0 else math.inf) for e, t in zip(estimate, exact, strict=True)]
    numbers.update(token_count_scope=token_count_scope, exact_count_used=exact_used,
                   trl_estimate=estimate[0], max_relative_error_of_estimate=max(errors))
    summary = f"per_batch_token (DAPO): summed token losses / the step's loss tokens; {tokens}"
    if exact_used:
        return Check("loss normalization", "ok", summary + " (the exact count of each step is used)", numbers=numbers)
    summary += (f"; TRL's estimate {estimate[0]:.0f} (generation batch x gradient_accumulation_steps / "
                f"steps_per_generation) is off by up to {max(errors):.0%}")
    if max(errors) < warn_at:
        return Check("loss normalization", "ok", summary, numbers=numbers)
    if token_count_scope != "optimizer_step":
        advice = "set --token_count_scope optimizer_step to divide by each step's exact token count"
    else:
        advice = (f"make steps_per_generation ({steps_per_generation}) a multiple of gradient_accumulation_steps "
                  f"({gradient_accumulation_steps}) so that each step's exact token count can be used")
    return Check("loss normalization", "warn", summary, advice, numbers)


# ------------------------------------------------------------------------------------------------ machine
def machine_verdict(problems: Sequence[str]) -> Check:
    """Settings the machine cannot run (from :func:`trl_rlvr.checks.machine.unusable_settings`): fail when any."""
    if not problems:
        return Check("machine", "ok", "the precision and generation settings run on this machine")
    return Check("machine", "fail", "; ".join(problems), "override the fields named above (see the message)",
                 {"problems": list(problems)})


# ------------------------------------------------------------------------------------------------ vLLM
def importance_sampling_verdict(args) -> Check:
    """TRL's vLLM importance-sampling correction under ``args``: warn, naming the fields, where top_p / top_k / min_p
    truncate the sampling (the ratio is then biased: :func:`trl_rlvr.checks.settings.biased_importance_sampling`)."""
    from trl_rlvr.checks.settings import biased_importance_sampling, truncated_sampling_fields

    name = "vLLM importance sampling"
    if not getattr(args, "vllm_importance_sampling_correction", False):
        return Check(name, "ok", "vllm_importance_sampling_correction is off")
    cut = truncated_sampling_fields(args)
    if biased_importance_sampling(args) is None:
        return Check(name, "ok", "the correction's log-probs are over the full vocabulary (no top_p / top_k / min_p)")
    return Check(name, "warn", f"the correction is biased: {', '.join(cut)} truncate the sampling, vLLM's log-probs "
                 "are renormalized over the kept tokens, the trainer's use the full vocabulary",
                 "sample from the full distribution (top_p=1.0, top_k=0, min_p=None) or set "
                 "vllm_importance_sampling_correction=False (TRL issue #6789)", {"truncating": cut})


# ------------------------------------------------------------------------------------------------ tools
def tool_use_verdict(metrics: dict, *, parse_warn_below: float = 0.9, budget_warn_at: float = 0.5,
                   error_warn_at: float = 0.5) -> Check:
    """A tool run's batch (``metrics``: ``answers``, ``call_turns`` (turns whose tool calls parsed),
    ``parse_failures`` (turns that opened a call TRL could not parse: kept as text, nothing ran), ``calls_per_answer``,
    ``call_failure_rate`` (TRL's failures per call), ``errors_per_answer`` / ``timeouts_per_answer`` (the
    environment's ``stats``, None without), ``budget_frac`` (tool-reply tokens over answers x max_completion_length)).

    Warns when no answer calls a tool, when the parse rate is below ``parse_warn_below``, when the replies take
    ``budget_warn_at`` of the budget or more, and when ``error_warn_at`` of the calls or more fail."""
    turns, failed = metrics["call_turns"], metrics["parse_failures"]
    parse_rate = turns / (turns + failed) if turns + failed else None
    calls = metrics["calls_per_answer"] * metrics["answers"]
    errors = (metrics.get("errors_per_answer") or 0.0) * metrics["answers"]
    failure_rate = metrics.get("call_failure_rate") or 0.0
    error_rate = (failure_rate * calls + errors) / calls if calls else None
    numbers = {**metrics, "parse_rate": parse_rate, "error_rate": error_rate}
    summary = (f"{metrics['calls_per_answer']:.2f} tool calls per answer; tool-call parse rate "
               + ("n/a (no call written)" if parse_rate is None else f"{parse_rate:.0%} ({turns} of {turns + failed} turns)")
               + ("" if error_rate is None else f"; errors {error_rate:.0%} of calls")
               + (f", {metrics['timeouts_per_answer']:.2f} timeouts per answer" if metrics.get("timeouts_per_answer")
                  is not None else "")
               + f"; tool replies take {metrics['budget_frac']:.0%} of the token budget")
    advice = []
    if turns + failed == 0:
        advice.append("no answer called a tool: a model that has never seen the tool-call format rarely writes "
                      "it; start from a short SFT on tool traces (cold start) or an instruct model that calls tools")
    if parse_rate is not None and parse_rate < parse_warn_below:
        advice.append(f"{failed} turns opened a tool call TRL could not parse (kept as text, no tool ran): check "
                      "that the chat template and the tokenizer's response template agree with what the model writes")
    if metrics["budget_frac"] >= budget_warn_at:
        advice.append("tool replies fill the budget: lower the tool's max_output_chars or raise "
                      "max_completion_length (a reply that does not fit is dropped and the rollout ends)")
    if error_rate is not None and error_rate >= error_warn_at:
        advice.append("most tool calls fail: read the replies in the samples (wrong arguments, code that raises)")
    return Check("tool use", "warn" if advice else "ok", summary, "; ".join(advice), numbers)
