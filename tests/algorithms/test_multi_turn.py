"""The multi-turn stabilisers on plain data: void turns (SimpleTIR), the tool-call cap, ToRL's error line,
rStar2's resample-on-correct."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.algorithms.multi_turn import (
    cap_rewards,
    last_error_line,
    over_tool_call_cap,
    resample_on_correct,
    tool_call_counts,
    void_turn_filter,
    void_turn_rollouts,
)


def boxed_once(text: str) -> bool:
    return text.count("\\boxed{") == 1


CALL = {"type": "function", "function": {"name": "python", "arguments": {"code": "print(2 * 3)"}}}


def call_turn(n=1, content=""):
    return {"role": "assistant", "content": content, "tool_calls": [CALL] * n}


def reply(text="6"):
    return {"role": "tool", "name": "python", "content": text}


def answer(text="\\boxed{6}"):
    return {"role": "assistant", "content": text}


def test_void_turns_are_turns_with_neither_a_call_nor_an_answer():
    rollouts = [
        [call_turn(), reply(), answer()],  # call, then answer: fine
        [answer()],  # answers without the tool: not void (the format reward's business)
        [call_turn(), reply(), answer("so the result is six")],  # last turn neither calls nor answers
        [answer("<tool_call>{not json</tool_call>")],  # a call that did not parse is text: void
        [call_turn(), reply(), call_turn()],  # ran out of iterations on a call: not void
        [],  # cut to nothing
        [reply()],  # no assistant turn at all
        "\\boxed{6}",  # a plain-text completion that answers
        "no answer here",
    ]
    assert void_turn_rollouts(rollouts, boxed_once) == [False, False, True, True, False, True, True, False, True]


def test_void_turns_read_content_blocks_and_ignore_junk_messages():
    blocks = [{"role": "assistant", "content": [{"type": "text", "text": "\\boxed{6}"}, {"type": "image"}]}]
    junk = [None, 7, {"role": "assistant", "content": None}]
    assert void_turn_rollouts([blocks, junk], boxed_once) == [False, True]


def test_void_turn_filter_zeroes_or_drops():
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    void = torch.tensor([False, True, False, True])
    zeroed, keep = void_turn_filter(adv, void, "zero_advantage")
    assert zeroed.tolist() == [1.0, 0.0, 0.5, 0.0] and keep.tolist() == [True, False, True, False]
    dropped, keep = void_turn_filter(adv, void, "drop")
    assert keep.tolist() == [True, False, True, False]
    same, keep = void_turn_filter(adv, void, "off")
    assert same is adv and keep.all()
    per_token = adv[:, None].expand(4, 3)
    zeroed, _ = void_turn_filter(per_token, void)
    assert zeroed[1].tolist() == [0.0] * 3 and zeroed[0].tolist() == [1.0] * 3


def test_void_turn_filter_refuses_bad_input():
    with pytest.raises(ValueError, match="void_turn_action='skip'"):
        void_turn_filter(torch.zeros(2), torch.zeros(2, dtype=torch.bool), "skip")
    with pytest.raises(ValueError, match="one flag per rollout"):
        void_turn_filter(torch.zeros(3), torch.zeros(2, dtype=torch.bool))


def test_tool_call_cap_counts_every_call_of_every_turn():
    rollouts = [[call_turn(2), reply(), reply(), call_turn(1), reply(), answer()], [answer()], [call_turn(), reply()]]
    counts = tool_call_counts(rollouts)
    assert counts == [3, 0, 1]
    over = over_tool_call_cap(counts, cap=2)
    assert over.tolist() == [True, False, False]
    assert cap_rewards(torch.tensor([1.0, 1.0, 0.5]), over).tolist() == [0.0, 1.0, 0.5]
    per_func = cap_rewards(torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]), over, value=-1.0)
    assert per_func.tolist() == [[-1.0, -1.0], [1.0, 0.0], [0.0, 0.0]]
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="max_tool_calls_per_answer"):
            over_tool_call_cap(counts, bad)


TRACEBACK = """Traceback (most recent call last):
  File "<cell 1>", line 1, in <module>
    print(x * 28)
          ^
