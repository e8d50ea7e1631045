"""RLVRAsyncTrainer against a real vLLM server on a CPU, recording what tests/engines/test_async_server.py checks.

    python -m tests.harness.async_server_harness MODEL_DIR OUT BASE_URL [key=value ...]

(under ``accelerate launch`` for several processes: every rank writes ``OUT.rank{r}.pt``). What is recorded:

- ``generations``: each ``/v1/completions`` request of TRL's rollout process, ``(start, end)`` in ``time.time()``
  (:class:`RecordingLoop`, spawned in place of :class:`RLVRRolloutLoop`);
- ``steps``: each optimizer step's compute on this rank, ``(start, end)``: from ``on_step_begin`` (its micro-batches
  already fetched) to ``on_optimizer_step`` (the weight sync, in ``on_step_end``, is after it);
- ``losses`` (rank 0): each micro-batch at the loss, the trainer's ``model_version`` then and every row's
  ``(group_id, model_version of its group, prompt index, lag at its group's first dequeue, reward, the row's own
  model_version, the trainer's model_version when the row was read from the queue)``: the rows are those the
  collator packed, in order (a micro-batch the dispatcher fetched ahead but never trained is left unmatched, at the
  end);
- ``loss_lags`` (every rank): each micro-batch at this rank's loss, after the staleness bound weighed out the rows
  over it: the version of the weights trained (``trained_version``), the lag of every token that kept its weight
  (``token_lags``) and the rows weighed out (``masked_rows``);
- ``pushes`` (rank 0): the file pushes to the server; ``served_norm_equal``: the served ``model.norm.weight`` equals
  the trainer's after training; ``norm_moved``: how far training moved it.

The reward makes zero-signal groups: prompt ``q{i}`` scores 1 for every answer when ``i % 3 == 0``, 0 when
``i % 3 == 1``, and the parity of the answer's token-id sum when ``i % 3 == 2`` (mixed, mostly).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

import torch
from transformers import TrainerCallback

from trl_rlvr._compat.async_adapter import ROW_VERSION_KEY, RLVRRolloutLoop, row_model_versions, trained_model_version

NORM = "model.norm.weight"
PROMPTS = 12


def parity_reward(completion_ids, index, **kwargs):
    """1/0 by prompt for ``index % 3`` in {0, 1} (zero-signal groups), the token-id sum's parity otherwise."""
    return [1.0 if i % 3 == 0 else 0.0 if i % 3 == 1 else float(sum(ids) % 2 == 0)
            for ids, i in zip(completion_ids, index, strict=True)]


def zero_signal_prompt(index: int) -> bool:
    return index % 3 != 2


class RecordingLoop(RLVRRolloutLoop):
    """The RLVR rollout loop; each generation request's start and end appended to ``record_path`` (JSON lines)."""

    def __init__(self, *, record_path: str, **kwargs):
        super().__init__(**kwargs)
        self.record_path = record_path

    async def _generate_one_turn(self, prompt_ids):
        start = time.time()
        result = await super()._generate_one_turn(prompt_ids)
        with open(self.record_path, "a") as file:
            file.write(json.dumps([start, time.time()]) + "\n")
        return result


class StepTimes(TrainerCallback):
    def __init__(self):
        self.steps, self._start = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.time()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.steps.append((self._start, time.time()))


#: A row's ``model_version`` when it was read, in its metrics between the queue and the collator (taken out there).
READ_KEY = "harness/read_version"


class VersionRecordingQueue:
    """The trainer's (admitting) queue, remembering each admitted row's group: its version, prompt index, and its
    lag when its first row was dequeued (the trainer's ``model_version`` then minus the group's); and each row's
    read version (``READ_KEY`` in its metrics)."""

    def __init__(self, inner, model_version_fn, groups: dict):
        self.inner, self.model_version_fn, self.groups = inner, model_version_fn, groups

    def get(self, timeout=None):
        sample = self.inner.get(timeout=timeout)
        sample.metrics = {**sample.metrics, READ_KEY: self.model_version_fn()}
        if sample.group_id not in self.groups:
            self.groups[sample.group_id] = (sample.model_version, int(sample.prompt[-1]["content"][1:]),
                                            self.model_version_fn() - sample.model_version)
        return sample

    def qsize(self):
        return self.inner.qsize()


def build(model_dir: str, out: str, base_url: str, **overrides):
    from datasets import Dataset

    from trl_rlvr.async_grpo import RLVRAsyncConfig, RLVRAsyncTrainer
    from trl_rlvr.testing import load_tool_tokenizer

    settings = dict(output_dir=out, bf16=False, use_cpu=True, max_steps=6, report_to=[], token_budget=0,
                    per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_staleness=1,
                    gradient_checkpointing=False, learning_rate=5e-2, logging_steps=1, save_strategy="no",
                    dynamic_sampling=True, vllm_server_base_url=base_url, temperature=1.0)
    settings.update(overrides)
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(PROMPTS)],
                                 "index": list(range(PROMPTS))})
    return RLVRAsyncTrainer(model=model_dir, reward_funcs=[parity_reward], args=RLVRAsyncConfig(**settings),
                            train_dataset=dataset, processing_class=load_tool_tokenizer(model_dir))


