"""Dynamic sampling inside the staleness bound, decided per group: the same inputs give the same decisions, no group
older than the bound is admitted, a group is admitted whole, every dropped group asks for one refill, memory stays
bounded."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.sampling.group_filter import KEPT, STALE, ZERO_SIGNAL, GroupFilter


def test_decide_hand_cases():
    f = GroupFilter(max_staleness=2)
    assert f.decide(5, [1.0, 0.0], current_version=7) == KEPT  # 2 old: at the bound
    assert f.decide(4, [1.0, 0.0], current_version=7) == STALE  # 3 old
    assert f.decide(7, [1.0, 1.0], current_version=7) == ZERO_SIGNAL
    assert f.decide(7, [1.0, math.nan], current_version=7) == ZERO_SIGNAL  # one scored answer: no signal
    assert f.decide(4, [1.0, 1.0], current_version=7) == STALE  # stale first
    assert (f.counts.kept, f.counts.stale, f.counts.zero_signal, f.counts.refills_requested) == (1, 2, 2, 4)
    assert GroupFilter(max_staleness=0, dynamic_sampling=False).decide(3, [1.0, 1.0], current_version=3) == KEPT
    with pytest.raises(ValueError, match="max_staleness"):
        GroupFilter(max_staleness=-1)


groups_st = st.lists(st.tuples(st.integers(0, 6), st.lists(st.sampled_from([0.0, 1.0, math.nan]), min_size=1,
                                                                   max_size=4)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(groups_st, st.integers(0, 3), st.booleans())
def test_decide_is_a_function_of_its_inputs_and_keeps_the_bound(groups, bound, dynamic):
    a, b = GroupFilter(bound, dynamic), GroupFilter(bound, dynamic)
    current = 0
    for lag, totals in groups:
        current += 1
        version = current - lag
        da, db = a.decide(version, totals, current), b.decide(version, totals, current)
        assert da == db
        assert (da == STALE) == (lag > bound)
        if da == KEPT and dynamic:
            scored = [t for t in totals if not math.isnan(t)]
            assert len(scored) >= 2 and max(scored) > min(scored)
    c = a.counts
    assert c.kept + c.stale + c.zero_signal == len(groups) and c.refills_requested == c.stale + c.zero_signal


@st.composite
def queues(draw):
    """Rows as a queue delivers them: each group's rows consecutive, weight syncs (version bumps) anywhere."""
    events, current, gid = [], 0, 0
    for _ in range(draw(st.integers(0, 12))):
        version = current - draw(st.integers(0, 5))
        for _ in range(draw(st.integers(1, 4))):
            if draw(st.booleans()) and draw(st.booleans()):
                current += 1
            events.append((gid, version, current))
        gid += 1
    return events


@settings(max_examples=300, deadline=None)
@given(queues(), st.integers(0, 3))
def test_rows_follow_their_groups_first_row_within_one_sync(events, bound):
    f, g = GroupFilter(bound), GroupFilter(bound)
    first_age = {}
    for group_id, version, current in events:
        ok = f.admit_row(group_id, version, current)
        assert ok == g.admit_row(group_id, version, current)  # the same rows, the same decisions
        first_age.setdefault(group_id, current - version)
        assert ok == (first_age[group_id] <= bound and current - version <= bound + 1)
    assert f.counts.rows_admitted + f.counts.rows_dropped_stale == len(events)
    assert f.counts.refills_requested == f.counts.stale == sum(1 for a in first_age.values() if a > bound)


def test_a_group_straddling_a_sync_is_trained_whole():
    f = GroupFilter(max_staleness=1)
    assert [f.admit_row(0, 5, 6), f.admit_row(0, 5, 7), f.admit_row(1, 5, 7)] == [True, True, False]
    assert f.admit_row(0, 5, 8) is False  # two syncs late: refused even though its group was admitted


def test_memory_is_bounded():
    f = GroupFilter(max_staleness=1, memory=8)
    for version in range(1000):
        f.admit_row(version, version, version)
    assert len(f._admitted) == 8
