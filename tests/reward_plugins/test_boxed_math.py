"""boxed_math: correctness, hardening against gaming, hostile answers under a hard deadline, pickling."""

import pickle
import threading
import time

import pytest

from reward_plugins.boxed_math import boxed_math

HALF = r"\frac{1}{2}"


@pytest.fixture(scope="module")
def reward():
    return boxed_math(timeout=2.0)


def score(reward, completion, gold=HALF, **kwargs):
    return reward(prompts=None, completions=[completion], answer=[gold], **kwargs)[0]


def test_is_final_answer_is_any_box_the_reward_reads_as_an_answer(reward):
    """void_turn_action's rule: a turn answers when it holds a box (right, wrong, hedged or unreadable), not when it
    holds none (plain text, an empty turn)."""
    assert reward.is_final_answer(r"so \boxed{12}") and reward.is_final_answer(r"\boxed{wrong}")
    assert reward.is_final_answer(r"\boxed{1} or \boxed{2}")  # hedged: an answer, a bad one
    assert reward.is_final_answer(r"\boxed")  # a box the reward cannot read: an answer it scores 0
    assert not reward.is_final_answer("let me compute 3 * 4 first")
    assert not reward.is_final_answer("")


@pytest.mark.parametrize(
    "completion, expected",
    [
        (r"So the answer is $\boxed{\frac12}$.", 1.0),
        (r"$\boxed{0.5}$", 1.0),
        (r"\boxed{1/2}", 1.0),
        (r"\fbox{\dfrac{1}{2}}", 1.0),
        (r"\boxed{\frac{1}{3}}", 0.0),
        # the answer is the LAST box
        (r"First \boxed{\frac{1}{2}} hmm no, \boxed{3}", 0.0),
        # hedging: several different candidate answers
        (r"\boxed{3} or \boxed{\frac{1}{2}}", 0.0),
        (r"It is \boxed{\frac{1}{2}} or \boxed{\frac{1}{3}}", 0.0),
        # a boxed list that merely contains the gold
        (r"\boxed{\frac{1}{2}, 1, 2}", 0.0),
        (r"\boxed{\frac{1}{2} \text{ or } 3}", 0.0),
        # layout boxes and the same answer boxed twice do not count against a right answer
        (r"\boxed{} \boxed{\phantom{0}} \boxed{\frac{1}{2}}", 1.0),
        (r"\boxed{\frac{1}{2}} so again \boxed{0.5}", 1.0),
        (r"\boxed{\frac{1}{2}} \boxed{\frac{1}{2}}", 1.0),
        # no box, empty box only
        (r"The answer is 1/2.", 0.0),
        (r"\boxed{}", 0.0),
        (r"\boxed{\frac{1}{2}", 0.0),  # unbalanced
        ("", 0.0),
    ],
)
def test_boxed_answers(reward, completion, expected):
    assert score(reward, completion) == expected


def test_gold_forms(reward):
    assert score(reward, r"\boxed{3250}", gold=r"3,\!250") == 1.0
    assert score(reward, r"\boxed{[0, 1)}", gold=r"x \in [0,1)") == 1.0
    assert score(reward, r"\boxed{[0, 1]}", gold=r"x \in [0,1)") == 0.0
    solution = r"We compute $2+2$. Hence the total is $\boxed{4}$."
    assert reward(None, [r"\boxed{4}", r"\boxed{5}"], solution=[solution, solution]) == [1.0, 0.0]
    # multi-part gold boxed part by part; the boxes together must match exactly
    assert score(reward, r"\boxed{1} and \boxed{-2}", gold=r"\(\boxed{1}\) and \(\boxed{-2}\)") == 1.0
    assert score(reward, r"\boxed{1}, \boxed{-2}, \boxed{3}", gold=r"\boxed{1}, \boxed{-2}") == 0.0
    assert score(reward, r"\boxed{2}", gold=r"\boxed{1}, \boxed{2}") == 0.0


