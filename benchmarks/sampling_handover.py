"""Dynamic sampling's hand-over of kept rows: per-process memory and traffic of a generation batch against the number
of processes, before (every row of every process all-gathered, then filtered) and after (only kept rows move).

    python -m benchmarks.sampling_handover [--processes 1 2 4 8] [--rows 64] [--width 2048] [--batches 3]
        [--json PATH] [--smoke]

Each process count runs as one ``accelerate launch`` of N CPU processes (gloo), as the multi-process tests do. Every
process builds ``RLVRTrainer`` (dynamic_sampling=True) on the tiny test model and runs its round driver's ``generation_batch``
``--batches`` times for each of the two strategies, on synthetic rounds: TRL's generation and scoring is replaced by
rows of TRL's shapes (``--rows`` answers per process, G=4, prompts of 64 tokens, completions up to ``--width``
tokens, process r's ``width - r`` so that padding across processes is exercised; ids, masks, old log-probs), with
random rewards (seeded alike on every process: about half the groups informative, so about two rounds per batch).
Everything after scoring is the trainer's real code: the keep decision, the hand-over, the logging.

- after: the trainer as it is (:mod:`trl_rlvr.sampling.redistribute`);
- before: the same trainer with the all-gather hand-over trl-rlvr had until now (kept here, in
  :class:`AllGatherHandOver`, as the reference): each round pads every row tensor across processes and all-gathers
  it, keeps the informative rows of all processes, and every process slices its share at the end.

Measured per process and generation batch (median over batches, then max and mean over processes):

- bytes received through torch.distributed (all_gather / all_gather_into_tensor / all_reduce / broadcast / irecv /
  recv; an all-gather counts the other processes' parts), the scalars (rewards, widths) included;
- peak memory: the process's resident-set high-water mark during the batch minus its resident set before
  (``/proc/self/clear_refs`` resets the mark), so the row tensors the hand-over holds at its peak.

One unmeasured batch first (first-call allocations). Both strategies must give every process the same rows (checked:
the trained batch of each process is compared).
``--smoke``: 1 and 2 processes, 16 rows of 64 tokens, 1 batch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._status import finish

NAME = "sampling_handover"
GROUP = 4
PROMPT = 64


# ------------------------------------------------------------------------------------------------ worker
def _count_traffic():
    """Wrap torch.distributed's collectives and point-to-point calls; -> a dict whose "bytes" grows by what this
    process receives."""
    import torch.distributed as dist

    counter = {"bytes": 0}

    def size(t):
        return t.numel() * t.element_size()

    def wrap(name, received):
        original = getattr(dist, name)

        def counted(*args, **kwargs):
            counter["bytes"] += received(*args, **kwargs)
            return original(*args, **kwargs)

        setattr(dist, name, counted)

    world = dist.get_world_size() if dist.is_initialized() else 1
    wrap("all_gather", lambda out, t, *a, **k: sum(size(o) for o in out) - size(t))
    wrap("all_gather_into_tensor", lambda out, t, *a, **k: size(out) - size(t))
    wrap("all_reduce", lambda t, *a, **k: size(t) * (world > 1))
    wrap("broadcast", lambda t, *a, **k: size(t) * (world > 1))
    wrap("irecv", lambda t, *a, **k: size(t))
    wrap("recv", lambda t, *a, **k: size(t))
    return counter


def _reset_peak() -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _synthetic_round(trainer, rows: int, width: int, seed: int):
    """A scored round of TRL's shapes for this process, and its record (global rewards alike on every process)."""
    import torch

    from trl_rlvr.algorithms.advantages import group_advantages
    from trl_rlvr.sampling.rounds import RoundRecord

    rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
    generator = torch.Generator().manual_seed(seed)
    informative = torch.rand(world * rows // GROUP, generator=generator) < 0.5
    rewards = torch.where(informative.repeat_interleave(GROUP),
                          torch.randint(0, 2, (world * rows,), generator=generator).float(), torch.ones(world * rows))
    own = torch.Generator().manual_seed(seed * 100 + rank)
    local_width = max(1, width - rank)
    completion_ids = torch.randint(10, 60, (rows, local_width), generator=own)
    record = RoundRecord(
        rewards_per_func=rewards[:, None], rewards=rewards, lengths=torch.full((world * rows,), float(local_width)),
        truncated=torch.zeros(world * rows, dtype=torch.bool), trl_advantages=group_advantages(rewards, GROUP),
        table={"images": [], "prompt": [None] * world * rows, "completion": [None] * world * rows,
               "rewards": {}, "advantages": [], "extra": {}},
    )
    output = {
        "prompt_ids": torch.randint(10, 60, (rows, PROMPT), generator=own),
        "prompt_mask": torch.ones(rows, PROMPT, dtype=torch.long),
        "completion_ids": completion_ids,
        "completion_mask": torch.ones_like(completion_ids),
        "advantages": record.trl_advantages[rank * rows : (rank + 1) * rows].clone(),
        "old_per_token_logps": torch.randn(rows, local_width, generator=own),
        "num_items_in_batch": torch.tensor(float(world * rows * local_width)),
    }
    return output, record


def _synthetic_rounds(trainer, rows: int, width: int):
    """A replacement for the round driver's ``score_round``: synthetic round after synthetic round (seeds 1, 2, ...)."""
    seeds = iter(range(1, 1_000_000))
    return lambda inputs, prompt_indices=None, drops_rows=False: _synthetic_round(trainer, rows, width, next(seeds))


def _all_gather_hand_over(driver) -> None:
    """Turn ``driver`` into the hand-over trl-rlvr had before: every row of every process gathered each round, each
    process then slicing its own rows out of the whole."""
    import torch

    from trl_rlvr.sampling.dynamic import LEFT_PADDED, ROW_KEYS, filler_rows, pad_to_width
    from trl_rlvr.sampling.redistribute import pad_pieces

    pad = {"prompt_ids": driver.pad_token_id, "completion_ids": driver.pad_token_id, "tool_mask": 1}

    class AllGatherHandOver(type(driver)):
        def _own_kept_rows(self, output, keep):
            gathered = {}
            for key in ROW_KEYS:
                if output.get(key) is None:
                    continue
                tensor = output[key]
                if tensor.dim() >= 2:
                    widest = int(self.accelerator.gather(torch.tensor([tensor.size(1)])).max())
                    tensor = pad_to_width(tensor, widest, pad.get(key, 0), key in LEFT_PADDED)
                gathered[key] = self.accelerator.gather(tensor)
            piece = {k: v[keep.to(v.device)] for k, v in gathered.items()}
            return piece, {k: v.size(1) for k, v in piece.items() if v.dim() >= 2}

        def _hand_over(self, pieces, keeps, widths, rows, trained, filler):
            widest = {key: max(w[key] for w in widths) for key in widths[0]}
            kept = pad_pieces(pieces, widest, pad)
            start = self.accelerator.process_index * rows
            own = min(max(trained - start, 0), rows)
            batch = {k: v[start : start + own] for k, v in kept.items()}
            if own == rows:
                return batch
            fillers = filler_rows(pad_pieces([filler], widest, pad), rows - own)
            return {key: torch.cat([batch[key], fillers[key].to(batch[key])]) for key in batch}

    driver.__class__ = AllGatherHandOver


def worker(opts) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from trl_rlvr import RLVRConfig, RLVRTrainer
    from trl_rlvr.testing import load_tokenizer

    torch.set_num_threads(1)
    settings = dict(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=opts.rows, num_generations=GROUP,
        max_completion_length=opts.width, learning_rate=0.0, max_steps=1, bf16=False, use_cpu=True,
        activation_checkpointing=False, report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
        dynamic_sampling=True, max_sampling_rounds=8, beta=0.0,
    )
    data = Dataset.from_dict({"prompt": [f"q{i}" for i in range(4096)]})
    results, trained, counter = {}, {}, None
    for strategy in ("after", "before"):
        model = AutoModelForCausalLM.from_pretrained(opts.model_dir, dtype=torch.float32)
        trainer = RLVRTrainer(model=model, reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                                args=RLVRConfig(**settings), train_dataset=data,
                                processing_class=load_tokenizer(opts.model_dir))
        trainer.model.train()
        counter = counter or _count_traffic()  # torch.distributed wrapped once per process
        driver = trainer._round_driver
        driver.score_round = _synthetic_rounds(trainer, opts.rows, opts.width)  # the same rounds for both
        if strategy == "before":
            _all_gather_hand_over(driver)
        driver.generation_batch([{}] * opts.rows)  # warm-up (first-call allocations), not measured
        rows_bytes, peaks, seconds, batches = [], [], [], []
        for _ in range(opts.batches):
            if torch.distributed.is_initialized():
                torch.distributed.barrier()
            before_bytes, base = counter["bytes"], _reset_peak()
            start = time.perf_counter()
            batch, _ = driver.generation_batch([{}] * opts.rows)
            seconds.append(time.perf_counter() - start)
            peaks.append(_status_kib("VmHWM") - base)
            rows_bytes.append(counter["bytes"] - before_bytes)
            batches.append({k: v.clone() for k, v in batch.items() if k != "num_items_in_batch"})
        results[strategy] = {"bytes": statistics.median(rows_bytes), "peak_kib": statistics.median(peaks),
                             "seconds": statistics.median(seconds)}
        trained[strategy] = batches
    same = all(
        all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(trained["before"], trained["after"], strict=True)
    )
    results["same_rows"] = same
    rank = int(os.environ.get("RANK", 0))
    Path(opts.out, f"rank{rank}.json").write_text(json.dumps(results))


# ------------------------------------------------------------------------------------------------ driver
def run_processes(processes: int, opts, model_dir: str) -> list[dict]:
    import subprocess

    from tests.harness.launch import launch_on_cpu

    with tempfile.TemporaryDirectory() as out:
        args = ["--module", "benchmarks.sampling_handover", "--worker", "--model-dir", model_dir, "--out", out,
                "--rows", str(opts.rows), "--width", str(opts.width), "--batches", str(opts.batches)]
        if processes > 1:
            launch_on_cpu(*args, num_processes=processes, timeout=1800)
        else:  # accelerate's launcher wants 2 processes or more for gloo; one process needs no launcher
            env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
            subprocess.run([sys.executable, "-m", *args[1:]], env=env, check=True, timeout=1800,
                           cwd=Path(__file__).resolve().parents[1], capture_output=True)
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(processes)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--rows", type=int, default=64, help="answers per process per round (a multiple of 4)")
    p.add_argument("--width", type=int, default=2048, help="completion tokens (process r: width - r)")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--json", help="write the per-process results here")
    p.add_argument("--smoke", action="store_true", help="1 and 2 processes, 16 rows of 64 tokens, 1 batch")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.worker:
        worker(opts)
        return 0
    if opts.smoke:
        opts.processes, opts.rows, opts.width, opts.batches = [1, 2], 16, 64, 1
    from trl_rlvr.testing import build_tiny_model

    print("$ python -m benchmarks.sampling_handover " + " ".join(sys.argv[1:] if argv is None else argv))
    print(f"load: {os.getloadavg()[0]:.1f} (1-min average, {os.cpu_count()} CPUs); rows/process {opts.rows}, "
          f"completion width {opts.width}, batches {opts.batches} (medians)")
    model_dir = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    failures, table = [], {}
    print(f"{'N':>3} | {'before: MiB received':>21} {'peak MiB':>9} | {'after: MiB received':>20} {'peak MiB':>9} |"
          " (max over processes; mean in brackets)")
    for processes in opts.processes:
        ranks = run_processes(processes, opts, model_dir)
        table[processes] = ranks
        if not all(r["same_rows"] for r in ranks):
            failures.append(f"{processes} processes: the two hand-overs gave different rows")
        cells = []
        for strategy in ("before", "after"):
            received = [r[strategy]["bytes"] / 2**20 for r in ranks]
            peak = [r[strategy]["peak_kib"] / 1024 for r in ranks]
            cells.append(f"{max(received):8.2f} ({statistics.mean(received):6.2f}) "
                         f"{max(peak):5.1f} ({statistics.mean(peak):5.1f})")
        print(f"{processes:>3} | {cells[0]:>31} | {cells[1]:>30} |", flush=True)
    if opts.json:
        Path(opts.json).write_text(json.dumps({"argv": sys.argv[1:], "results": table}, indent=1))
    return finish(NAME, failures)


if __name__ == "__main__":
    sys.exit(main())
