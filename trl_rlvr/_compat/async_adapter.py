"""Every private piece of TRL 1.16's asynchronous GRPO trainer (``trl.experimental.async_grpo``) that
:class:`trl_rlvr.async_grpo.RLVRAsyncTrainer` touches, in one module (the synchronous adapter is separate).

The contract is :data:`trl_rlvr._compat.trl_contract.ASYNC_ADAPTER`: for each piece below (and each override of
``RLVRAsyncTrainer``), the private TRL names it relies on and the TRL methods that must still use them, checked
against the installed TRL by ``async_contract_violations`` (``pytest -m trl_contract``). In short:

- ``_AsyncRolloutLoop._score_group`` (the spawned rollout process scores a group): :class:`RLVRRolloutLoop` calls it,
  then sets the RLVR advantages on the rows it returns (:func:`trl_rlvr.async_grpo.rescore.rescore_rows`); reads the
  loop's ``reward_func_names`` and ``_push_metrics``;
- ``AsyncRolloutWorker._loop_cls`` / ``_loop_kwargs`` (what the worker spawns, read at ``start()``): pointed at
  :class:`RLVRRolloutLoop` with its ``rlvr_scoring`` by :func:`use_rlvr_scoring`;
- the packed batch ``AsyncGRPOTrainer.compute_loss`` reads (keys ``attention_mask``, ``token_index``,
  ``input_ids``, ``position_ids``, ``shift_labels``, ``old_log_probs``, ``advantages``, ``segment_id``, ``tree_*``)
  and its forward with ``fused_lm_head=True``: :func:`packed_forward`, the same steps;
- the trainer's per-step accounting fields (``_step_*``, ``_last_forward_time_s``) its step metrics read:
  :func:`record_step_accounting`, the same arithmetic;
- ``async_grpo_trainer.get_peak_flops_per_device`` calls ``torch.cuda`` unconditionally: :func:`cpu_constructible`
  stands in for it (NaN: unknown) while a trainer is built on a machine without CUDA;
- ``async_grpo_trainer.WeightTransferClient`` (the NCCL weight sync TRL builds when no ``weight_transfer`` is given;
  NCCL needs CUDA): :func:`cpu_constructible` builds :class:`FileWeightTransfer` in its place without CUDA, with the
  same arguments (its ``weight_update_info`` manifest: names, dtype names, shapes);
- the trainer's ``_rollout_dataset`` (TRL's ``RolloutQueueDataset``: its ``queue`` and per-row ``max_staleness``
  check): :func:`admit_groups_whole` puts a group filter between it and the queue (:class:`AdmittingQueue`);
- each row's generating ``model_version`` to the loss: :class:`AdmittingQueue` adds it to the row's ``metrics`` (the
  one per-sample field ``RolloutQueueDataset`` passes on to the collator), and :func:`carry_row_versions` wraps
  the dataloader's ``collate_fn`` (``DataCollatorForRollout``) to take it out again and add it to the packed batch (``row_model_version``: per rank, each
  packed sample's version, in ``TreeRow.samples`` order, which ``segment_id`` indexes); :func:`row_model_versions`
  reads it at the loss; ``model_version`` counts weight syncs on the main process only:
  :func:`trained_model_version` broadcasts it;
- ``packing.TREE_ATTENTION``, the attention TRL's model runs with, is FlashAttention-3 from the Hub (GPU only):
  :func:`use_cpu_tree_attention` registers :func:`cpu_tree_attention`, the same computation in plain PyTorch, under
  that name on a machine without CUDA; it needs TRL's packed rows, so a plain forward or ``generate()`` of the
  trainer's model (a held-out evaluation) runs under :func:`plain_attention`.

The prompt stream's position (:mod:`trl_rlvr.sampling.stream_ledger`, docs/dynamic_sampling.md):

- ``_AsyncRolloutLoop._repeat_iterator`` (the prompts the rollout process generates, ``(group_id, row)`` per
  generation): :class:`RLVRRolloutLoop` with ``rlvr_stream`` replaces it by the stream from a
  :class:`~trl_rlvr.sampling.stream_ledger.StreamStart`, the group id being the stream position, and queues a
  :func:`dropped_group_marker` for a group that leaves no row (read by :class:`AdmittingQueue`, never trained);
  ``AsyncRolloutWorker._loop_kwargs["rlvr_stream"]``: :func:`set_stream_start`;
- the trainer's dataloader's ``collate_fn`` (TRL's ``DataCollatorForRollout``, one micro-batch of ``TreeRow``s
  whose ``samples`` carry ``group_id``): :func:`record_collated_groups`;
- ``AsyncGRPOTrainer._groups_before_resume`` (its epoch count across a resume): :func:`restore_epoch_count`.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import threading
import time
from collections import deque
from typing import NamedTuple

import numpy as np
import torch
from trl.experimental.async_grpo import async_grpo_trainer as _trainer_module
from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker, RolloutSample, _AsyncRolloutLoop
from trl.experimental.async_grpo.packing import TREE_ATTENTION

from trl_rlvr._compat.vllm_server import check_file_weight_sync, make_weights_dir, push_weights_file
from trl_rlvr.async_grpo.rescore import GroupScoring, rescore_rows
from trl_rlvr.sampling.stream_ledger import StreamStart, stream_positions


class RLVRRolloutLoop(_AsyncRolloutLoop):
    """TRL's rollout loop whose groups get the RLVR advantages (and, with dynamic sampling, only informative groups
    are queued)."""

    rlvr_scoring: GroupScoring | None = None
    rlvr_stream: StreamStart | None = None  # None: TRL's prompt order and group ids

    def __init__(self, *, rlvr_scoring: GroupScoring | None = None, rlvr_stream: StreamStart | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.rlvr_scoring = rlvr_scoring
        self.rlvr_stream = rlvr_stream

    def _repeat_iterator(self):
        # with rlvr_stream: TRL's order (the dataset pass after pass, each prompt num_generations times), from the
        # stream's start, skipping the positions already settled; the group id is the stream position
        if self.rlvr_stream is None:
            yield from super()._repeat_iterator()
            return
        for position in stream_positions(self.rlvr_stream):
            row = self.dataset[position % len(self.dataset)]
            for _ in range(self.num_generations):
                yield position, row

    async def _score_group(self, group):
        logged = RewardMetrics()
        if self.rlvr_scoring is not None:  # the reward plugins' counters, as TRL's synchronous trainer passes them
            group.reward_kwargs = {**group.reward_kwargs, "log_metric": logged}
        samples = await super()._score_group(group)
        if self.rlvr_scoring is not None:
            rows = [len(sequences) for sequences in group.completions_sequences]
            samples, metrics = rescore_rows(samples, rows, list(self.reward_func_names), self.rlvr_scoring,
                                            answers=answer_facts(self, group))
            self._push_metrics({**logged.values, **metrics})
        if self.rlvr_stream is not None and not samples:
            return [dropped_group_marker(group.group_id, group.model_version)]
        return samples


class RewardMetrics:
    """The ``log_metric(name, value)`` keyword TRL's synchronous trainer gives reward functions (the plugins report
    their counters through it, ``<reward>/<counter>`` per call): kept for one group, summed per name. Reward
    functions run in threads (``asyncio.to_thread``), hence the lock."""

    def __init__(self):
        self.values: dict[str, float] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str, value: float) -> None:
        with self._lock:
            self.values[name] = self.values.get(name, 0.0) + float(value)


def answer_facts(loop, group) -> dict:
    """Per answer of a TRL ``RolloutGroup``: completion tokens (its token stream: with tools, tool results counted),
    truncated (no stop token at its end, as ``RLVRTrainer`` counts it) and, with tools, tool calls."""
    stop_ids = set(getattr(loop, "eos_token_ids", None) or ())
    ids = group.completions_ids
    return {"lengths": [len(x) for x in ids], "truncated": [bool(x) and x[-1] not in stop_ids for x in ids],
            "tool_calls": list(group.tool_call_counts) if getattr(loop, "tools", None) else None}


#: The metrics key that marks a queued sample as the notice of a group that left no row to train.
DROPPED_GROUP = "rlvr/dropped_group"


def dropped_group_marker(group_id: int, model_version: int) -> RolloutSample:
    """What the rollout process queues for a group that leaves no row (dropped by dynamic sampling, or nothing
    trainable), so that the trainer settles its stream position (:class:`AdmittingQueue` reads it, never trains it)."""
    empty = np.zeros(0, dtype=np.int64)
    return RolloutSample(prompt=[], completion=[], input_ids=empty, completion_mask=empty,
                         old_log_probs=np.zeros(0, dtype=np.float32), advantage=0.0, model_version=model_version,
                         group_id=group_id, metrics={"reward": math.nan, DROPPED_GROUP: 1.0})


def is_dropped_group_marker(sample) -> bool:
    return DROPPED_GROUP in getattr(sample, "metrics", {})


def use_rlvr_scoring(rollout_worker, scoring: GroupScoring, loop_cls: type = RLVRRolloutLoop, **loop_kwargs) -> bool:
    """Make TRL's own rollout worker spawn ``loop_cls`` (:class:`RLVRRolloutLoop` or a subclass, given
    ``loop_kwargs`` too) with ``scoring``; True if it did. Another worker (one passed as ``rollout_worker``, or None
    off rank 0) or one already started is left as it is."""
    if type(rollout_worker) is not AsyncRolloutWorker or getattr(rollout_worker, "_process", None) is not None:
        return False
    rollout_worker._loop_cls = loop_cls
    rollout_worker._loop_kwargs.update(rlvr_scoring=scoring, **loop_kwargs)
    return True


class FileWeightTransfer:
    """TRL's ``WeightTransferProtocol`` for a trainer without CUDA: the weights go to the vLLM server through a
    safetensors file that every server worker reloads in place (server mode's CPU push,
    :mod:`trl_rlvr._compat.vllm_server`), between TRL's ``/pause`` (in-flight requests kept) and ``/resume``.

    Built as TRL builds its ``WeightTransferClient``; the server must run ``python -m trl_rlvr.scripts.vllm_serve``
    (its reload extension) on this machine. ``pushes``: how many pushes went through; ``last_push``: the last one's
    bytes and seconds."""

    def __init__(self, vllm_client, weight_update_info: dict, weight_sync_timeout: int = 1800):
        self.vllm = vllm_client
        self.weight_sync_timeout = weight_sync_timeout
        self.metadata = list(zip(weight_update_info["names"], weight_update_info["dtype_names"],
                                 weight_update_info["shapes"], strict=True))
        self.file_dir: str | None = None
        self.pushes, self.last_push = 0, None

    def init_weight_transfer(self) -> None:
        """Wait for the server, then check that its workers reload from this machine's files."""
        self.vllm.wait_for_server_ready()
        self.file_dir = make_weights_dir()
        check_file_weight_sync(self.vllm.server_url, self.file_dir)

    def pause(self) -> None:
        self.vllm.pause(timeout=self.weight_sync_timeout)

    def send_weights(self, iterator) -> None:
        """Stream ``iterator``'s (name, tensor) pairs, in the manifest's order, into the file; the server reloads."""
        if self.file_dir is None:
            raise RuntimeError("FileWeightTransfer.send_weights before init_weight_transfer")
        self.last_push = push_weights_file(self.vllm.server_url, self.file_dir, self.metadata, iterator,
                                           timeout=self.weight_sync_timeout)
        self.pushes += 1

    def resume(self) -> None:
        self.vllm.resume(timeout=self.weight_sync_timeout)

    def destroy(self) -> None:
        if self.file_dir is not None:
            shutil.rmtree(self.file_dir, ignore_errors=True)
            self.file_dir = None