def test_think_part_only(reward):
    assert score(reward, r"<think>maybe \boxed{7}</think> so \boxed{1/2}") == 1.0
    assert score(reward, r"<think>\boxed{1/2}</think> I think it is \boxed{7}") == 0.0
    assert score(reward, r"<think>it is \boxed{1/2}") == 0.0  # reasoning never closed: no answer
    assert score(reward, r"the prompt pre-filled <think>; here \boxed{3} ... </think> \boxed{0.5}") == 1.0


def test_answer_line_option(reward):
    text = "Some work.\nThe answer is: $\\frac{1}{2}$."
    assert score(reward, text) == 0.0
    line = boxed_math(answer_line=True, timeout=2.0)
    assert score(line, text) == 1.0
    assert score(line, "Some work.\nFinal answer: 0.5") == 1.0
    assert score(line, "The answer is: 1/3") == 0.0
    assert score(line, r"\boxed{3}" + "\nThe answer is: 1/2") == 0.0  # a box takes precedence
    assert score(line, "so we get one half.The answer is: 1/2") == 1.0  # newlines lost: last sentence
    assert score(line, "I guess the answer is: 1/2 or 1/3") == 0.0


def test_conversational_and_columns(reward):
    conv = [
        [{"role": "assistant", "content": r"\boxed{1/2}"}],
        [{"role": "assistant", "content": [{"type": "text", "text": r"\boxed{0.5}"}]}],
        [{"role": "assistant", "content": None}],
        [{"role": "assistant", "content": r"\boxed{2}"}],
    ]
    assert reward([[{"role": "user", "content": "q"}]] * 4, conv, answer=[HALF, HALF, HALF, "2"]) == [1.0, 1.0, 0.0, 1.0]
    custom = boxed_math(gold_column="target", timeout=2.0)
    assert custom(None, [r"\boxed{2}"], target=["2"]) == [1.0]
    with pytest.raises(ValueError, match="gold_column"):
        custom(None, [r"\boxed{2}"], answer=["2"])
    # missing / empty gold: None (TRL ignores the row for this reward)
    assert reward(None, [r"\boxed{2}", r"\boxed{2}"], answer=[None, "  "]) == [None, None]


def test_hostile_answers_score_zero_within_deadline(reward):
    metrics = {}
    hostile = [
        "x" * 1_000_000 + r"\boxed{1/2}" + "y" * 1000 + r"\boxed{\frac{1}{2}" + "z" * 1_000_000,  # 2 MB, unbalanced
        r"\boxed{" + "9" * 1_000_000 + "}",  # 1 MB inside a box
        r"\boxed{10^{10^{10^{10}}}}",
        r"\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
        r"\boxed{" + "(" * 10_000 + "1" + ")" * 10_000 + "}",
        r"\boxed{\frac{1}{2}}",  # a right answer in the same batch still scores
    ]
    t = time.monotonic()
    out = reward(None, hostile, answer=[HALF] * len(hostile), log_metric=lambda k, v: metrics.__setitem__(k, v))
    elapsed = time.monotonic() - t
    assert out == [0.0] * 5 + [1.0]
    # the deadline is 2 CPU seconds per answer, capped at 5 x 2 wall seconds on a loaded machine: never a hang
    assert elapsed < 2 * 5 * 2.0 + 5
    assert metrics["boxed_math/rejected"] >= 2
    # 10^{10^{10^{10}}} for a value gold is refused on its syntax tree before anything evaluates it
    # (the tower of powers against an expression gold, which reaches math-verify's deadline: the test below)
    assert metrics["boxed_math/unevaluated"] >= 1


def test_a_costly_expression_checked_against_an_expression_gold_times_out(reward):
    """Where the gold is an expression (not a value), a tower of powers reaches math-verify: the deadline holds."""
    metrics = {}
    t = time.monotonic()
    out = reward(None, [r"\boxed{10^{10^{10^{10}}}}", r"\boxed{\sqrt{2}}"], answer=[r"\sqrt{2}"] * 2,
                 log_metric=lambda k, v: metrics.__setitem__(k, v))
    assert out == [0.0, 1.0]
    assert time.monotonic() - t < 2 * 5 * 2.0 + 5
    assert metrics["boxed_math/timeouts"] + metrics["boxed_math/errors"] == 1


