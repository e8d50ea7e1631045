"""The staleness bound at the loss (trl_rlvr.algorithms.stale_rows): a row more than ``max_staleness`` weight syncs
behind the weights being trained keeps no weight, and the loss's normalization counts only the kept tokens and rows:
the loss is the one of the micro-batch without the stale rows."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.algorithms.packed_loss import NORMALIZATIONS, local_answer_count, packed_loss
from trl_rlvr.algorithms.stale_rows import fresh_rows, fresh_tokens, stale_row_count, syncs_read_to_loss


def test_hand_cases():
    versions = torch.tensor([5, 3, 4, 2])
    assert fresh_rows(versions, 5, 1).tolist() == [True, False, True, False]
    seg = torch.tensor([0, 0, 1, 2, 2, 3])
    keep = fresh_tokens(seg, versions, 5, 1)
    assert keep.tolist() == [True, True, False, True, True, False]
    assert stale_row_count(seg, keep) == 2
    assert fresh_tokens(seg, versions, 5, 3).all()  # lag 3 at most: all within 3
    assert (syncs_read_to_loss(0), syncs_read_to_loss(None), syncs_read_to_loss(512)) == (1, 2, 2)


@st.composite
def micro_batches(draw):
    """A packed micro-batch: rows of random lengths and generating versions, tokens shuffled (a tree row's order)."""
    trained = draw(st.integers(0, 8))
    lengths = draw(st.lists(st.integers(1, 6), min_size=1, max_size=8))
    versions = [trained - draw(st.integers(0, 4)) for _ in lengths]
    seg = [i for i, n in enumerate(lengths) for _ in range(n)]
    order = draw(st.permutations(range(len(seg))))
    losses = draw(st.lists(st.floats(-3, 3), min_size=len(seg), max_size=len(seg)))
    return trained, torch.tensor(versions), torch.tensor([seg[i] for i in order]), torch.tensor(losses)


@settings(max_examples=300, deadline=None)
@given(micro_batches(), st.integers(0, 3), st.sampled_from(NORMALIZATIONS))
def test_no_token_over_the_bound_keeps_weight_and_only_kept_tokens_normalize(batch, bound, normalization):
    trained, versions, seg, losses = batch
    keep = fresh_tokens(seg, versions, trained, bound)
    lag = trained - versions[seg]
    assert torch.equal(keep, lag <= bound)
    assert stale_row_count(seg, keep) == int(((trained - versions) > bound).sum())  # every row has a token

    # the trainer's use: the loss over the kept tokens, normalized by the kept counts
    per_token = losses.clone().requires_grad_(True)
    kept_seg = seg[keep]
    loss = packed_loss(per_token[keep], kept_seg, normalization, global_tokens=float(keep.sum()),
                       global_answers=float(local_answer_count(kept_seg)), num_processes=1, loss_constant=4)
    if keep.any():
        loss.backward()
        grad = per_token.grad
        assert torch.all(grad[lag > bound] == 0)  # no token over the bound keeps weight
        # the normalization counts only kept tokens / rows: the loss is the one built from the kept rows alone
        kept_rows = [i for i in range(len(versions)) if trained - int(versions[i]) <= bound]
        kept_losses = [losses[seg == i] for i in kept_rows]
        if normalization == "per_batch_token":
            want = sum(x.sum() for x in kept_losses) / sum(x.numel() for x in kept_losses)
            assert torch.allclose(grad[keep], torch.full_like(grad[keep], 1 / int(keep.sum())))
        elif normalization == "per_answer":
            want = sum(x.mean() for x in kept_losses) / len(kept_rows)
        else:
            want = sum(x.sum() for x in kept_losses) / (len(kept_rows) * 4)
        assert loss.item() == pytest.approx(float(want), rel=1e-5, abs=1e-6)
    else:
        assert loss.item() == 0.0 and not (trained - versions <= bound).any()
