"""The asynchronous trainer logs RLVRTrainer's ``rlvr/`` metrics where they mean the same thing (the rollout
metrics of every scored group, the unscorable share, the clipped shares), beside its own ``stale_is/`` metrics, and
the alarms run on it: a real run (the stream worker of test_resume: RLVRRolloutLoop's scoring, TRL's loop) logs them
and raises no alarm."""

import asyncio
import math
import queue

import pytest
import torch

pytest.importorskip("trl.experimental.async_grpo")

from tests.async_.test_rescore import group, loop_for  # noqa: E402
from tests.async_.test_resume import run  # noqa: E402
from trl_rlvr.algorithms.metrics import rollout_metrics  # noqa: E402
from trl_rlvr.algorithms.stale_is import STALE_IS_METRICS  # noqa: E402
from trl_rlvr.async_grpo.rescore import GroupScoring, group_rollout_metrics  # noqa: E402
from trl_rlvr.trainer import _TRL_METRIC_ALIASES  # noqa: E402

#: RLVRTrainer's rlvr/ names the asynchronous trainer does not log: the expected zero-signal share needs the whole
#: batch's accuracy (a window's pairs cannot give p^G + (1-p)^G).
NOT_IN_ASYNC = {"rlvr/zero_signal_expected"}


def sync_rlvr_names() -> set[str]:
    """What RLVRTrainer logs under rlvr/ every step (without tools): its rollout metrics, the unscorable share, the
    kept-groups share (dynamic sampling) and TRL's clipped shares under its names."""
    one = torch.ones(4)
    names = set(rollout_metrics(one, one, one, one.bool(), group_size=2))
    return names | {"rlvr/unscorable_frac", "rlvr/kept_groups_frac", *_TRL_METRIC_ALIASES.values()}


def test_the_async_trainer_logs_the_shared_rlvr_names_and_no_alarm(tiny_model_dir, tmp_path):
    trainer, _, _ = run(tiny_model_dir, tmp_path)
    logged = set().union(*(h for h in trainer.state.log_history if "loss" in h))
    assert sync_rlvr_names() - NOT_IN_ASYNC <= logged, sorted(sync_rlvr_names() - NOT_IN_ASYNC - logged)
    assert {f"stale_is/{m}" for m in STALE_IS_METRICS} | {"kl", "ratio", "clip_ratio/region_mean"} <= logged
    history = [h for h in trainer.state.log_history if "loss" in h]
    # the stream worker's groups: answers 0 right, 1 wrong; the all-right prompts dropped (2 of 7 dataset rows)
    assert all(h["rlvr/truncated_frac"] == 1.0 for h in history)  # the scripted answers end without a stop token
    assert 0 < sum(h["rlvr/zero_signal_frac"] for h in history) and all(0 < h["rlvr/accuracy"] < 1 for h in history)
    assert not any(k.startswith("rlvr/alarm/") for k in logged)


def test_group_rollout_metrics_are_rlvr_trainers_over_a_window():
    """Summed over groups, the pairs give RLVRTrainer's batch values (rollout_metrics) for the same answers."""
    success = [torch.tensor([1.0, 0.0, float("nan")]), torch.tensor([1.0, 1.0, 1.0])]
    lengths, truncated = [[3, 5, 7], [2, 2, 4]], [[False, True, False], [False, False, True]]
    pairs = [group_rollout_metrics(s, 1.0, informative=bool(s.nan_to_num(0).std() > 0), kept=True, lengths=n,
                                   truncated=t) for s, n, t in zip(success, lengths, truncated)]
    window = {k: sum(p[k][0] for p in pairs) / sum(p[k][1] for p in pairs) for k in pairs[0]}
    flat = torch.cat(success)
    want = rollout_metrics(flat.nan_to_num(0), flat, torch.tensor(sum(lengths, [])),
                           torch.tensor(sum(truncated, [])), group_size=3)
    for key in ("rlvr/accuracy", "rlvr/length_right", "rlvr/length_wrong", "rlvr/zero_signal_frac",
                "rlvr/truncated_frac"):
        assert window[key] == pytest.approx(want[key]), key


def counting(completions, log_metric=None, **kwargs):
    log_metric("counting/no_box", float(sum("box" not in c[0]["content"] for c in completions)))
    return [1.0] * len(completions)


def test_the_reward_plugins_counters_reach_the_trainer():
    """TRL's asynchronous loop passes no log_metric; RLVRRolloutLoop gives one, as TRL's synchronous trainer does,
    and pushes the counters (per reward call: one group) with the rollout metrics."""
    loop = loop_for(GroupScoring(weights=(1.0, 1.0), success=0))
    loop.reward_funcs, loop.reward_func_names = [loop.reward_funcs[0], counting], ["correct", "counting"]
    loop.eos_token_ids, loop.tools = [3], []
    asyncio.run(loop._score_group(group(["<think>x</think>4", "box 5", "x"], ["4", "4", "4"], [1, 1, 1])))
    pushed = loop._metrics_queue.get_nowait()
    assert pushed["counting/no_box"] == 2.0 and pushed["rlvr/accuracy"] == (1.0, 3.0)
    assert pushed["rlvr/truncated_frac"] == (0.0, 3.0)  # the hand-built group's answers end with token 3
    with pytest.raises(queue.Empty):
        loop._metrics_queue.get_nowait()
    assert math.isfinite(pushed["rlvr/length_right"][0])
