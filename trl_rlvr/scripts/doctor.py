"""``trl-rlvr doctor --config recipe.yaml [--field value ...] [--json report.json]``: one real batch before a run.

The arguments are ``trl-rlvr train``'s (:mod:`trl_rlvr.scripts.train`: the same parser, preset, YAML and command
line), plus ``--json`` and ``--doctor_prompts``. The doctor builds the run's trainer (:func:`build_trainer`: data,
rewards, model), generates ONE generation batch with the trainer's own generation and scoring (the run's sampling
settings, its rewards, its advantages), and prints one verdict per check of :mod:`trl_rlvr.checks.verdicts`
(truncation, each reward, zero-signal groups, the loss normalization, the machine) and of
:mod:`trl_rlvr.checks.batch_size` (the learning rate for the rollouts per optimizer step) with what to change.

Exit status: 0 when no check fails, 1 when one does, 2 when the doctor could not run (a bad recipe, a model
that does not load, an error while generating).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

from trl_rlvr.scripts.recipe_help import wants_help
from trl_rlvr.scripts.train import RecipeArguments

#: The exit status when the doctor could not run.
COULD_NOT_RUN = 2

#: What ``trl-rlvr doctor --help`` says first.
DESCRIPTION = (
    "Check a recipe on one real batch before training: builds the run's trainer (data, rewards, model) from the "
    "same arguments as `trl-rlvr train`, generates and scores ONE generation batch with the run's own sampling "
    "settings and rewards, and prints a verdict (ok / warn / fail) with what to change for each check: truncation, "
    "answers each reward cannot read, reward errors and timeouts, zero-signal groups against p^G + (1-p)^G, the "
    "loss normalization's token counts, the learning rate for the rollouts per optimizer step, settings this machine "
    "cannot run, on a tool run the tool-call parse rate, tool errors and the budget share of tool replies, and with "
    "use_vllm whether top_p / top_k / min_p bias vLLM's importance-sampling correction. Exit status: 0 when no check "
    "fails, 1 when one does, 2 when the doctor could not run. Guide: docs/before_and_during_a_run.md."
)


@dataclass
class DoctorArguments(RecipeArguments):
    """A recipe's fields plus the doctor's own."""

    json: str | None = field(default=None, metadata={"help": "Also write the report, as JSON, to this path."})
    doctor_prompts: int | None = field(
        default=None, metadata={"help": "Prompts to generate answers for (num_generations each). Default: one "
                                "generation batch (generation_batch_size / num_generations)."}
    )


def help_text() -> str:
    """``trl-rlvr doctor --help``: what the doctor does, its own options, the recipe's, the RLVR switches and the
    most-used TRL/transformers fields (:mod:`trl_rlvr.scripts.recipe_help`; everything: ``--help-all``)."""
    from trl_rlvr.scripts.recipe_help import own_fields, short_help

    return short_help(
        "trl-rlvr doctor", "--config RECIPE.yaml [--FIELD VALUE ...] [--json REPORT.json]", DESCRIPTION,
        [("The doctor's own options", own_fields(DoctorArguments, below=RecipeArguments)),
         ("Recipe fields (RecipeArguments: preset, data, prompt, rewards; as in trl-rlvr train)",
          own_fields(RecipeArguments))])


# ------------------------------------------------------------------------------------------------ measure
def sample_rows(dataset, prompts: int, group_size: int, seed: int) -> list[dict]:
    """``prompts`` rows of ``dataset`` (a seeded shuffle, without repeats), each repeated ``group_size`` times in a
    row: the layout of a generation batch (TRL's ``RepeatSampler``)."""
    import random

    order = list(range(len(dataset)))
    random.Random(seed).shuffle(order)
    return [dataset[i] for i in order[:prompts] for _ in range(group_size)]


def completion_flags(completion_ids, stop_ids) -> tuple[list[bool], list[int]]:
    """(truncated, length) per row of padded completion ids: a row that holds no stop token (EOS or pad) was cut
    off at the budget; a finished row's length counts up to and including its first stop token."""
    import torch

    stop = torch.isin(completion_ids, torch.tensor(sorted(stop_ids), device=completion_ids.device))
    finished = stop.any(dim=1)
    first = stop.int().argmax(dim=1)
    lengths = torch.where(finished, first + 1, torch.full_like(first, completion_ids.size(1)))
    return (~finished).tolist(), lengths.tolist()


def measure(trainer, prompts: int | None = None) -> dict:
    """Generate and score one batch with ``trainer``'s own generation (TRL's, one round, in training mode), and
    return what the checks need."""
    args = trainer.args
    group_size = trainer.num_generations
    prompts = prompts or args.generation_batch_size // group_size
    prompts = min(prompts, len(trainer.train_dataset))
    rows = sample_rows(trainer.train_dataset, prompts, group_size, args.seed)
    trainer.model.train()
    start = time.perf_counter()
    output, record = trainer._score_round(rows)
    seconds = time.perf_counter() - start
    rewards_per_func = record.rewards_per_func.float().cpu()
    names = list(trainer.reward_func_names)
    metrics = {k: v[-1] for k, v in trainer.metrics_to_log("train").items() if v}
    counters = {name: {k.split("/", 1)[1]: float(v) for k, v in metrics.items() if k.startswith(f"{name}/")}
                for name in names}
    from trl_rlvr.algorithms.losses import loss_mask

    mask = loss_mask(output)
    truncated, lengths = completion_flags(output["completion_ids"],
                                          {*trainer.eos_token_ids, trainer.processing_class.pad_token_id})
    success_index = trainer.success_reward_index
    success = rewards_per_func[:, success_index] >= getattr(args, "success_threshold", 1.0)
    from trl_rlvr.algorithms.advantages import zero_signal_groups
    from trl_rlvr.sampling.driver import filter_rewards

    signal_rewards = filter_rewards(record, getattr(args, "dynamic_sampling_metric", "reward"), success_index)
    zero = zero_signal_groups(signal_rewards.float().cpu(), group_size,
                              getattr(args, "dynamic_sampling_tolerance", 0.0))
    success_zero = zero_signal_groups(success.float(), group_size)
    completions = list(record.table["completion"])[-len(rows):]
    tools = tool_use_metrics(trainer, output, metrics) if trainer.tools else None
    return {
        "tools": tools,
        "prompts": prompts, "answers": len(rows), "group_size": group_size, "seconds": seconds,
        "reward_names": names, "scores": rewards_per_func.T.tolist(), "counters": counters,
        "success_reward": names[success_index], "success_rate": success.float().mean().item(),
        "zero_signal": zero.tolist(), "success_zero_signal": success_zero.tolist(), "truncated": truncated, "lengths": lengths,
        "loss_tokens": mask.sum(dim=1).long().tolist(),
        "vllm_logp_gap": metrics.get("sampling/sampling_logp_difference/mean"),
        "samples": [{"completion": c, **{n: s[i] for n, s in zip(names, rewards_per_func.T.tolist(), strict=True)}}
                    for i, c in enumerate(completions[:4])],
    }


def tool_use_metrics(trainer, output: dict, metrics: dict) -> dict:
    """A tool run's metrics for :func:`trl_rlvr.checks.verdicts.tool_use_verdict`: each model turn of each answer (the
    ``tool_mask == 1`` runs) re-read by TRL's parser to count the turns whose tool call did not parse (TRL kept
    them as text); TRL's and the environments' per-batch metrics; the tool replies' share of the budget."""
    from trl_rlvr.evaluation.tool_rollouts import parse_turn

    tokenizer = trainer.processing_class
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    call_turns = parse_failures = tool_tokens = 0
    rows = zip(output["prompt_ids"].tolist(), output["prompt_mask"].tolist(), output["completion_ids"].tolist(),
               output["completion_mask"].tolist(), output["tool_mask"].tolist(), strict=True)
    for prompt, prompt_mask, ids, mask, tool_mask in rows:
        prefix = [t for t, m in zip(prompt, prompt_mask, strict=True) if m]
        ids = [t for t, m in zip(ids, mask, strict=True) if m]
        tool_mask = tool_mask[:len(ids)]
        tool_tokens += tool_mask.count(0)
        start = 0
        while start < len(ids):
            end = start
            while end < len(ids) and tool_mask[end] == tool_mask[start]:
                end += 1
            if tool_mask[start]:  # a model turn
                message, failed = parse_turn(tokenizer, ids[start:end], prefix + ids[:start], trainer.tools)
                call_turns += bool(message.get("tool_calls"))
                parse_failures += failed
            start = end
    answers = len(output["completion_ids"])
    return {
        "answers": answers, "call_turns": call_turns, "parse_failures": parse_failures,
        "calls_per_answer": metrics.get("tools/call_frequency", 0.0),
        "call_failure_rate": metrics.get("tools/failure_frequency"),
        "errors_per_answer": metrics.get("rlvr/tool_errors_per_rollout"),
        "timeouts_per_answer": metrics.get("rlvr/tool_timeouts_per_rollout"),
        "tool_tokens": tool_tokens,
        "budget_frac": tool_tokens / (answers * trainer.args.max_completion_length),
    }


def diagnose(m: dict, args, num_processes: int = 1, lora: bool = False) -> list:
    """The checks of :mod:`trl_rlvr.checks.verdicts` for one measured batch ``m`` (:func:`measure`) under ``args``
    (launched on ``num_processes`` processes, with LoRA or not: the step size's bound)."""
    from trl_rlvr.checks.batch_size import rollouts_per_step_verdict
    from trl_rlvr.checks.verdicts import (
        Check,
        importance_sampling_verdict,
        loss_normalization_verdict,
        machine_verdict,
        reward_verdict,
        tool_use_verdict,
        truncation_verdict,
        zero_signal_verdict,
    )

    checks = [machine_verdict([])]
    checks.append(truncation_verdict(m["truncated"], m["lengths"], args.max_completion_length,
                                   mask_truncated_completions=args.mask_truncated_completions))
    varies = {name: len({s for s in scores if not math.isnan(s)}) > 1
              for name, scores in zip(m["reward_names"], m["scores"], strict=True)}
    for name, scores in zip(m["reward_names"], m["scores"], strict=True):
        checks.append(reward_verdict(name, [None if math.isnan(s) else s for s in scores], m["counters"][name],
                                   others_have_signal=any(v for other, v in varies.items() if other != name)))
    checks.append(zero_signal_verdict(
        m["zero_signal"], m["success_rate"], m["group_size"], success_zero_signal=m["success_zero_signal"],
        dynamic_sampling=getattr(args, "dynamic_sampling", False),
        max_sampling_rounds=getattr(args, "max_sampling_rounds", 3),
        selective_sampling=getattr(args, "selective_sampling", False),
    ))
    checks.append(loss_normalization_verdict(
        getattr(args, "loss_normalization", None), args.loss_type, m["loss_tokens"],
        per_device_batch_size=args.per_device_train_batch_size, steps_per_generation=args.steps_per_generation,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        token_count_scope=getattr(args, "token_count_scope", "generation_batch"),
        loss_constant=getattr(args, "loss_constant", None), max_completion_length=args.max_completion_length,
        seed=args.seed,
    ))
    checks.append(rollouts_per_step_verdict(args, num_processes, lora))  # the learning rate for the rollouts
    if m.get("tools") is not None:
        checks.append(tool_use_verdict(m["tools"]))
    if getattr(args, "use_vllm", False):
        checks.append(importance_sampling_verdict(args))
    if m.get("vllm_logp_gap") is not None:
        gap = m["vllm_logp_gap"]
        checks.append(Check(
            "vLLM vs trainer log-probs", "warn" if gap > 0.1 else "ok",
            f"mean |log p_vLLM - log p_trainer| = {gap:.3f} nats per token",
            "the sampler and the trained model disagree: check vLLM's dtype against the model's, and keep "
            "vllm_importance_sampling_correction on" if gap > 0.1 else "", {"mean_logp_difference": gap}))
    return checks


# ------------------------------------------------------------------------------------------------ report
def render(checks: list, header: str) -> str:
    """The report: ``header``, one line per check of :class:`trl_rlvr.checks.verdicts.Check` (and its advice), the
    verdict."""
    from trl_rlvr.checks.verdicts import worst_verdict

    width = max(len(c.name) for c in checks)
    lines = [header]
    for c in checks:
        lines.append(f"  {c.verdict:<4}  {c.name:<{width}}  {c.summary}")
        if c.advice:
            lines.append(f"  {'':<4}  {'':<{width}}  -> {c.advice}")
    fails, warns = (sum(c.verdict == v for c in checks) for v in ("fail", "warn"))
    lines.append(f"verdict: {worst_verdict(checks)} ({fails} fail, {warns} warn)")
    return "\n".join(lines)


def _write_json(path: str | None, report: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2, default=lambda v: None if isinstance(v, float) and math.isnan(v) else str(v))


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``trl-rlvr doctor``; returns the exit status. ``--help`` prints :func:`help_text` (no TRL
    import), ``--help-all`` every field (TRL's parser)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv) == "short":
        print(help_text(), end="")
        return 0
    if wants_help(argv) == "all":
        argv = ["--help"]  # TRL's parser: every field, with its full help
    from trl_rlvr.checks.machine import UnusableSettingsError
    from trl_rlvr.checks.verdicts import Check, exit_code, machine_verdict, worst_verdict
    from trl_rlvr.scripts.train import (
        _read_config,
        _setting,
        build_trainer,
        log_file_defaults,
        make_parser,
        use_cpu_threads,
    )

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    log_file_defaults()  # a log file gets plain lines, not the libraries' bars
    try:
        recipe, args, model_args = make_parser(DoctorArguments, prog="trl-rlvr doctor").parse_args_and_config(argv)
    except UnusableSettingsError as e:  # the machine check fails before anything else can be measured
        checks = [machine_verdict(e.problems)]
        checks[0] = Check("machine", "fail", checks[0].summary, "override: " + " ".join(
            f"--{k} {str(v).lower()}" for k, v in e.overrides.items()), checks[0].numbers)
        print(render(checks, "trl-rlvr doctor: the settings cannot run here; nothing was generated"))
        try:
            json_path = _setting("json", argv, _read_config(argv)[1])
        except (OSError, ValueError):
            json_path = None
        _write_json(json_path, {"exit_code": 1, "verdict": "fail", "checks": [c.to_dict() for c in checks]})
        return 1
    except (ValueError, ImportError, OSError) as e:
        print(f"trl-rlvr doctor: could not run: {e}", file=sys.stderr)
        return COULD_NOT_RUN
    try:
        use_cpu_threads(recipe.cpu_threads, 1)
        trainer, _ = build_trainer(recipe, args, model_args)
        m = measure(trainer, recipe.doctor_prompts)
    except Exception as e:  # noqa: BLE001 - any failure to build or generate is "could not run", with its reason
        print(f"trl-rlvr doctor: could not run: {type(e).__name__}: {e}", file=sys.stderr)
        return COULD_NOT_RUN
    checks = diagnose(m, trainer.args, trainer.accelerator.num_processes, bool(getattr(model_args, "use_peft", False)))
    header = (f"trl-rlvr doctor: {model_args.model_name_or_path or 'the offline SmolLM2'}, {m['answers']} answers to "
              f"{m['prompts']} prompts (num_generations={m['group_size']}, max_completion_length="
              f"{trainer.args.max_completion_length}, temperature={trainer.args.temperature}), generated and scored "
              f"in {m['seconds']:.1f} s")
    print(render(checks, header))
    code = exit_code(checks)
    _write_json(recipe.json, {"exit_code": code, "verdict": worst_verdict(checks), "checks": [c.to_dict() for c in checks],
                              "batch": m})
    return code
