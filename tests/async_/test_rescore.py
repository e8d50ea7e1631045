"""The RLVR advantages on TRL's rollout rows: pure (rescore_rows on rows as TRL lays them out, forks included) and
through TRL's own ``_AsyncRolloutLoop._score_group`` run on a hand-built group (RLVRRolloutLoop)."""

import asyncio
import math
import pickle
import queue
from collections import defaultdict
from types import SimpleNamespace

import pytest

pytest.importorskip("trl.experimental.async_grpo")

from trl.experimental.async_grpo.async_rollout_worker import (  # noqa: E402
    AsyncRolloutWorker,
    RolloutGroup,
    TrainingSequence,
)

from trl_rlvr._compat.async_adapter import RLVRRolloutLoop, use_rlvr_scoring  # noqa: E402
from trl_rlvr.async_grpo.rescore import GroupScoring, rescore_rows  # noqa: E402

NAN = math.nan


def rows(per_answer: list[dict], forks: list[int]) -> list:
    """TRL's layout: answer i's metrics on forks[i] rows, each row its own copy, TRL's advantage 9 (a marker)."""
    return [SimpleNamespace(advantage=9.0, metrics=dict(m)) for m, n in zip(per_answer, forks) for _ in range(n)]


def metrics(correct, fmt):
    return {"reward": 0.0, "rewards/boxed_math": correct, "rewards/think_format": fmt}


NAMES = ["boxed_math", "think_format"]


def test_forked_answers_share_their_answers_advantage():
    samples = rows([metrics(1.0, 1.0), metrics(0.0, 1.0), metrics(0.0, 0.0), metrics(1.0, 0.0)], [1, 3, 1, 2])
    out, m = rescore_rows(samples, [1, 3, 1, 2], NAMES, GroupScoring(weights=(1.0, 0.5), scale_rewards="none"))
    totals = [1.5, 0.5, 0.0, 1.0]
    want = [t - sum(totals) / 4 for t in totals]
    assert [s.advantage for s in out] == pytest.approx([want[0], *[want[1]] * 3, want[2], *[want[3]] * 2])
    assert [s.metrics["reward"] for s in out] == pytest.approx([1.5, 0.5, 0.5, 0.5, 0.0, 1.0, 1.0])
    assert m["rlvr/ds_dropped_groups_total"] == 0.0 and m["rlvr/unscorable_frac"] == (0.0, 4.0)


def test_an_unscored_check_leaves_its_rows_at_zero():
    samples = rows([metrics(1.0, 1.0), metrics(NAN, 1.0), metrics(0.0, 1.0)], [1, 1, 1])
    out, m = rescore_rows(samples, [1, 1, 1], NAMES, GroupScoring(weights=(1.0, 1.0), correctness_checks=(0,)))
    assert out[1].advantage == 0.0 and math.isnan(out[1].metrics["reward"]) and m["rlvr/unscorable_frac"] == (1.0, 3.0)
    assert out[0].advantage > 0 > out[2].advantage


def test_dynamic_sampling_drops_a_zero_signal_group_before_it_is_queued():
    samples = rows([metrics(1.0, 1.0)] * 3, [1, 2, 1])
    scoring = GroupScoring(weights=(1.0, 1.0), dynamic_sampling=True)
    out, m = rescore_rows(samples, [1, 2, 1], NAMES, scoring)
    assert out == [] and m["rlvr/ds_dropped_groups_total"] == 1.0
    kept, m = rescore_rows(rows([metrics(1.0, 1.0), metrics(0.0, 1.0)], [1, 1]), [1, 1], NAMES, scoring)
    assert len(kept) == 2 and m["rlvr/ds_dropped_groups_total"] == 0.0
    # without dynamic sampling the group is kept (advantage 0 everywhere)
    out, _ = rescore_rows(rows([metrics(1.0, 1.0)] * 2, [1, 1]), [1, 1], NAMES, GroupScoring(weights=(1.0, 1.0)))
    assert [s.advantage for s in out] == [0.0, 0.0]