def test_deadline_in_a_thread():
    """TRL calls reward functions off the main thread in some modes: the deadline must still hold."""
    reward = boxed_math(timeout=1.0)
    out, metrics = [], {}

    def run():
        out.append(
            # an expression gold (not a value): the tower of powers reaches math-verify and its deadline
            reward(None, [r"\boxed{10^{10^{10^{10}}}}", r"\boxed{2}"], answer=[r"\sqrt{2}", "2"],
                   log_metric=lambda k, v: metrics.__setitem__(k, v))
        )

    th = threading.Thread(target=run)
    t = time.monotonic()
    th.start()
    th.join(30)
    assert not th.is_alive()
    assert out == [[0.0, 1.0]]
    assert time.monotonic() - t < 5 * 1.0 + 5  # CPU deadline 1 s, wall-clock cap 5 s
    assert metrics["boxed_math/timeouts"] == 1.0
    # the pool recovered: the next call is served normally
    assert reward(None, [r"\boxed{3}"], answer=["3"]) == [1.0]


def test_pickle_and_name(reward):
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.__name__ == "boxed_math"
    assert clone(None, [r"\boxed{0.5}"], answer=[HALF]) == [1.0]


def test_grpo_shaped_batch_groups(reward):
    golds = [str(g) for g in range(8) for _ in range(4)]
    completions = [rf"\boxed{{{g if k % 2 == 0 else int(g) + 1}}}" for g in range(8) for k in range(4)]
    assert reward(None, completions, answer=golds) == [1.0, 0.0] * 16


def test_deadline_counts_cpu_time_not_waiting():
    """A task that waits (no CPU) is not killed at the deadline, only at the wall-clock cap."""
    from reward_plugins.boxed_math.pool import DeadlinePool

    pool = DeadlinePool(time.sleep, 1)
    try:
        assert pool.map([(None, 0.6)], deadline=0.3) == [("ok", None)]  # 0.6 s asleep, ~0 CPU seconds
        pool.wall_factor = 2.0
        t = time.monotonic()
        assert pool.map([(None, 30)], deadline=0.3) == [("timeout", None)]  # killed at the 0.6 s wall cap
        assert time.monotonic() - t < 5
    finally:
        pool.close()


def test_batch_timeout_bounds_a_whole_call():
    reward = boxed_math(timeout=30.0, batch_timeout=1.0)
    reward(None, [r"\boxed{1}"], answer=["1"])  # workers up
    metrics = {}
    t = time.monotonic()
    out = reward(None, [r"\boxed{10^{10^{10^{10}}}}"] * 2 + [r"\boxed{9^{9^{9^{9}}}}"] * 2, answer=[r"\sqrt{2}", r"\sqrt{3}", r"\sqrt{5}", r"\sqrt{6}"],
                 log_metric=lambda k, v: metrics.__setitem__(k, v))
    assert out == [0.0] * 4
    assert time.monotonic() - t < 6
    assert metrics["boxed_math/timeouts"] == 4


def test_bad_options():
    with pytest.raises(ValueError, match="timeout"):
        boxed_math(timeout=0)
    with pytest.raises(ValueError, match="max_answer_chars"):
        boxed_math(max_answer_chars=-1)


def test_hostile_answers_reaching_the_workers():
    """With the length cap lifted, deep nesting reaches math-verify: the deadline or an error gives 0."""
    big = boxed_math(max_answer_chars=100_000, timeout=1.5)
    hostile = [r"\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}", r"\boxed{" + "\\frac{1}{" * 3000 + "2" + "}" * 3000 + "}"]
    t = time.monotonic()
    assert big(None, hostile + [r"\boxed{1}"], answer=["1"] * 3) == [0.0, 0.0, 1.0]
    assert time.monotonic() - t < 2 * 5 * 1.5 + 5


