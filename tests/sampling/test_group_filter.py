"""Dynamic sampling inside the staleness bound, decided per group: the same inputs give the same decisions, no row is
admitted that will be over the bound at its loss (its lag at read plus the syncs it may still wait), a group is
admitted or refused at its first row, every dropped group asks for one refill, memory stays bounded."""

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
@given(queues(), st.integers(0, 3), st.integers(0, 2))
def test_rows_follow_their_groups_first_row_and_every_row_is_within_the_bound_at_its_loss(events, bound, syncs):
    """``syncs``: the weight syncs a row read now may still wait before its loss. A row is admitted iff its group was
    admitted at its first row and the row itself will be within the bound at its loss."""
    f, g = GroupFilter(bound, syncs_before_loss=syncs), GroupFilter(bound, syncs_before_loss=syncs)
    first_age = {}
    for group_id, version, current in events:
        ok = f.admit_row(group_id, version, current)
        assert ok == g.admit_row(group_id, version, current)  # the same rows, the same decisions
        first_age.setdefault(group_id, current - version)
        assert ok == (first_age[group_id] + syncs <= bound and current - version + syncs <= bound)
        if ok:
            assert current - version + syncs <= bound  # within the bound at the loss, followers included
    assert f.counts.rows_admitted + f.counts.rows_dropped_stale == len(events)
    assert f.counts.refills_requested == f.counts.stale == sum(1 for a in first_age.values() if a + syncs > bound)


def test_a_group_straddling_a_sync_keeps_the_rows_within_the_bound_at_their_loss():
    f = GroupFilter(max_staleness=2, syncs_before_loss=1)
    # group 0 read 1 old: 2 old at its loss; its follower read after a sync would be 3 old at its loss: refused
    assert [f.admit_row(0, 5, 6), f.admit_row(0, 5, 7), f.admit_row(1, 5, 7)] == [True, False, False]
    assert [f.admit_row(2, 6, 7), f.admit_row(2, 6, 7)] == [True, True]  # a group read within one sync: whole
    assert (f.counts.stale, f.counts.rows_dropped_stale) == (1, 2)
    with pytest.raises(ValueError, match="syncs_before_loss"):
        GroupFilter(max_staleness=1, syncs_before_loss=-1)


def test_memory_is_bounded():
    f = GroupFilter(max_staleness=1, memory=8)
    for version in range(1000):
        f.admit_row(version, version, version)
    assert len(f._admitted) == 8
