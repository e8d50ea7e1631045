"""Dynamic sampling's hand-over of kept rows: the same rows, in the same order, as an all-gather of every row would
give each process, while only kept rows move."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.harness.launch import free_port
from trl_rlvr.sampling.redistribute import destinations, exchange_rows


def _all_gather_order(kept_counts):
    """(source process, index among its kept rows) of every kept row, in the order of the all-gather hand-over."""
    order, seen = [], {}
    for counts in kept_counts:
        for source, count in enumerate(counts):
            for _ in range(count):
                order.append((source, seen.get(source, 0)))
                seen[source] = seen.get(source, 0) + 1
    return order


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.lists(st.integers(0, 6), min_size=n, max_size=n), min_size=1, max_size=5))),
    st.integers(1, 6))
def test_destinations_follow_the_all_gather_order(processes_and_counts, rows):
    processes, kept_counts = processes_and_counts
    total = sum(map(sum, kept_counts))
    rows = min(rows, total // processes) or 1
    plan = destinations(kept_counts, rows, processes)
    order = _all_gather_order(kept_counts)
    for position, (source, index) in enumerate(order):
        expected = (position // rows, position % rows) if position < rows * processes else (-1, -1)
        assert plan[source][index] == expected
    assert [len(p) for p in plan] == [sum(c[s] for c in kept_counts) for s in range(processes)]


def _exchange_worker(rank, world, port, kept_counts, rows, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        mine = sum(c[rank] for c in kept_counts)
        local = {"ids": torch.arange(mine)[:, None].repeat(1, 3) + 1000 * rank, "adv": torch.arange(mine) + 0.5 * rank}
        got = exchange_rows(local, destinations(kept_counts, rows, world), rows, rank, world)
        torch.save(got, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_exchange_gives_each_process_its_rows_of_the_all_gather(tmp_path):
    import torch.multiprocessing as mp

    world, rows = 3, 4
    kept_counts = [[2, 0, 4], [1, 3, 0], [4, 4, 4]]
    mp.spawn(_exchange_worker, args=(world, free_port(), kept_counts, rows, str(tmp_path / "out")), nprocs=world)
    order = _all_gather_order(kept_counts)
    for rank in range(world):
        got = torch.load(tmp_path / f"out.{rank}")
        expected = order[rank * rows : (rank + 1) * rows]
        assert got["ids"][:, 0].tolist() == [index + 1000 * source for source, index in expected]
        assert got["adv"].tolist() == [index + 0.5 * source for source, index in expected]
