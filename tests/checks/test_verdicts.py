"""The doctor's checks (trl_rlvr.checks.verdicts), each a pure function of measured numbers, on hand-made batches."""

import math

import pytest

from trl_rlvr.checks.verdicts import (
    Check,
    dynamic_sampling_cost,
    exit_code,
    loss_normalization_verdict,
    machine_verdict,
    reward_summary,
    reward_verdict,
    step_token_counts,
    truncation_verdict,
    worst_verdict,
    zero_signal_verdict,
)


def test_truncation_verdicts_follow_the_share_cut_off():
    assert truncation_verdict([False] * 20, [30] * 20, 64).verdict == "ok"
    warn = truncation_verdict([True] * 3 + [False] * 17, [64] * 3 + [30] * 17, 64)
    assert warn.verdict == "warn" and "15% of 20 answers" in warn.summary and "--max_completion_length 128" in warn.advice
    fail = truncation_verdict([True] * 19 + [False], [8] * 19 + [5], 8, mask_truncated_completions=True)
    assert fail.verdict == "fail" and fail.numbers["truncated_frac"] == pytest.approx(0.95)
    assert "no loss either" in fail.advice and fail.numbers["mean_length_finished"] == 5


def test_a_reward_that_reads_no_answer_fails_and_names_the_counter():
    check = reward_verdict("boxed_math", [0.0] * 8, {"no_box": 8.0, "hedged": 0.0})
    assert check.verdict == "fail"
    assert "100% unreadable (no_box 8)" in check.summary and "could read no answer" in check.advice
    learning_from_others = reward_verdict("boxed_math", [0.0] * 8, {"no_box": 8.0}, others_have_signal=True)
    assert learning_from_others.verdict == "warn" and "the other rewards" in learning_from_others.advice


def test_a_reward_that_reads_most_answers_is_ok_and_one_that_reads_few_warns():
    scores = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert reward_verdict("boxed_math", scores, {"no_box": 1.0}).verdict == "ok"
    few = reward_verdict("boxed_math", scores, {"no_box": 5.0})
    assert few.verdict == "warn" and "62% unreadable" in few.summary


def test_reward_failures_warn_then_fail():
    scores = [1.0, 0.0] * 10
    assert reward_verdict("code_sandbox", scores, {"errors": 1.0}).verdict == "warn"
    fail = reward_verdict("code_sandbox", scores, {"errors": 1.0, "timeouts": 2.0})
    assert fail.verdict == "fail" and "1 errors, 2 timeouts" in fail.summary and "timeout" in fail.advice


def test_reward_summary_statistics_ignore_unscored_answers():
    s = reward_summary([1.0, None, 0.0, math.nan], {})
    assert s["mean"] == 0.5 and s["std"] == 0.5 and s["not_scored_frac"] == 0.5
    assert reward_verdict("r", [None, None], {}).verdict == "fail"  # scored nothing
    constant = reward_verdict("think_format", [0.0] * 4, {})
    assert constant.verdict == "warn" and "gave every answer 0" in constant.advice


def test_an_all_zero_signal_batch_fails_and_a_mixed_one_reports_the_expected_share():
    fail = zero_signal_verdict([True] * 4, success_rate=0.0, group_size=8, dynamic_sampling=True, max_sampling_rounds=2)
    assert fail.verdict == "fail" and "100% of 4 groups" in fail.summary and "max_sampling_rounds=2" in fail.advice
    ok = zero_signal_verdict([True, False, False, False], success_rate=0.5, group_size=4)
    assert ok.verdict == "ok"
    assert ok.numbers["expected_zero_signal_frac"] == pytest.approx(0.5**4 * 2)  # p^G + (1-p)^G


def test_zero_signal_advice_costs_dynamic_sampling_and_points_at_selective_sampling():
    check = zero_signal_verdict([True, True, True, False], success_rate=0.5, group_size=4)
    assert check.verdict == "warn"
    assert "--dynamic_sampling true" in check.advice and "4.0x" in check.advice  # 1 / (1 - 0.75)
    assert "--selective_sampling true" in check.advice  # 75% measured > 12.5% expected
    assert dynamic_sampling_cost(0.5) == 2.0 and math.isinf(dynamic_sampling_cost(1.0))


def test_signal_from_shaping_alone_warns():
    check = zero_signal_verdict([False, False], success_rate=0.0, group_size=4, success_zero_signal=[True, True])
    assert check.verdict == "warn" and "shaping rewards alone" in check.advice


def test_step_token_counts_split_the_generation_batch_as_trl_does():
    exact, estimate = step_token_counts([1, 2, 3, 4, 5, 6, 7, 8], per_device_batch_size=2, steps_per_generation=4,
                                        gradient_accumulation_steps=2, seed=0)
    assert sum(exact) == 36 and len(exact) == 2 and estimate == [18.0, 18.0]
    exact, estimate = step_token_counts([5] * 4, 2, 2, 2)
    assert exact == [20] and estimate == [20.0]


def test_loss_check_warns_only_where_trls_estimate_is_used_and_off():
    tokens = [100, 1, 1, 1]  # 4 micro-batches of one row, 2 steps of 2: one step holds the long answer
    kwargs = dict(per_device_batch_size=1, steps_per_generation=4, gradient_accumulation_steps=2)
    exact_steps, _ = step_token_counts(tokens, 1, 4, 2)
    assert sorted(exact_steps) == [2, 101]
    estimate = loss_normalization_verdict("per_batch_token", "dapo", tokens, token_count_scope="generation_batch", **kwargs)
    assert estimate.verdict == "warn" and "--token_count_scope optimizer_step" in estimate.advice
    exact = loss_normalization_verdict("per_batch_token", "dapo", tokens, token_count_scope="optimizer_step", **kwargs)
    assert exact.verdict == "ok" and "exact count" in exact.summary
    uneven = loss_normalization_verdict("per_batch_token", "dapo", tokens * 3, per_device_batch_size=1,
                                      steps_per_generation=3, gradient_accumulation_steps=2)
    assert uneven.numbers["exact_count_used"] is False
    constant = loss_normalization_verdict("constant", "dr_grpo", tokens, max_completion_length=64, **kwargs)
    assert constant.verdict == "ok" and "C=64" in constant.summary


def test_machine_check_and_the_overall_verdict():
    assert machine_verdict([]).verdict == "ok"
    fail = machine_verdict(["bf16=True needs a GPU"])
    assert fail.verdict == "fail"
    assert worst_verdict([machine_verdict([]), Check("x", "warn", "")]) == "warn"
    assert exit_code([machine_verdict([]), Check("x", "warn", "")]) == 0 and exit_code([fail]) == 1
    with pytest.raises(ValueError, match="verdict"):
        Check("x", "bad", "")
