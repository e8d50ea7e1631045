"""The asynchronous trainer's prompt stream across a crash: a run checkpointed, then resumed from that checkpoint,
trains the prompts whose groups were not trained before it, in stream order, each group in one run segment only, and
skips none (trl_rlvr.sampling.stream_ledger; docs/dynamic_sampling.md).

No vLLM: :class:`StreamWorker` is TRL's worker with the rollout process run in this process, on demand: the
:class:`RLVRRolloutLoop`'s own prompt stream and group scoring (TRL's ``_score_group``, the RLVR advantages, dynamic
sampling's drop and its marker) on scripted answers. Each row's behaviour log-probabilities encode its stream
position, so what the loss trained is read from the loss's own inputs."""

import asyncio
import json
import math
import os
import queue

import pytest
from transformers import TrainerCallback

pytest.importorskip("trl.experimental.async_grpo")

from trl.experimental.async_grpo.async_rollout_worker import (  # noqa: E402
    AsyncRolloutWorker,
    RolloutGroup,
    TrainingSequence,
)

from tests.async_.test_async_trainer import StubTransfer  # noqa: E402
from trl_rlvr._compat.async_adapter import RLVRRolloutLoop  # noqa: E402
from trl_rlvr.async_grpo import RLVRAsyncConfig, RLVRAsyncTrainer  # noqa: E402
from trl_rlvr.async_grpo import async_trainer as trainer_module  # noqa: E402
from trl_rlvr.async_grpo.rescore import GroupScoring  # noqa: E402
from trl_rlvr.sampling.stream_ledger import StreamStart  # noqa: E402

N_PROMPTS, G = 7, 2
ZERO_SIGNAL = {1, 5}  # dataset rows whose answers are all right: dynamic sampling drops their groups


def correct(completions, answer, **kwargs):
    return [float(a in c[0]["content"]) for c, a in zip(completions, answer)]


def position_logp(position: int) -> float:
    return -0.01 * (position + 1)


def positions_of(old_log_probs) -> set[int]:
    return {round(-x / 0.01) - 1 for x in old_log_probs}


class StreamWorker(AsyncRolloutWorker):
    """TRL's rollout worker whose rollout process is this process, generating when the trainer reads the queue.
    Groups complete in pairs, the later first (out of order, as in-flight generations complete)."""

    def __init__(self):  # TRL's __init__ needs vLLM; only what the trainer and set_stream_start read
        self._loop_cls, self._loop_kwargs, self._process = RLVRRolloutLoop, {"dataset_start_index": 0}, None
        self.rollout_buffer, self.metrics_queue = self, queue.Queue()
        self.version, self.taken, self._rows = 0, [], iter(())

    def start(self):
        from accelerate.state import PartialState

        PartialState()
        loop = object.__new__(RLVRRolloutLoop)  # what _repeat_iterator and _score_group read
        loop.dataset, loop.num_generations = self.dataset, G
        loop.rlvr_stream, loop.rlvr_scoring = self._loop_kwargs["rlvr_stream"], GroupScoring((1.0,), dynamic_sampling=True, success=0)
        loop.reward_funcs, loop.reward_func_names = [correct], ["correct"]
        loop._env_reward_types, loop._provides_rollout_reward = [], False
        loop._metrics_queue, loop._counters, loop._rates = self.metrics_queue, {}, {}
        self._rows = self._produce(loop)

    def _produce(self, loop):
        prompts = loop._repeat_iterator()
        while True:
            pair = []
            for _ in range(2):
                takes = [next(prompts) for _ in range(G)]
                assert len({p for p, _ in takes}) == 1  # a prompt's generations come together
                pair.append(takes[0])
                self.taken.append(takes[0][0])
            for position, row in reversed(pair):
                yield from asyncio.run(loop._score_group(self._group(position, row)))

    def _group(self, position, row):
        texts = [row["answer"] if row["all_right"] or i % 2 == 0 else "wrong" for i in range(G)]
        logp = position_logp(position)
        seqs = [[TrainingSequence([5, 6, 7 + i], [0, 1, 1], [0.0, logp, logp], f"r{position}-{i}")] for i in range(G)]
        return RolloutGroup(prompts=[[{"role": "user", "content": row["prompt"]}]] * G,
                            reward_kwargs={"answer": [row["answer"]] * G},
                            completions=[[{"role": "assistant", "content": t}] for t in texts],
                            completions_ids=[[7, 8]] * G, completions_sequences=seqs, tool_call_counts=[0] * G,
                            tool_failure_counts=[0] * G, model_version=self.version, group_id=position,
                            env_rewards=[None] * G, rollout_rewards=[None] * G)

    def get(self, timeout=None):
        return next(self._rows)

    def qsize(self):
        return 0

    def stop(self): ...
    def check_health(self, stale_after_s): ...

    def update_model_version(self, model_version):
        self.version = model_version


def run(model_dir, output_dir, resume=None):
    """A trainer on the stream worker; (trainer, worker, [(step, positions trained by one micro-batch)])."""
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast

    dataset = Dataset.from_dict({"prompt": [f"p{i}" for i in range(N_PROMPTS)],
                                 "answer": [str(i) for i in range(N_PROMPTS)],
                                 "all_right": [i in ZERO_SIGNAL for i in range(N_PROMPTS)]})
    args = RLVRAsyncConfig(output_dir=str(output_dir), bf16=False, use_cpu=True, max_steps=6, save_steps=3,
                           report_to=[], token_budget=0, per_device_train_batch_size=3, num_generations=G,
                           gradient_checkpointing=False, max_completion_length=16, logging_steps=1,
                           max_staleness=100)
    worker = StreamWorker()
    worker.dataset = dataset
    trainer = RLVRAsyncTrainer(model=str(model_dir), reward_funcs=[correct], args=args, train_dataset=dataset,
                               processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir),
                               rollout_worker=worker, weight_transfer=StubTransfer())
    trained = []
    compute_loss = trainer.compute_loss

    def recording(model, inputs, *a, **k):
        selected = inputs["token_index"] >= 0
        trained.append((trainer.state.global_step, positions_of(inputs["old_log_probs"][selected].tolist())))
        return compute_loss(model, inputs, *a, **k)

    trainer.compute_loss = recording
    trainer.add_callback(TakenAtSave(worker))
    trainer.train(resume_from_checkpoint=resume)
    return trainer, worker, trained