def test_an_answer_without_rows_keeps_trls_advantages_and_is_counted():
    samples = rows([metrics(1.0, 1.0), metrics(0.0, 1.0)], [1, 1])
    out, m = rescore_rows(samples, [1, 0, 1], NAMES, GroupScoring(weights=(1.0, 1.0)))
    assert [s.advantage for s in out] == [9.0, 9.0] and m == {"rlvr/rescore_skipped_total": 1.0}
    with pytest.raises(ValueError, match="rows for answers"):
        rescore_rows(samples, [1, 2], NAMES, GroupScoring(weights=(1.0, 1.0)))


# -- through TRL's own _score_group ------------------------------------------------------------------------------

def correct(completions, answer, **kwargs):
    return [None if a is None else float(a in c[0]["content"]) for c, a in zip(completions, answer)]


def think(completions, **kwargs):
    return [float(c[0]["content"].startswith("<think>")) for c in completions]


def loop_for(scoring):
    """An RLVRRolloutLoop with only what _score_group reads (its __init__ opens a vLLM session), in a process set up
    as TRL's child sets itself up (accelerate's PartialState, for its logger)."""
    from accelerate.state import PartialState

    PartialState()
    loop = object.__new__(RLVRRolloutLoop)
    loop.reward_funcs, loop.reward_func_names = [correct, think], ["correct", "think"]
    loop._env_reward_types, loop._provides_rollout_reward = [], False
    loop._metrics_queue, loop._counters, loop._rates = queue.Queue(), defaultdict(float), defaultdict(lambda: [0, 0])
    loop.rlvr_scoring = scoring
    return loop


def group(texts, answers, forks):
    seqs = [[TrainingSequence([1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.7], f"r{i}") for _ in range(n)]
            for i, n in enumerate(forks)]
    return RolloutGroup(prompts=[[{"role": "user", "content": "q"}]] * len(texts), reward_kwargs={"answer": answers},
                        completions=[[{"role": "assistant", "content": t}] for t in texts],
                        completions_ids=[[2, 3]] * len(texts), completions_sequences=seqs,
                        tool_call_counts=[0] * len(texts), tool_failure_counts=[0] * len(texts), model_version=3,
                        group_id=7, env_rewards=[None] * len(texts), rollout_rewards=[None] * len(texts))


def test_trls_score_group_then_the_rlvr_advantages():
    texts = ["<think>x</think>4", "5", "<think>y</think>5", "<think>z</think>4"]
    g = group(texts, ["4", "4", None, "4"], [1, 2, 1, 1])  # answer 2: gold missing, the check returns None
    plain = asyncio.run(loop_for(None)._score_group(g))
    loop = loop_for(GroupScoring(weights=(1.0, 0.5), correctness_checks=(0,), scale_rewards="none"))
    ours = asyncio.run(loop._score_group(group(texts, ["4", "4", None, "4"], [1, 2, 1, 1])))
    # TRL: nansum with weight 1, the row with the failed check scored by its format reward (1.0) alone
    assert [s.metrics["reward"] for s in plain] == [2.0, 0.0, 0.0, 1.0, 2.0]
    assert plain[3].advantage != 0
    # RLVR: weights 1 / 0.5, the row out of the group, Dr. GRPO's centering without std
    totals = [1.5, 0.0, 1.5]
    mean = sum(totals) / 3
    assert [s.advantage for s in ours] == pytest.approx([1.5 - mean, -mean, -mean, 0.0, 1.5 - mean])
    assert [s.model_version for s in ours] == [3] * 5 and [s.group_id for s in ours] == [7] * 5
    pushed = loop._metrics_queue.get_nowait()
    assert pushed["rlvr/unscorable_frac"] == (1.0, 4.0)


def test_trls_worker_spawns_the_rlvr_loop_with_its_scoring():
    worker = object.__new__(AsyncRolloutWorker)  # its __init__ needs vLLM installed
    worker._process, worker._loop_kwargs, worker._loop_cls = None, {"num_generations": 4}, None
    scoring = GroupScoring(weights=(1.0,), dynamic_sampling=True)
    assert use_rlvr_scoring(worker, scoring)
    assert worker._loop_cls is RLVRRolloutLoop and worker._loop_kwargs["rlvr_scoring"] == scoring
    assert pickle.loads(pickle.dumps(worker._loop_kwargs))["rlvr_scoring"] == scoring  # what start() checks
    assert not use_rlvr_scoring(SimpleNamespace(_process=None, _loop_kwargs={}), scoring)  # another worker: left alone
    assert not use_rlvr_scoring(None, scoring)