def test_workers_exit_when_the_parent_dies(tmp_path):
    """Workers are not leaked: killing the parent (no atexit) closes their sockets; zygote and workers exit."""
    import os
    import signal
    import subprocess
    import sys

    code = (
        "import os, sys, time\n"
        "from reward_plugins.boxed_math import boxed_math\n"
        "from reward_plugins.boxed_math.pool import _POOLS\n"
        "boxed_math()(None, [r'\\boxed{1}'], answer=['1'])\n"
        "print(' '.join(str(p) for pool in _POOLS.values() for p in pool.pids()), flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert pids
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        try:  # a zombie (exited, not yet reaped by init) counts as gone
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)


def test_numeric_probe_is_only_a_shortcut(reward):
    """Wrong symbolic answers skip sympy's simplify; equal ones and math-verify's lenient cases still pass."""
    from reward_plugins.boxed_math import math_check as mc

    gold = mc.parse_gold("x^2+33x-33")
    assert mc._surely_different(gold, mc._parse_whole("37"))
    assert mc._surely_different(gold, mc._parse_whole("(x-2)^2"))
    assert not mc._surely_different(gold, mc._parse_whole("x(x+33)-33"))
    out = reward(None, [r"\boxed{x(x+33)-33}", r"\boxed{37}", r"\boxed{odd}", r"\boxed{(x+1)^2}"],
                 answer=["x^2+33x-33", "x^2+33x-33", r"\text{odd}", "x^2+2x+1"])
    assert out == [1.0, 0.0, 1.0, 1.0]


def test_prefilled_prompt_needs_closed_reasoning():
    from trl_rlvr.rewards.registry import load_reward

    plain, prefilled = load_reward("boxed_math", prestart=False), load_reward("boxed_math", prefilled=True, prestart=False)
    completions = ["3 + 4 = 7 \\boxed{7}", "3 + 4 = 7</think> The answer is \\boxed{7}."]
    answers = ["7", "7"]
    assert plain(completions=completions, answer=answers) == [1.0, 1.0]
    assert prefilled(completions=completions, answer=answers) == [0.0, 1.0]


# -- hedging: every box, at any depth, and everything in a box must be one answer -----------------------------

@pytest.mark.parametrize(
    "completion, gold",
    [
        (r"\boxed{\boxed{3}} \boxed{4}", "3"),  # a box inside a box is a box
        (r"\boxed{5 \boxed{12}}", "12"),
        (r"\boxed{5\fbox{12}}", "12"),
        (r"\framebox{4} \boxed{3}", "3"),  # other box commands are boxes
        (r"\boxed{3} \boxed \sqrt{2}", "3"),  # a box whose content cannot be told
        (r"\boxed{3 \text{ (or 4)}}", "3"),  # text that is not part of the answer
        (r"\boxed{12 \text{ or four}}", "12"),
        (r"\boxed{12\mbox{ or 5}}", "12"),
        (r"\boxed{12\mathrm{ or 5}}", "12"),
        (r"\boxed{12 \text{ (maybe) } 5 \text{ cm}}", "12"),
        (r"\boxed{4:30 \text{ a.m.}}", r"4:30\text{ p.m.}"),
        (r"\boxed{3 = 4}", "4"),  # an equation asserts one value
        (r"\boxed{x = 4 = 3}", "3"),
        (r"\boxed{x=5\quad x=12}", "12"),
        (r"\boxed{5 \equiv 12}", "12"),
        (r"\boxed{3 \approx 4}", "3"),  # an approximation must approximate
        (r"\boxed{x = 3 \approx 4}", "3"),
        (r"\boxed{3 ~= 4}", "3"),
        (r"\boxed{7 \\ \frac{1}{2}}", HALF),  # a fragment never stands for the whole box
        (r"\boxed{\begin{cases}7\\\frac{1}{2}\end{cases}}", HALF),
        (r"\boxed{7\relax \frac{1}{2}}", HALF),
        (r"\boxed{\overset{\frac{1}{2}}{7}}", HALF),
        (r"\boxed{12_{5}}", "12"),  # a subscript on a numeral is a base
    ],
)
def test_hedged_boxes_score_zero(reward, completion, gold):
    assert score(reward, completion, gold=gold) == 0.0


