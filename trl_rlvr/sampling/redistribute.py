"""Dynamic sampling's hand-over of kept rows to the processes that train them, moving only those rows.

Every process knows, from the gathered rewards, which rows of every process each round kept. The kept rows form one
global sequence (round after round; within a round, process after process, each process's rows in order): the
order an all-gather of every row would give. Process d trains positions ``[d*R, (d+1)*R)`` of it (``R`` rows per
process), so each kept row has one destination, computable everywhere without communication
(:func:`destinations`). Each process then sends each of its kept rows to its destination (point to point) and
receives its own: per process O(its own rows) of memory and traffic, whatever the number of processes, instead of an
all-gather of every row of every process. The result is the rows the all-gather would have given, bit for bit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from trl_rlvr.sampling.dynamic import LEFT_PADDED, pad_to_width


def destinations(kept_counts: list[list[int]], rows: int, num_processes: int) -> list[list[tuple[int, int]]]:
    """For each process s, for each of its kept rows in order (round after round): ``(destination process, slot in
    its batch)``, or ``(-1, -1)`` for a row past the ``rows x num_processes`` trained ones.

    ``kept_counts[t][s]``: rows of process s that round t kept."""
    plan: list[list[tuple[int, int]]] = [[] for _ in range(num_processes)]
    position = 0
    for counts in kept_counts:
        for source, count in enumerate(counts):
            for _ in range(count):
                trained = position < rows * num_processes
                plan[source].append((position // rows, position % rows) if trained else (-1, -1))
                position += 1
    return plan


def pad_pieces(pieces: list[dict[str, torch.Tensor]], widths: dict[str, int], pad_values: dict[str, float]) -> dict:
    """Concatenate this process's kept rows of every round, each 2-D tensor padded to ``widths[key]`` (prompt side
    on the left, completion side on the right, as TRL pads)."""
    out = {}
    for key in pieces[0]:
        tensors = [piece[key] for piece in pieces]
        if tensors[0].dim() >= 2:
            tensors = [pad_to_width(t, widths[key], pad_values.get(key, 0), key in LEFT_PADDED) for t in tensors]
        out[key] = torch.cat(tensors)
    return out


def exchange_rows(local: dict[str, torch.Tensor], plan: list[list[tuple[int, int]]], rows: int, rank: int,
                  num_processes: int) -> dict[str, torch.Tensor]:
    """This process's ``rows`` trained rows: its own kept rows destined to itself, and those the others send it.

    ``local``: this process's kept rows (all rounds, padded to the global widths); ``plan``: :func:`destinations`.
    Every process must call this with the same keys, dtypes and widths (point-to-point sends, one per key and pair
    of processes that share rows)."""
    mine = plan[rank]
    out = {key: value.new_empty((rows, *value.shape[1:])) for key, value in local.items()}
    own = [(i, slot) for i, (dest, slot) in enumerate(mine) if dest == rank]
    sends = {d: [i for i, (dest, _) in enumerate(mine) if dest == d] for d in range(num_processes) if d != rank}
    receives = {s: [slot for dest, slot in plan[s] if dest == rank] for s in range(num_processes) if s != rank}
    pending, buffers = [], []
    for tag, (key, value) in enumerate(local.items()):
        if own:
            index, slots = zip(*own, strict=True)
            out[key][list(slots)] = value[list(index)]
        for dest, index in sends.items():
            if index:
                tensor = value[index].contiguous()
                pending.append((dist.isend(tensor, dst=dest, tag=tag), tensor))
        for source, slots in receives.items():
            if slots:
                buffer = value.new_empty((len(slots), *value.shape[1:]))
                pending.append((dist.irecv(buffer, src=source, tag=tag), buffer))
                buffers.append((key, slots, buffer))
    for request, _ in pending:
        request.wait()
    for key, slots, buffer in buffers:
        out[key][slots] = buffer
    return out
