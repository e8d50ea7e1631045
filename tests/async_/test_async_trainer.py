"""RLVRAsyncTrainer on a CPU, TRL's rollout worker and weight transfer stubbed (TRL's own protocols): the reward
functions it resolves and scores with, and its loss against the formula (the packed forward stubbed: TRL's tree
attention needs a GPU kernel)."""

import math
import queue

import pytest
import torch

pytest.importorskip("trl.experimental.async_grpo")

from trl_rlvr._compat.async_adapter import PackedForward  # noqa: E402
from trl_rlvr.async_grpo import RLVRAsyncConfig, RLVRAsyncTrainer  # noqa: E402
from trl_rlvr.async_grpo import async_trainer as trainer_module  # noqa: E402


class StubWorker:
    def __init__(self):
        self.rollout_buffer = queue.Queue()
        self.metrics_queue = queue.Queue()  # read by AsyncGRPOTrainer.log, though not in its RolloutWorkerProtocol

    def start(self): ...
    def stop(self): ...
    def update_model_version(self, model_version): ...
    def check_health(self, stale_after_s): ...


class StubTransfer:
    def init_weight_transfer(self): ...
    def pause(self): ...
    def send_weights(self, iterator): ...
    def resume(self): ...
    def destroy(self): ...


def make_trainer(model_dir, tmp_path, **overrides):
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast

    args = RLVRAsyncConfig(output_dir=str(tmp_path), bf16=False, use_cpu=True, max_steps=1, report_to=[],
                           token_budget=0, per_device_train_batch_size=2, num_generations=2,
                           gradient_checkpointing=False, max_completion_length=16, **overrides)
    return RLVRAsyncTrainer(model=str(model_dir), reward_funcs=["think_format", "boxed_math"], args=args,
                            train_dataset=Dataset.from_dict({"prompt": ["a", "b"], "answer": ["1", "2"]}),
                            processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir),
                            rollout_worker=StubWorker(), weight_transfer=StubTransfer())


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    return make_trainer(tiny_model_dir, tmp_path_factory.mktemp("out"), overlong_buffer_length=4,
                        overlong_penalty_factor=0.5, reward_options={"boxed_math": {"prestart": False}})


def test_rewards_by_name_with_the_overlong_penalty_and_its_weight(trainer):
    assert [f.__name__ for f in trainer.reward_funcs] == ["think_format", "boxed_math", "overlong"]
    scoring = trainer.group_scoring
    assert scoring.weights == (1.0, 1.0, 0.5)
    assert scoring.correctness_checks == (1,)  # boxed_math verifies correctness: the success reward
    assert (scoring.scale_rewards, scoring.baseline, scoring.std) == ("group", "group_mean", "population")
    assert not trainer.uses_rlvr_scoring  # an injected worker is the caller's


# -- the loss -------------------------------------------------------------------------------------------------

LOGP = [-1.0, -2.0, -0.5, -3.0, -1.2]
OLD = [-1.1, -0.5, -2.0, -2.0, -1.2]
ADV = [1.0, 1.0, -1.0, -1.0, -1.0]
SEG = [0, 0, 1, 1, 1]


def run_loss(trainer, monkeypatch, **args):
    logp = torch.tensor(LOGP, requires_grad=True)
    fwd = PackedForward(logp, torch.full((5,), 0.5), torch.tensor(OLD), torch.tensor(ADV), torch.tensor(SEG), None)
    monkeypatch.setattr(trainer_module, "packed_forward", lambda trainer, model, inputs: fwd)
    for key, value in args.items():
        monkeypatch.setattr(trainer.args, key, value)
    trainer.current_gradient_accumulation_steps = 2
    trainer._last_forward_time_s = 0.0
    inputs = {"global_n_tokens": torch.tensor([5.0]), "global_n_forward_tokens": torch.tensor([9.0]),
              "mean_seq_len": torch.tensor([4.5])}
    trainer._metrics["train"].clear()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.item(), logp.grad.tolist(), dict(trainer._metrics["train"])


def test_no_correction_and_token_normalization_is_trls_loss(trainer, monkeypatch):
    loss, grad, _ = run_loss(trainer, monkeypatch, stale_is_mode=None, loss_normalization="per_batch_token")
    r = [math.exp(a - b) for a, b in zip(LOGP, OLD)]
    per_token = [-min(x * a, min(max(x, 0.8), 1.2) * a) for x, a in zip(r, ADV)]
    assert loss == pytest.approx(sum(per_token) / 5 / 2)  # TRL: / (global tokens / processes) / accumulation steps
    want_grad = [-x * a / 10 if x * a <= min(max(x, 0.8), 1.2) * a else 0.0 for x, a in zip(r, ADV)]
    assert grad == pytest.approx(want_grad)


def test_truncated_weights_and_per_answer_normalization(trainer, monkeypatch):
    loss, grad, metrics = run_loss(trainer, monkeypatch, stale_is_mode="token_truncate", stale_is_clip_max=2.0,
                                   loss_normalization="per_answer")
    r = [math.exp(a - b) for a, b in zip(LOGP, OLD)]  # 1.11, 0.22, 4.48, 0.37, 1
    w = [min(x, 2.0) for x in r]
    active = [not ((a > 0 and x > 1.2) or (a < 0 and x < 0.8)) for x, a in zip(r, ADV)]
    n = [2, 2, 3, 3, 3]
    want_grad = [(-wi * a / ni / 2 / 2 if on else 0.0) for wi, a, ni, on in zip(w, ADV, n, active)]
    assert grad == pytest.approx(want_grad)
    assert grad[2] == pytest.approx(2.0 / 3 / 2 / 2)  # r = 4.48 on A < 0: truncated to C_max
    assert metrics["stale_is/ratio_max"] == [pytest.approx(math.exp(1.5))]
    assert metrics["stale_is/clipped_frac"] == [pytest.approx(1 / 5)]
    assert metrics["entropy"] == [pytest.approx(0.5)]
    assert loss == pytest.approx(sum((-(wi / x) * min(x * a, min(max(x, 0.8), 1.2) * a)) / ni
                                     for wi, x, a, ni in zip(w, r, ADV, n)) / 2 / 2)


def test_the_step_accounting_trls_step_metrics_read(trainer, monkeypatch):
    before = trainer._step_trained_tokens, trainer._step_samples
    run_loss(trainer, monkeypatch)
    assert trainer._step_trained_tokens - before[0] == 5.0 and trainer._step_samples - before[1] == 2.0