def test_equal_answers_up_to_text_wrapping_spacing_and_case(reward):
    pm = r"4:30\text{ p.m.}"
    for answer in (r"\text{4:30 p.m.}", r"4:30 \text{pm}", r"4:30\text{ P.M.}", r"4:30\mbox{ p.m.}", r"\text{4:30 PM}"):
        assert score(reward, rf"\boxed{{{answer}}}", gold=pm) == 1.0, answer
    assert score(reward, r"\boxed{4:30\text{ p.m.}}", gold=r"\text{4:30 p.m.}") == 1.0
    assert score(reward, r"\boxed{5:30\text{ p.m.}}", gold=pm) == 0.0
    assert score(reward, r"\boxed{\text{Evelyn}}", gold=r"\text{evelyn}") == 1.0
    assert score(reward, r"\boxed{\text{(B)}}", gold="B") == 1.0
    assert score(reward, r"\boxed{15\,\text{cm}^{2}}", gold=r"15\mbox{ cm}^2") == 1.0
    assert score(reward, r"\boxed{15\text{ m}^{2}}", gold=r"15\mbox{ cm}^2") == 0.0  # another unit


def test_one_answer_in_its_usual_forms_still_scores(reward):
    """The rules refuse a second value, not the ways one value is written (a thin-space grouping, 1\\,234, was
    read as 1 x 234 before them; the others passed before too)."""
    for completion, gold in [
        (r"\boxed{x = 3}", "3"), (r"\boxed{x = 2 + 1 = 3}", "3"), (r"\boxed{\frac{1}{3} \approx 0.33}", r"\frac13"),
        (r"\boxed{x \approx 11}", "11"), (r"\boxed{3\text{ cm}}", "3"), (r"\boxed{1\,234}", "1234"),
        (r"\boxed{8 \text{ and } 6}", r"6 \text{ and } 8"), (r"\boxed{1011_2}", "1011_2"),
        (r"\boxed{\boxed{3}}", "3"), (r"\boxed{1 - \frac{1}{\mathrm{e}}}", r"1 - \frac{1}{\mathrm{e}}"),
    ]:
        assert score(reward, completion, gold=gold) == 1.0, completion


# A composition of the gold G with another value O: in one box (joined, wrapped, hidden) or in another box.
_JOINERS = [",", ";", r"\text{ or }", r"\text{or}", " or ", r"\lor", r"\vee", r"\quad", r"\;", r"\\", "&", "|",
            r"\text{ and }", "=", r"\equiv", r"\neq", r"\le", r"\to", r"\Rightarrow", r"\mid", "~", r"\pm", ":="]