@contextlib.contextmanager
def cpu_constructible():
    """While building the trainer without CUDA, TRL's peak-FLOPs lookup (a CUDA device name) answers NaN and the
    weight sync TRL builds is :class:`FileWeightTransfer` (NCCL needs CUDA)."""
    if torch.cuda.is_available():
        yield
        return
    originals = _trainer_module.get_peak_flops_per_device, _trainer_module.WeightTransferClient
    _trainer_module.get_peak_flops_per_device = lambda *args, **kwargs: float("nan")
    _trainer_module.WeightTransferClient = FileWeightTransfer
    try:
        yield
    finally:
        _trainer_module.get_peak_flops_per_device, _trainer_module.WeightTransferClient = originals


class PackedForward(NamedTuple):
    log_probs: torch.Tensor  # (K,) of the loss tokens, with gradient
    entropy: torch.Tensor  # (K,)
    old_log_probs: torch.Tensor  # (K,) the behaviour policy's (vLLM's)
    advantages: torch.Tensor  # (K,)
    segment_id: torch.Tensor  # (K,) completion of each token in this process's row
    outputs: object  # the model's outputs (aux_loss for MoE models)


def packed_forward(trainer, model, inputs: dict) -> PackedForward:
    """The forward of ``AsyncGRPOTrainer.compute_loss`` on one packed micro-batch, as TRL 1.16 writes it."""
    mask_bool = inputs["attention_mask"].bool()
    selected = inputs["token_index"] >= 0
    tree_kwargs = {key: inputs[key][inputs[key] >= 0]
                   for key in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")}
    tree_kwargs["tree_max_seqlen_q"], tree_kwargs["tree_max_seqlen_k"] = inputs["tree_max_seqlens"][0].tolist()
    router_kwargs = {"output_router_logits": True} if trainer.aux_loss_enabled else {}
    start = time.time()
    outputs = model(input_ids=inputs["input_ids"][mask_bool].unsqueeze(0),
                    position_ids=inputs["position_ids"][mask_bool].unsqueeze(0),
                    shift_labels=inputs["shift_labels"][mask_bool].unsqueeze(0), fused_lm_head=True,
                    **router_kwargs, **tree_kwargs)
    token_index = inputs["token_index"][selected]
    trainer._last_forward_time_s = time.time() - start
    return PackedForward(outputs.log_probs.flatten()[token_index], outputs.entropy.flatten()[token_index],
                         inputs["old_log_probs"][selected], inputs["advantages"][selected],
                         inputs["segment_id"][selected], outputs)


def record_step_accounting(trainer, inputs: dict) -> None:
    """The per-step counts ``AsyncGRPOTrainer.compute_loss`` accumulates for its step metrics (TRL 1.16)."""
    n_forward_tokens = float(inputs["global_n_forward_tokens"][0])
    mean_seq_len = float(inputs["mean_seq_len"][0])
    trainer._step_forward_tokens += n_forward_tokens
    trainer._step_trained_tokens += float(inputs["global_n_tokens"][0])
    trainer._step_seq_len_weighted += mean_seq_len * n_forward_tokens
    trainer._step_samples += n_forward_tokens / mean_seq_len
    trainer._step_forward_s += trainer._last_forward_time_s


def cpu_tree_attention(module, query, key, value, attention_mask, *, tree_kv_index, tree_cu_seqlens_q,
                       tree_cu_seqlens_k, tree_max_seqlen_q=None, tree_max_seqlen_k=None, scaling=None,
                       sliding_window=None, softcap=None, **kwargs):
    """TRL's tree attention (``packing.tree_attention``) without FlashAttention: segment ``s``'s queries (packed
    positions ``cu_q[s]:cu_q[s+1]``) attend causally, aligned at the end, to the keys of its root-to-segment path
    (``tree_kv_index[cu_k[s]:cu_k[s+1]]``), as ``flash_attn_varlen_func(causal=True)`` does. (1, L, H, D) out."""
    q = query[0]  # (H, L, D)
    k = key[0].index_select(1, tree_kv_index)  # (H_kv, K, D)
    v = value[0].index_select(1, tree_kv_index)
    if k.shape[0] != q.shape[0]:  # grouped-query attention
        k, v = (x.repeat_interleave(q.shape[0] // x.shape[0], dim=0) for x in (k, v))
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    cu_q, cu_k = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist()
    out = q.new_empty(q.shape[1], q.shape[0], q.shape[2])  # (L, H, D)
    for s in range(len(cu_q) - 1):
        qs, ks, vs = q[:, cu_q[s]:cu_q[s + 1]], k[:, cu_k[s]:cu_k[s + 1]], v[:, cu_k[s]:cu_k[s + 1]]
        n_q, n_k = qs.shape[1], ks.shape[1]
        scores = (qs.float() @ ks.float().transpose(1, 2)) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        rows = torch.arange(n_q, device=q.device)[:, None] + (n_k - n_q)
        cols = torch.arange(n_k, device=q.device)[None, :]
        allowed = cols <= rows
        if sliding_window:
            allowed &= cols > rows - sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[cu_q[s]:cu_q[s + 1]] = (torch.softmax(scores, dim=-1) @ vs.float()).to(q.dtype).transpose(0, 1)
    return out.unsqueeze(0), None


def use_cpu_tree_attention() -> bool:
    """On a machine without CUDA, run TRL's tree attention name with :func:`cpu_tree_attention`; True if it did.
    (TRL registers its FlashAttention-3 version when a trainer is built: call this after.)"""
    if torch.cuda.is_available():
        return False
    from transformers import AttentionInterface

    AttentionInterface.register(TREE_ATTENTION, cpu_tree_attention)
    return True


@contextlib.contextmanager
def plain_attention(model, implementation: str = "sdpa"):
    """``model`` (the trainer's, built with TRL's tree attention) with ``implementation`` while the block runs, for
    a plain forward or ``generate()`` (the tree attention reads TRL's packed rows); TRL's attention again after."""
    before = model.config._attn_implementation
    if before != TREE_ATTENTION:
        yield model
        return
    model.set_attn_implementation(implementation)
    try:
        yield model
    finally:
        model.set_attn_implementation(before)


class AdmittingQueue:
    """The rollout queue as TRL's ``RolloutQueueDataset`` reads it (``get(timeout=)``, ``qsize()``), passing only the
    rows :meth:`trl_rlvr.sampling.group_filter.GroupFilter.admit_row` admits: a group trained whole or not at all.
    With a ``ledger`` (:class:`~trl_rlvr.sampling.stream_ledger.StreamLedger`), a group refused whole or announced
    by a :func:`dropped_group_marker` is settled there as dropped."""

    def __init__(self, inner, group_filter, model_version_fn, ledger=None):
        self.inner, self.group_filter, self.model_version_fn = inner, group_filter, model_version_fn
        self.ledger = ledger

    def get(self, timeout=None):
        while True:
            sample = self.inner.get(timeout=timeout)  # queue.Empty passes through: TRL's health check runs on it
            if is_dropped_group_marker(sample):
                self._settle_dropped(sample.group_id)
                continue
            if self.group_filter.admit_row(sample.group_id, sample.model_version, self.model_version_fn()):
                # the row's version rides in its metrics to the collator (carry_row_versions takes it out)
                sample.metrics = {**sample.metrics, ROW_VERSION_KEY: sample.model_version}
                return sample
            if self.group_filter.admitted(sample.group_id) is False:
                self._settle_dropped(sample.group_id)

    def _settle_dropped(self, group_id: int) -> None:
        if self.ledger is not None:
            self.ledger.settle(group_id, trained=False)

    def qsize(self) -> int:
        return self.inner.qsize()


def admit_groups_whole(trainer, group_filter, ledger=None) -> bool:
    """Between the trainer's ``RolloutQueueDataset`` (rank 0) and its queue, ``group_filter``'s group admission (at
    least as strict as the dataset's own per-row check, which stays); ``ledger``: the prompt stream's record of
    settled groups. True if installed (False off rank 0, before the dataloader exists)."""
    dataset = getattr(trainer, "_rollout_dataset", None)
    if dataset is None:
        return False
    dataset.queue = AdmittingQueue(dataset.queue, group_filter, dataset.model_version_fn, ledger)
    return True


#: The key of a row's ``model_version`` in its ``metrics``, between :class:`AdmittingQueue` and the collator.
ROW_VERSION_KEY = "rlvr/_row_model_version"
#: The packed batch's key of each packed sample's ``model_version``: (num_processes, samples of the longest row).
ROW_VERSIONS = "row_model_version"


def carry_row_versions(dataloader) -> None:
    """Have the dataloader's collate function (TRL's ``DataCollatorForRollout``, or a wrapper of it) add
    :data:`ROW_VERSIONS` to each packed batch, taking each row's version out of its ``metrics`` first (so TRL's
    collator metrics do not see it). Padded with -1. (accelerate's dispatcher iterates the ``base_dataloader`` it
    wraps.)"""
    dataloader = getattr(dataloader, "base_dataloader", dataloader)
    inner = dataloader.collate_fn

    def collate_with_versions(examples):
        (rows,) = examples
        versions = []
        for row in rows:
            versions.append([])
            for sample in row.samples:
                metrics = dict(sample["metrics"])
                versions[-1].append(int(metrics.pop(ROW_VERSION_KEY)))  # a row that skipped the admission: KeyError
                sample["metrics"] = metrics
        batch = inner(examples)
        width = max(len(v) for v in versions)
        batch[ROW_VERSIONS] = torch.tensor([v + [-1] * (width - len(v)) for v in versions], dtype=torch.long)
        return batch

    dataloader.collate_fn = collate_with_versions


def row_model_versions(inputs: dict) -> torch.Tensor:
    """(S,) this process's packed samples' generating ``model_version``, which ``segment_id`` indexes."""
    if ROW_VERSIONS not in inputs:
        raise KeyError(f"the packed batch has no {ROW_VERSIONS!r}: its rows' versions did not reach the loss "
                       "(carry_row_versions not installed on the collator)")
    return inputs[ROW_VERSIONS][0]


def trained_model_version(trainer) -> int:
    """The weights being trained, as a ``model_version``: TRL counts weight syncs on the main process only (the other
    processes keep 0), so the main process's count, broadcast (a collective: every process calls it)."""
    if trainer.accelerator.num_processes == 1:
        return int(trainer.model_version)
    from accelerate.utils import broadcast

    version = torch.tensor([int(trainer.model_version)], device=trainer.accelerator.device)
    return int(broadcast(version, from_process=0).item())


# -- the prompt stream's position ----------------------------------------------------------------------------------

def set_stream_start(rollout_worker, start: StreamStart) -> bool:
    """Make TRL's rollout worker start its :class:`RLVRRolloutLoop` at ``start`` when it spawns; True if it will
    (False for another worker or loop, or a worker already started)."""
    if not isinstance(rollout_worker, AsyncRolloutWorker) or getattr(rollout_worker, "_process", None) is not None:
        return False
    if not issubclass(getattr(rollout_worker, "_loop_cls", _AsyncRolloutLoop), RLVRRolloutLoop):
        return False
    rollout_worker._loop_kwargs["rlvr_stream"] = start
    return True


def record_collated_groups(dataloader, collated: deque) -> None:
    """Append, for every micro-batch the trainer's dataloader collates (rank 0, in order), the set of its rows'
    ``group_id`` to ``collated``; the trainer takes them off as it trains them. (accelerate's dispatcher iterates
    the ``base_dataloader`` it wraps.)"""
    dataloader = getattr(dataloader, "base_dataloader", dataloader)
    inner = dataloader.collate_fn

    def collate(examples):
        (rows,) = examples  # TRL's planners emit one micro-batch of TreeRows per item (batch_size=1)
        collated.append({int(sample["group_id"]) for row in rows for sample in row.samples})
        return inner(examples)

    dataloader.collate_fn = collate


def restore_epoch_count(trainer, groups_trained: int) -> None:
    """TRL's epoch stop counts the groups trained before a resume (``_groups_before_resume``) plus those since."""
    trainer._groups_before_resume = groups_trained
