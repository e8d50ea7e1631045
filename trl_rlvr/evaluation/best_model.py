"""Checkpoints chosen by held-out pass@k: ``metric_for_best_model="eval/pass@1"`` with ``load_best_model_at_end``.

transformers' ``Trainer`` chooses the best checkpoint from the metrics its own evaluation returns: after
``evaluate`` it calls ``_determine_best_metric(metrics)``, which reads ``metrics["eval_" + metric_for_best_model]``
and records ``state.best_metric`` and ``state.best_global_step``; the checkpoint saved at that step becomes
``state.best_model_checkpoint``, loaded at the end. GRPO's own evaluation returns mean rewards, not pass@k, so
when ``metric_for_best_model`` names one of :class:`~trl_rlvr.evaluation.callback.SampledEvalCallback`'s keys
(``eval/pass@k``, ``eval/maj@k``, ``eval/format_rate``, ...) the callback takes the evaluation's place: at each of
its evaluations it hands its metrics to ``_determine_best_metric`` (with ``save_strategy="best"``: a checkpoint
is saved only on a new best), and it turns the trainer's own evaluation off for the steps (which would not hold
the key).

The settings it needs: ``eval_strategy="steps"`` with an ``eval_dataset`` (transformers requires one for
``load_best_model_at_end``; the trainer's evaluation of it is skipped), ``save_strategy="steps"`` with
``save_steps`` a multiple of the callback's ``eval_steps`` (or ``save_strategy="best"``).
"""

from __future__ import annotations

from trl_rlvr._compat.grpo_adapter import is_new_best_metric


def _save_strategy(args) -> str:
    """``args.save_strategy`` as its plain value ("steps", "best", ...), whether a string or transformers' enum."""
    return str(getattr(args.save_strategy, "value", args.save_strategy))


def sampled_best_metric(args, eval_steps: int, keys: list[str]) -> str | None:
    """The callback's key that ``args.metric_for_best_model`` names (``"eval/pass@1"`` or ``"eval_eval/pass@1"``), or
    None when it names another metric. Raises ``ValueError`` naming the field when it names an ``eval/`` key the
    callback does not log, or when checkpoints would not be saved at the callback's evaluations."""
    name = getattr(args, "metric_for_best_model", None)
    if not name:
        return None
    key = name[len("eval_"):] if name.startswith("eval_eval/") else name
    if not key.startswith("eval/"):
        return None
    if key not in keys:
        raise ValueError(f"metric_for_best_model={name!r} is not a key SampledEvalCallback logs; its keys: {keys}")
    selecting = args.load_best_model_at_end or _save_strategy(args) == "best"
    save_steps = args.save_steps
    if selecting and _save_strategy(args) == "steps" and save_steps % eval_steps:
        raise ValueError(f"metric_for_best_model={name!r} needs a checkpoint at SampledEvalCallback's evaluations: "
                         f"save_steps ({save_steps}) must be a multiple of its eval_steps ({eval_steps})")
    return key


def offer_to_best_model_selection(trainer, control, logs: dict) -> bool:
    """Hand ``logs`` (``{"eval/pass@1": ..}``) to the Trainer's best-model selection as its evaluation would; returns
    whether the metric is a new best (and, with ``save_strategy="best"``, saves a checkpoint only then)."""
    metrics = {f"eval_{k}": v for k, v in logs.items() if k.startswith("eval/")}
    is_new_best = is_new_best_metric(trainer, metrics)
    if _save_strategy(trainer.args) == "best":
        control.should_save = is_new_best
    return is_new_best
