"""The stream ledger's guarantee, for any order in which groups settle and any checkpoint: the positions a resumed
stream generates and the positions settled at the checkpoint partition the stream (none twice, none skipped), and
the resumed stream is in order."""

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trl_rlvr.sampling.stream_ledger import StreamLedger, StreamStart, stream_positions


@st.composite
def settlements(draw):
    """(order in which positions 0..n-1 settle, trained flags, how many settle before the checkpoint)."""
    n = draw(st.integers(1, 40))
    order = draw(st.permutations(range(n)))
    trained = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return order, trained, draw(st.integers(0, n))


@given(settlements())
def test_a_resumed_stream_takes_every_unsettled_position_once_in_order(case):
    order, trained, cut = case
    ledger = StreamLedger()
    for position in order[:cut]:
        ledger.settle(position, trained[position])
        ledger.settle(position, not trained[position])  # settling again changes nothing
    state = json.loads(json.dumps(ledger.state_dict()))  # what a checkpoint holds
    resumed = StreamLedger.from_state_dict(state)
    settled = set(order[:cut])
    assert resumed.groups_trained == sum(trained[p] for p in settled)
    assert all(resumed.is_settled(p) == (p in settled) for p in range(len(order) + 2))
    horizon = len(order) + 3
    taken = list(itertools.takewhile(lambda p: p < horizon, stream_positions(resumed.start())))
    assert taken == sorted(taken)
    assert set(taken) | settled == set(range(horizon)) and not set(taken) & settled
    # the memory above the watermark holds only out-of-order settlements
    assert all(p > resumed.next_position for p in resumed.settled_after)


def test_a_start_refuses_skipped_positions_below_it():
    with pytest.raises(ValueError, match="StreamStart"):
        StreamStart(3, frozenset({2}))
    assert list(itertools.islice(stream_positions(StreamStart(2, frozenset({3, 5}))), 4)) == [2, 4, 6, 7]
