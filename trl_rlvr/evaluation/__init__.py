"""Held-out evaluation with the training verifiers: greedy accuracy, and sampled pass@k / maj@k / mean@n.

- :mod:`.evaluate`: :func:`evaluate` (greedy) and :func:`evaluate_sampled`, single- or multi-process;
- :mod:`.generation`: the one generation loop (greedy, or seeded sampling with each sample's stream fixed by seed, question and sample index)
  and :class:`SamplingSettings`, the sampling settings of every back-end;
- :mod:`.vllm_generation`: the same completions from a vLLM engine (one seeded request per sample);
- :mod:`.tool_rollouts`: multi-turn tool rollouts with an ``environment_factory`` (TRL's tool loop, each turn seeded)
  and their metrics (tool-call rate, parse failures, errors, timeouts, the budget share of tool replies);
- :mod:`.passk`: the unbiased pass@k estimator and exact maj@k;
- :mod:`.metric_table`: every metric's definition, read by the summary, the callback and the table;
- :mod:`.report`: the table, the JSON and the pass@k plot; :mod:`.callback`: :class:`SampledEvalCallback`;
- :mod:`.heldout`: a training job's before/after evaluation, progress lines, table, curves and metrics JSON.
"""

from trl_rlvr.evaluation.evaluate import (
    default_ks,
    evaluate,
    evaluate_sampled,
    release_memory,
    resolve_ks,
    score_question,
    score_questions,
    summarize_sampled,
)
from trl_rlvr.evaluation.generation import SamplingSettings, generate_completions
from trl_rlvr.evaluation.passk import maj_at_k, mean_pass_at_k, pass_at_k
from trl_rlvr.evaluation.tool_rollouts import generate_tool_completions, summarize_tool_rollouts, tool_chat_template

__all__ = [
    "SamplingSettings",
    "default_ks",
    "evaluate",
    "evaluate_sampled",
    "generate_completions",
    "generate_tool_completions",
    "maj_at_k",
    "mean_pass_at_k",
    "pass_at_k",
    "release_memory",
    "resolve_ks",
    "score_question",
    "score_questions",
    "summarize_sampled",
    "summarize_tool_rollouts",
    "tool_chat_template",
]
