"""The three normalizations on packed tokens: any split of the micro-batch's completions over processes, averaged as
DDP averages gradients, is the whole micro-batch's loss written out from the definitions (and so is its gradient)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.algorithms.packed_loss import NORMALIZATIONS, local_answer_count, packed_loss


def reference(answers: list[list[float]], normalization: str, constant: float) -> float:
    """The definitions, completion by completion, in plain floats."""
    tokens = sum(len(a) for a in answers)
    if normalization == "per_batch_token":
        return sum(sum(a) for a in answers) / tokens
    if normalization == "per_answer":
        return sum(sum(a) / len(a) for a in answers) / len(answers)
    return sum(sum(a) for a in answers) / (len(answers) * constant)


def process_losses(answers, owner, normalization, constant, num_processes):
    """Each process packs the completions it owns (in its own order) and returns its share."""
    tokens = sum(len(a) for a in answers)
    out = []
    for p in range(num_processes):
        mine = [a for a, o in zip(answers, owner) if o == p]
        flat = torch.tensor([x for a in mine for x in a], dtype=torch.float64)
        seg = torch.tensor([i for i, a in enumerate(mine) for _ in a], dtype=torch.long)
        out.append(packed_loss(flat, seg, normalization, global_tokens=tokens, global_answers=len(answers),
                               num_processes=num_processes, loss_constant=constant))
    return out


answers_st = st.lists(st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=6), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(answers_st, st.integers(1, 4), st.sampled_from(NORMALIZATIONS), st.data())
def test_any_split_over_processes_averages_to_the_definition(answers, num_processes, normalization, data):
    owner = data.draw(st.lists(st.integers(0, num_processes - 1), min_size=len(answers), max_size=len(answers)))
    shares = process_losses(answers, owner, normalization, 7.0, num_processes)
    assert (sum(s.item() for s in shares) / num_processes) == pytest.approx(
        reference(answers, normalization, 7.0), rel=1e-9, abs=1e-12)


def test_a_hand_example_tells_the_three_apart():
    answers = [[1.0, 1.0, 1.0, 1.0], [4.0]]  # a long answer of small losses, a short one of a large loss
    got = {n: sum(s.item() for s in process_losses(answers, [0, 1], n, 8.0, 2)) / 2 for n in NORMALIZATIONS}
    assert got == pytest.approx({"per_batch_token": 8 / 5, "per_answer": (1 + 4) / 2, "constant": 8 / 16})


def test_the_gradient_is_the_definitions():
    losses = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    seg = torch.tensor([1, 0, 1])  # packed out of order
    packed_loss(losses, seg, "per_answer", global_tokens=3, global_answers=2, num_processes=1).backward()
    assert losses.grad.tolist() == pytest.approx([1 / 4, 1 / 2, 1 / 4])  # (1/N)(1/n_i)


def test_settings_are_checked():
    args = (torch.ones(2), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="loss_normalization must be one of"):
        packed_loss(*args, "sequence_mean", global_tokens=2, global_answers=1, num_processes=1)
    with pytest.raises(ValueError, match="positive loss_constant"):
        packed_loss(*args, "constant", global_tokens=2, global_answers=1, num_processes=1)
    assert local_answer_count(torch.tensor([3, 0, 3, 1])) == 3
