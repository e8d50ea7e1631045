"""The multi-turn stabilizers on plain data: void turns (SimpleTIR), the tool-call cap, ToRL's error line,
rStar2's resample-on-correct; and the property that no switch raises a rollout's total reward."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rlvr.algorithms.advantages import group_advantages
from trl_rlvr.algorithms.multi_turn import (
    VOID_TURN_ACTIONS,
    last_error_line,
    over_tool_call_cap,
    resample_on_correct,
    score_as_wrong,
    tool_call_counts,
    void_turn_filter,
    void_turn_rollouts,
)
from trl_rlvr.algorithms.unscorable import mark_unscorable, total_rewards
from trl_rlvr.sampling.row_rules import ScoredRows, row_rules_of, score_rows


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
    for acting_on_rewards in ("off", "score_as_wrong"):
        same, keep = void_turn_filter(adv, void, acting_on_rewards)
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
    per_func = score_as_wrong(torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]), over, torch.tensor([1.0, 1.0]))
    assert per_func.tolist() == [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]
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


# ------------------------------------------------------------------------------------- scored as a wrong answer
NAN = float("nan")


def test_score_as_wrong_keeps_every_penalty_whatever_the_weights():
    # functions: correctness (w 1), format (w 0.5), overlong (w 1, in [-1, 0]), a "length" score on a negative weight
    rewards = torch.tensor([[1.0, 1.0, -0.5, 2.0], [1.0, NAN, 0.0, -1.0], [0.0, 1.0, -1.0, 0.0]])
    weights = torch.tensor([1.0, 0.5, 1.0, -0.25])
    out = score_as_wrong(rewards, torch.tensor([True, True, False]), weights)
    assert out[0].tolist() == [0.0, 0.0, -0.5, 2.0]  # the penalties: overlong, and +2 under a negative weight
    assert out[1, 0].item() == 0.0 and out[1, 1].isnan() and out[1, 2:].tolist() == [0.0, 0.0]  # -1 x -0.25 pays
    assert out[2].tolist() == rewards[2].tolist()
    with pytest.raises(ValueError, match=r"\(N, F\)"):
        score_as_wrong(rewards[:, 0], torch.tensor([True, True, False]), weights)


def test_over_the_cap_a_long_wrong_answer_keeps_its_overlong_penalty():
    """Three wrong answers; the one that ran long (overlong -0.5) made one tool call too many: the cap used to set
    every function to 0, lifting its advantage from -1.414 to 0.000 (and its group's to 0)."""
    weights = torch.tensor([1.0, 1.0])  # boxed_math, overlong (overlong_penalty_factor 1)
    group = torch.tensor([[0.0, -0.5], [0.0, 0.0], [0.0, 0.0]])
    over = torch.tensor([True, False, False])
    uncapped = group_advantages(total_rewards(group, weights), 3)
    capped = group_advantages(total_rewards(score_as_wrong(group, over, weights), weights), 3)
    assert uncapped[0].item() == pytest.approx(-1.414, abs=1e-3) and torch.equal(capped, uncapped)
    right_over = score_as_wrong(torch.tensor([[1.0, -0.25]]), torch.tensor([True]), weights)
    assert total_rewards(right_over, weights).item() == -0.25  # a right answer over the cap: a wrong one's score


def test_a_void_rollout_scored_as_wrong_is_pushed_down_as_a_wrong_guess():
    """[right, wrong, none, wrong]: with zero_advantage the rollout that gave no answer gets 0 while the wrong guesses
    are pushed down; scored as wrong, it is pushed down as they are."""
    weights = torch.tensor([1.0])
    rewards = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    void = torch.tensor([False, False, True, False])
    zeroed, _ = void_turn_filter(group_advantages(total_rewards(rewards, weights), 4), void, "zero_advantage")
    assert zeroed[2].item() == 0.0 and zeroed[1].item() < 0
    scored = group_advantages(total_rewards(score_as_wrong(rewards, void, weights), weights), 4)
    same, _ = void_turn_filter(scored, void, "score_as_wrong")
    assert same[2].item() == pytest.approx(same[1].item()) and same[2].item() < 0


def _rollout(calls: int, void: bool) -> list[dict]:
    turns = [call_turn(), reply()] * calls
    return turns + [answer("let me think" if void else "\\boxed{6}")]


class _OneProcess:
    """The accelerator of one process: gathering a tensor returns it."""
    device, process_index = torch.device("cpu"), 0

    @staticmethod
    def gather(t):
        return t


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.data())
def test_no_switch_raises_a_rollouts_total(groups, funcs, data):
    """For random reward matrices (NaN: not scored), weights of any sign, correctness checks and switch settings
    (cap, void turns, resample-on-correct), through the row rules' score step and the unscorable rule as the trainer
    applies them: each row's total with the switches is at most its total without, every penalty survives, a row
    that no switch touched keeps its total, and a NaN (unscorable) total stays NaN."""
    group_size, k = 2, 2
    n = groups * group_size * k
    value = st.one_of(st.just(NAN), st.floats(-2, 2, allow_nan=False, width=32))
    raw = torch.tensor(data.draw(st.lists(st.lists(value, min_size=funcs, max_size=funcs), min_size=n, max_size=n)))
    weights = torch.tensor(data.draw(st.lists(st.floats(-2, 2, width=32), min_size=funcs, max_size=funcs)))
    checks = data.draw(st.lists(st.integers(0, funcs - 1), max_size=2, unique=True))
    calls = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    void = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    args = SimpleNamespace(void_turn_action=data.draw(st.sampled_from(VOID_TURN_ACTIONS)),
                           max_tool_calls_per_answer=data.draw(st.sampled_from([None, 1, 2])),
                           resample_on_correct=data.draw(st.booleans()), resample_on_correct_oversample=k,
                           success_threshold=1.0, seed=0)
    sink = {"train": _Sink()}
    trainer = SimpleNamespace(args=args, success_reward_index=0, reward_funcs=[SimpleNamespace(is_final_answer=boxed_once)],
                              reward_func_names=["success"], num_generations=group_size,
                              metrics_to_log=lambda mode: sink[mode])
    rollouts = [_rollout(c, v) for c, v in zip(calls, void, strict=True)]
    rows = ScoredRows(raw.clone(), rollouts, [None] * n, weights, gather=lambda values: torch.tensor(values),
                      log_metric=lambda name, value: sink["train"][name].append(value))
    switched = score_rows(row_rules_of(trainer), rows)  # the rules the trainer builds, applied as it applies them
    notes = SimpleNamespace(void=rows.notes.get("void"), tool_errors=rows.notes.get("tool_errors"))

    base = total_rewards(mark_unscorable(raw, checks)[0], weights)
    after = total_rewards(mark_unscorable(switched, checks)[0], weights)
    assert torch.equal(base.isnan(), after.isnan())  # unscorable stays unscorable, and nothing else becomes it
    scored = ~base.isnan()
    assert (after[scored] <= base[scored] + 1e-5).all()
    touched = torch.zeros(n, dtype=torch.bool)
    if args.max_tool_calls_per_answer is not None:
        touched |= torch.tensor(calls) > args.max_tool_calls_per_answer
    if args.void_turn_action == "score_as_wrong":
        touched |= torch.tensor(void)
    assert torch.equal(switched[~touched].isnan(), raw[~touched].isnan())
    assert torch.equal(switched[~touched].nan_to_num(), raw[~touched].nan_to_num())
    penalties = touched[:, None] & (raw * weights < 0)
    assert torch.equal(switched[penalties], raw[penalties])
    assert (after[scored & touched] <= 1e-5).all()
    if args.void_turn_action != "off":
        assert notes.void.tolist() == void
    if args.resample_on_correct:  # it only picks rows: each kept row keeps its total
        kept = resample_on_correct(after.nan_to_num(-1.0), notes.tool_errors, group_size * k, group_size,
                                   generator=torch.Generator().manual_seed(0))
        assert len(set(kept.tolist())) == len(kept) == n // k


class _Sink(dict):
    def __missing__(self, key):
        self[key] = []
        return self[key]