_WRAPPERS = [
    r"{G}\text{{ (or {O})}}", r"\text{{{G} or {O}}}", r"{G}\mbox{{ or {O}}}", r"{G}\mathrm{{ or {O}}}",
    r"{G}\textbf{{ (not {O})}}", r"{G} \text{{ cm}} {O}", r"{G}\phantom{{{O}}}", r"\overset{{{O}}}{{{G}}}",
    r"{G}_{{{O}}}", r"{G}^{{\text{{or }}{O}}}", r"{G}\tag{{{O}}}", r"\begin{{cases}}{G}\\{O}\end{{cases}}",
    r"{G} \pmod{{{O}}}", r"{G}\color{{white}}{O}", r"\cancel{{{O}}}{G}", r"x = {G} = {O}", r"x = {O} = {G}",
    r"{G} \approx {O}", r"x = {G} \approx {O}", r"{G}\;{O}",
]
_ARRANGEMENTS = [
    r"\boxed{{{G}}} \boxed{{{O}}}", r"\boxed{{{O}}} \boxed{{{G}}}", r"\boxed{{\boxed{{{G}}}}} \boxed{{{O}}}",
    r"\boxed{{{G} \boxed{{{O}}}}}", r"\boxed{{\boxed{{{O}}} {G}}}", r"\fbox{{{O}}} \boxed{{{G}}}",
    r"\framebox[2cm]{{{O}}} \boxed{{{G}}}", r"\colorbox{{white}}{{{O}}} \boxed{{{G}}}",
    r"\boxed{{{G}}} \boxed{{\text{{{O}}}}}", r"\boxed{{{G}}}\boxed{{}}\boxed{{{O}}}",
]
_ACCEPTED = [r"\boxed{{{G}}}", r"\boxed{{\boxed{{{G}}}}}", r"\fbox{{{G}}}", r"So it is $\boxed{{ {G} }}$.",
             r"\boxed{{x = {G}}}", r"\boxed{{{G}\text{{ cm}}}}", r"\boxed{{{G}}} so \boxed{{{G}}}",
             r"\boxed{{{G}}}\boxed{{}}", r"\boxed{{\displaystyle {G}}}", r"<think>\boxed{{{O}}}</think> \boxed{{{G}}}"]


def _number():
    from hypothesis import strategies as st

    integers = st.integers(1, 10**6).map(lambda n: (str(n), float(n)))
    decimals = st.tuples(st.integers(0, 999), st.integers(1, 99)).map(lambda t: (f"{t[0]}.{t[1]:02d}", t[0] + t[1] / 100))
    fractions = st.tuples(st.integers(1, 99), st.integers(2, 9)).filter(lambda t: t[0] % t[1]).map(
        lambda t: (rf"\frac{{{t[0]}}}{{{t[1]}}}", t[0] / t[1]))
    return st.one_of(integers, decimals, fractions)


def test_property_no_composition_of_the_gold_with_another_value_scores(reward):
    """Whatever G and O (at least 1 apart, so that O is not a rounding of G): every composition scores 0, and
    the plain gold in each accepted wrapping scores 1."""
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(gold=_number(), other=_number())
    def check(gold, other):
        (g, g_value), (o, o_value) = gold, other
        if abs(g_value - o_value) < 1:
            return
        hedges = [rf"\boxed{{{g} {j} {o}}}" for j in _JOINERS] + [rf"\boxed{{{o} {j} {g}}}" for j in _JOINERS]
        hedges += [r"\boxed{" + w.format(G=g, O=o) + "}" for w in _WRAPPERS]
        hedges += [a.format(G=g, O=o) for a in _ARRANGEMENTS]
        accepted = [a.format(G=g, O=o) for a in _ACCEPTED]
        out = reward(None, hedges + accepted, answer=[g] * (len(hedges) + len(accepted)))
        assert [c for c, r in zip(hedges, out) if r != 0.0] == []
        assert [c for c, r in zip(accepted, out[len(hedges):]) if r != 1.0] == []

    check()


@pytest.mark.parametrize("box", [r"72468 * 55", r"72468 \times 55", r"72468\cdot55", r"3985740 + 0", r"2 \cdot 1992870",
                                 r"\frac{7971480}{2}", r"1992870 \cdot 2", r"3985740^{1}"])
def test_an_integer_gold_needs_the_integer_not_the_question(reward, box):
    """``What is 72468 * 55?`` answered ``\boxed{72468 * 55}`` restates the question: math-verify finds it equal to
    3985740, so a policy could learn to copy the question into the box. An integer gold needs an integer."""
    metrics = {}
    out = reward(None, [rf"\boxed{{{box}}}", r"\boxed{3985740}", r"\boxed{3,985,740}"], answer=["3985740"] * 3,
                 log_metric=lambda k, v: metrics.__setitem__(k, v))
    assert out == [0.0, 1.0, 1.0]
    assert metrics["boxed_math/unevaluated"] == 1.0