class TakenAtSave(TrainerCallback):
    """The stream positions the rollout process had taken when each checkpoint was written."""

    def __init__(self, worker):
        self.worker = worker
        worker.taken_at_save = {}

    def on_save(self, args, state, control, **kwargs):
        self.worker.taken_at_save[state.global_step] = list(self.worker.taken)


def test_a_resumed_run_trains_the_untrained_prompts_once_in_order(tiny_model_dir, tmp_path):
    first, first_worker, first_trained = run(tiny_model_dir, tmp_path)
    checkpoint = os.path.join(tmp_path, "checkpoint-3")
    with open(os.path.join(checkpoint, trainer_module.ASYNC_STREAM_STATE_FILE)) as f:
        saved = json.load(f)
    # the run went on after its checkpoint (a crash there loses those steps): resume from the checkpoint
    before = set().union(*(p for step, p in first_trained if step < 3))
    after_checkpoint = set().union(*(p for step, p in first_trained if step >= 3))
    second, worker, second_trained = run(tiny_model_dir, tmp_path / "resumed", resume=checkpoint)
    resumed = [p for _, ps in second_trained for p in sorted(ps)]

    # the cases that matter are there: a group settled out of order, a group straddling the checkpoint's step
    assert saved["settled_after"] and before & after_checkpoint
    # prompts generated ahead (queued, prefetched) when the checkpoint was written are not settled in it
    ahead = set(first_worker.taken_at_save[3]) - before - {p for p in range(100) if p % N_PROMPTS in ZERO_SIGNAL}
    assert ahead and not ahead & (set(range(saved["next_position"])) | set(saved["settled_after"]))
    # the resumed stream: from the checkpoint's position, in order, without the settled positions
    assert worker.taken[0] == saved["next_position"] and worker.taken == sorted(worker.taken)
    assert not set(worker.taken) & set(saved["settled_after"])
    # each group trained in one segment only; none skipped: every position below the resumed run's end position
    # (out-of-order completions may be in flight past it) was trained before or after the checkpoint, or dropped
    assert not before & set(resumed)
    end = second.stream_ledger.next_position
    assert end >= saved["next_position"] + 5
    dropped = {p for p in range(end) if p % N_PROMPTS in ZERO_SIGNAL}
    assert (before | set(resumed) | dropped) >= set(range(end))
    assert not dropped & (before | set(resumed))
    # what the first run trained after its checkpoint is trained again after the resume (the crash lost it)
    assert after_checkpoint & set(resumed)
    assert second.stream_ledger.groups_trained == saved["groups_trained"] + len(set(resumed))
    assert second._groups_before_resume == saved["groups_trained"]
    assert not math.isnan(second.state.log_history[-1].get("train_loss", 0.0))


def test_trls_worker_spawns_the_loop_at_the_stream_start():
    import pickle

    from trl_rlvr._compat.async_adapter import set_stream_start, use_rlvr_scoring

    worker = object.__new__(AsyncRolloutWorker)  # its __init__ needs vLLM installed
    worker._process, worker._loop_kwargs = None, {"dataset_start_index": 0}
    worker._loop_cls = type(worker)._loop_cls  # TRL's loop: it takes no stream start
    start = StreamStart(5, frozenset({7}))
    assert not set_stream_start(worker, start) and "rlvr_stream" not in worker._loop_kwargs
    use_rlvr_scoring(worker, GroupScoring((1.0,)))
    assert set_stream_start(worker, start)
    assert pickle.loads(pickle.dumps(worker._loop_kwargs))["rlvr_stream"] == start  # what start() checks
    worker._process = object()  # started: the stream start would not reach the running process
    assert not set_stream_start(worker, StreamStart())
    # every rank decides alike: rank 0 builds TRL's worker when none is passed, the others hold none
    from trl_rlvr.async_grpo.async_trainer import keeps_stream_position

    assert keeps_stream_position(None, None) and not keeps_stream_position(None, worker)


def test_a_checkpoint_without_the_stream_position(tmp_path, caplog):
    """TRL's checkpoint (its rollout_state.json) resumes at its prompt_index, with a warning; none at all: prompt 0."""
    from trl_rlvr.async_grpo.async_trainer import load_stream_ledger

    assert load_stream_ledger(None).start() == load_stream_ledger(str(tmp_path)).start() == StreamStart()
    (tmp_path / "rollout_state.json").write_text(json.dumps({"prompt_index": 12, "model_version": 3}))
    with caplog.at_level("WARNING"):
        assert load_stream_ledger(str(tmp_path)).start() == StreamStart(12)
    assert "restarts at prompt 12 (TRL's rollout_state.json)" in caplog.text
    (tmp_path / trainer_module.ASYNC_STREAM_STATE_FILE).write_text(json.dumps(
        {"next_position": 4, "settled_after": [6], "groups_trained": 3}))
    assert load_stream_ledger(str(tmp_path)).start() == StreamStart(4, frozenset({6}))