def record_losses(trainer, record: dict) -> None:
    """On rank 0: each micro-batch's rows, as the collator packs them, matched in order with the loss that trains
    them (``record["losses"]``)."""
    groups, packed = {}, collections.deque()
    get_train_dataloader, compute_loss = trainer.get_train_dataloader, trainer.compute_loss

    def recording_dataloader():
        dataloader = get_train_dataloader()
        dataset = trainer._rollout_dataset  # TRL's RolloutQueueDataset (rank 0), its queue our admitting one
        dataset.queue = VersionRecordingQueue(dataset.queue, dataset.model_version_fn, groups)
        base = getattr(dataloader, "base_dataloader", dataloader)  # accelerate's dispatcher iterates it
        collate = base.collate_fn

        def recording_collate(examples):
            rows = []
            for row in examples[0]:
                for e in row.samples:
                    metrics = dict(e["metrics"])
                    read = metrics.pop(READ_KEY)
                    rows.append((e["group_id"], metrics["reward"], metrics[ROW_VERSION_KEY], read))
                    e["metrics"] = metrics
            packed.append(rows)
            return collate(examples)

        base.collate_fn = recording_collate
        return dataloader

    def recording_compute_loss(model, inputs, *args, **kwargs):
        rows = packed.popleft()
        record["losses"].append({"trainer_version": trainer.model_version, "time": time.time(),
                                 "rows": [(group, *groups[group], reward, version, read)
                                          for group, reward, version, read in rows]})
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.get_train_dataloader, trainer.compute_loss = recording_dataloader, recording_compute_loss


def record_loss_lags(trainer, record: dict) -> None:
    """On every rank: what the loss kept of each micro-batch (``record["loss_lags"]``)."""
    weigh_out = trainer._weigh_out_stale_rows

    def recording_weigh_out(fwd, inputs):
        kept, masked_rows = weigh_out(fwd, inputs)
        version = trained_model_version(trainer)  # a collective, as in the loss: every rank calls it
        lags = version - row_model_versions(inputs)[kept.segment_id]
        record["loss_lags"].append({"trained_version": version, "token_lags": lags.tolist(),
                                    "masked_rows": masked_rows})
        return kept, masked_rows

    trainer._weigh_out_stale_rows = recording_weigh_out


def norm_weight(model) -> torch.Tensor:
    return next(p for n, p in model.named_parameters() if n.endswith(NORM)).detach().clone()


def run(model_dir: str, out: str, base_url: str, **overrides) -> dict:
    """Train; return the record (module docstring)."""
    from trl_rlvr._compat.async_adapter import use_rlvr_scoring
    from trl_rlvr._compat.vllm_server import served_parameter_matches

    trainer = build(model_dir, out, base_url, **overrides)
    rank, main = trainer.accelerator.process_index, trainer.accelerator.is_main_process
    record = {"rank": rank, "num_processes": trainer.accelerator.num_processes, "losses": [], "generations": [],
              "loss_lags": [], "token_budget": trainer.args.token_budget,
              "max_staleness": trainer.args.max_staleness, "num_generations": trainer.args.num_generations}
    generations_path = f"{out}.generations.rank{rank}.jsonl"
    if main:
        assert use_rlvr_scoring(trainer.rollout_worker, trainer.group_scoring, RecordingLoop,
                                record_path=generations_path)
        record_losses(trainer, record)
        record["weight_transfer"] = type(trainer.weight_transfer).__name__
    record_loss_lags(trainer, record)
    steps = StepTimes()
    trainer.add_callback(steps)
    initial = norm_weight(trainer.model)
    started, threads = time.time(), torch.get_num_threads()
    torch.set_num_threads(1)  # the server computes on the same cores: more threads here only contend with it
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    record["train_s"] = time.time() - started
    record["steps"] = steps.steps
    record["log_history"] = trainer.state.log_history
    final = norm_weight(trainer.model)
    record["norm_moved"] = (final - initial).abs().max().item()
    if main:
        with open(generations_path) as file:
            record["generations"] = [tuple(json.loads(line)) for line in file]
        record["pushes"] = trainer.weight_transfer.pushes
        record["last_push"] = trainer.weight_transfer.last_push
        record["served_norm_equal"] = served_parameter_matches(base_url, NORM, final)
    return record


def main(argv: list[str]) -> None:
    model_dir, out, base_url, *pairs = argv
    overrides = {}
    for pair in pairs:
        key, value = pair.split("=", 1)
        overrides[key] = json.loads(value)
    record = run(model_dir, out, base_url, **overrides)
    torch.save(record, f"{out}.rank{record['rank']}.pt")


if __name__ == "__main__":
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    main(sys.argv[1:])