NameError: name 'x' is not defined
"""


def test_last_error_line_of_a_traceback_and_of_a_syntax_error():
    assert last_error_line("printed first\n" + TRACEBACK) == "NameError: name 'x' is not defined"
    syntax = '  File "<cell 2>", line 1\n    print(347 *)\n               ^\nSyntaxError: invalid syntax\n'
    assert last_error_line(syntax) == "SyntaxError: invalid syntax"
    assert last_error_line("   \n") == "   \n"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=5000), st.integers(min_value=20, max_value=400))
def test_last_error_line_is_bounded_and_one_line_for_any_reply(text, limit):
    line = last_error_line(text, limit)
    if text.strip():
        assert len(line) <= limit and "\n" not in line and line.strip() == line
        assert line in text or " ... " in line


def test_resample_on_correct_keeps_the_cleanest_right_answers():
    # one group of 8 sampled, keep 4: 4 right (errors 3, 0, 2, 0), 4 wrong
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    errors = torch.tensor([3, 0, 0, 2, 5, 1, 0, 0])
    kept = resample_on_correct(rewards, errors, sampled_per_group=8, group_size=4, generator=torch.Generator().manual_seed(0))
    assert len(kept) == 4
    right = [i for i in kept.tolist() if rewards[i] == 1]
    assert sorted(right) == [1, 6]  # half right as sampled; the two with no tool error
    assert all(rewards[i] == 0 for i in kept.tolist() if i not in right)


def test_resample_on_correct_never_erases_a_groups_signal():
    # 1 right of 8 -> rounds to 0 of 4, but the group keeps one right and three wrong
    rewards = torch.tensor([0.0] * 7 + [1.0] + [1.0] * 7 + [0.0])
    kept = resample_on_correct(rewards, torch.zeros(16), 8, 4, generator=torch.Generator().manual_seed(1))
    first, second = kept[:4], kept[4:]
    assert int(rewards[first].sum()) == 1 and int(rewards[second].sum()) == 3
    assert (second >= 8).all() and (first < 8).all()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(2, 6), st.integers(0, 3), st.data())
def test_resample_on_correct_shape_and_signal_for_any_batch(groups, group_size, extra, data):
    sampled = group_size + extra
    rewards = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 1.0, float("nan")]), min_size=groups * sampled,
                                              max_size=groups * sampled)))
    errors = torch.tensor(data.draw(st.lists(st.integers(0, 5), min_size=groups * sampled, max_size=groups * sampled)))
    kept = resample_on_correct(rewards, errors, sampled, group_size, generator=torch.Generator().manual_seed(0))
    assert kept.shape == (groups * group_size,) and len(set(kept.tolist())) == len(kept)
    right = rewards >= 1
    for g in range(groups):
        mine = kept[g * group_size:(g + 1) * group_size]
        assert ((mine >= g * sampled) & (mine < (g + 1) * sampled)).all()
        had = right[g * sampled:(g + 1) * sampled]
        if had.any() and (~had).any():
            assert right[mine].any() and (~right[mine]).any()
        # every right answer kept has no more errors than any right answer left out
        out = [i for i in range(g * sampled, (g + 1) * sampled) if right[i] and i not in mine.tolist()]
        inside = [i for i in mine.tolist() if right[i]]
        if out and inside:
            assert max(errors[inside]) <= min(errors[out])


def test_resample_on_correct_is_seeded():
    rewards = torch.tensor([1.0, 0.0] * 8)
    a = resample_on_correct(rewards, torch.zeros(16), 16, 8, generator=torch.Generator().manual_seed(3))
    b = resample_on_correct(rewards, torch.zeros(16), 16, 8, generator=torch.Generator().manual_seed(3))
    assert a.tolist() == b.tolist()
    with pytest.raises(ValueError, match="sampled_per_group"):
        resample_on_correct(rewards, torch.zeros(16), 4, 8)
