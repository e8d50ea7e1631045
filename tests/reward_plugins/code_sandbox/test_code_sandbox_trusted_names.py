"""code_sandbox, HumanEval-style check(): every name the test code reads besides the entry point is trusted.

The helpers and constants a check() relies on (HumanEval's ``poly``, ``encode_shift``, a constant they read) come
from the test code, the row's ``prompt_code`` column or its prompt, whatever the prompt's layout, and never from
the completion: a completion that redefines them (in its source, or at call time through its globals or
builtins) gains nothing. A row whose helpers have no trusted source is a configuration error, never scored.
Each hostile completion runs beside a correct one (1.0), then a correct and a wrong one follow on the same
worker (the pool has one) and are scored exactly.
"""

import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("reward_plugins.code_sandbox")
from reward_plugins.code_sandbox import code_sandbox  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

POLY = {  # HumanEval/32's shape: check() judges the answer with the prompt's helper, which reads an import
    "entry": "find_zero",
    "prompt": (
        "import math\n\n\ndef poly(xs: list, x: float):\n"
        "    return sum(coeff * math.pow(x, i) for i, coeff in enumerate(xs))\n\n\n"
        'def find_zero(xs: list):\n    """A zero of poly(xs, x), for xs of even length."""\n'
    ),
    "test": (
        "def check(candidate):\n"
        "    for coeffs in ([1, 2], [-6, 11, -6, 1], [2, -3, 0, 1]):\n"
        "        assert abs(poly(coeffs, candidate(list(coeffs)))) < 1e-4\n"
    ),
    "body": (
        "    lo, hi = -1.0, 1.0\n"
        "    while poly(xs, lo) * poly(xs, hi) > 0:\n"
        "        lo, hi = lo * 2, hi * 2\n"
        "    for _ in range(200):\n"
        "        mid = (lo + hi) / 2\n"
        "        if poly(xs, mid) * poly(xs, lo) > 0:\n"
        "            lo = mid\n"
        "        else:\n"
        "            hi = mid\n"
        "    return lo\n"
    ),
    "wrong": "    return 0.0\n",
    # wrong answers that make the candidate's own poly / math vouch for them
    "redefine": [
        "def poly(xs, x):\n    return 0.0\n",
        "class _M:\n    @staticmethod\n    def pow(x, i):\n        return 0.0\nmath = _M()\n",
    ],
}
SHIFT = {  # HumanEval/50's shape, with the shift in a prompt constant the helper reads
    "entry": "decode_shift",
    "prompt": (
        "SHIFT = 5\n\n\ndef encode_shift(s: str):\n"
        "    return ''.join(chr((ord(ch) + SHIFT - ord('a')) % 26 + ord('a')) for ch in s)\n\n\n"
        'def decode_shift(s: str):\n    """The inverse of encode_shift."""\n'
    ),
    "test": (
        "def check(candidate):\n"
        "    for s in ('abc', 'xyz', 'hello', 'shift'):\n"
        "        assert candidate(encode_shift(s)) == s\n"
    ),
    "body": "    return ''.join(chr((ord(ch) - SHIFT - ord('a')) % 26 + ord('a')) for ch in s)\n",
    "wrong": "    return s\n",
    "redefine": [
        "SHIFT = 0\n",
        "def encode_shift(s):\n    return s\n",
        "def chr(i):\n    return 'a'\n",
    ],
}
TASKS = {"poly": POLY, "shift": SHIFT}

#: A wrong entry point that rewrites the trusted side at call time: its module globals, the helpers, builtins.
MUTATING = {
    "poly": (
        "def find_zero(xs):\n"
        "    global poly, math\n"
        "    import builtins, sys\n"
        "    poly = lambda xs, x: 0.0\n"
        "    globals()['math'] = None\n"
        "    builtins.abs = lambda x: 0.0\n"
        "    sys.modules['math'].pow = lambda x, i: 0.0\n"
        "    return 0.0\n"
    ),
    "shift": (
        "def decode_shift(s):\n"
        "    global SHIFT, encode_shift\n"
        "    import builtins\n"
        "    SHIFT = 0\n"
        "    encode_shift = lambda s: s\n"
        "    builtins.chr = lambda i: 'a'\n"
        "    builtins.ord = lambda c: 97\n"
        "    return s\n"
    ),
}


def fenced(code: str, fence: str = "```", info: str = "python") -> str:
    return f"{fence}{info}\n{code}{fence}\n"


#: prompt layouts users feed: name -> task -> (prompts cell, extra row cells)
LAYOUTS = {
    "raw": lambda t: (t["prompt"], {}),
    "chat_python": lambda t: ([{"role": "user", "content": "Complete:\n" + fenced(t["prompt"])}], {}),
    "chat_Python": lambda t: ([{"role": "user", "content": "Complete:\n" + fenced(t["prompt"], info="Python")}], {}),
    "chat_py": lambda t: ([{"role": "user", "content": "Complete:\n" + fenced(t["prompt"], info="py")}], {}),
    "chat_bare": lambda t: ([{"role": "user", "content": "Complete:\n" + fenced(t["prompt"], info="")}], {}),
    "chat_tilde": lambda t: ([{"role": "user", "content": "Complete:\n" + fenced(t["prompt"], "~~~", "")}], {}),
    "prose": lambda t: ([{"role": "user", "content": f"Complete the code below.\n\n{t['prompt']}\nAnswer in Python."}], {}),
    "system": lambda t: (
        [{"role": "system", "content": "Helpers you may use:\n" + fenced(t["prompt"])}, {"role": "user", "content": "Go."}],
        {},
    ),
    "prefill": lambda t: (
        [
            {"role": "user", "content": "Complete:\n" + fenced(t["prompt"])},
            {"role": "assistant", "content": f"```python\ndef {t['entry']}("},
        ],
        {},
    ),
    "several_blocks": lambda t: (
        [{"role": "user", "content": "".join(f"Part:\n{fenced(part)}" for part in t["prompt"].split("\n\n\n"))}],
        {},
    ),
    "usage_after": lambda t: (
        [{"role": "user", "content": "Complete:\n" + fenced(t["prompt"]) + "Usage:\n" + fenced(f"{t['entry']}([1, 2])\n")}],
        {},
    ),
    "column_no_prompt": lambda t: (None, {"prompt_code": t["prompt"]}),
    "column_beside_chat": lambda t: ([{"role": "user", "content": "Solve the task."}], {"prompt_code": t["prompt"]}),
}


@pytest.fixture(scope="module")
def reward():
    f = code_sandbox(num_workers=1, timeout=3.0)  # one worker: every sample follows the previous one there
    f.pool.start()
    yield f
    f.close()


def program(task, body):
    """A completion as HumanEval models write it: the prompt (helpers and all) continued by a body."""
    return task["prompt"] + body


def score(reward, task, layout, completions):
    prompt, extra = LAYOUTS[layout](task)
    n = len(completions)
    rows = {"test": [task["test"]] * n, "entry_point": [task["entry"]] * n}
    rows.update({k: [v] * n for k, v in extra.items()})
    prompts = None if prompt is None else [prompt] * n
    return reward(prompts=prompts, completions=completions, **rows)


def hostile_programs(task_name):
    task = TASKS[task_name]
    redefined = [program(task, task["wrong"]) + "\n\n" + r for r in task["redefine"]]
    everything = program(task, task["wrong"]) + "\n\n" + "\n".join(task["redefine"])
    return [*redefined, everything, MUTATING[task_name]]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_redefined_helpers_never_win_in_any_layout(reward, task_name, layout):
    task = TASKS[task_name]
    correct, wrong = program(task, task["body"]), program(task, task["wrong"])
    for hostile in hostile_programs(task_name):
        assert score(reward, task, layout, [hostile, correct]) == [0.0, 1.0], hostile
    assert score(reward, task, layout, [correct, wrong]) == [1.0, 0.0]


@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_a_row_without_trusted_helpers_is_a_configuration_error(reward, task_name):
    """No prompt, or a prompt that does not define them: the call raises, naming the row, the names and the
    column to add, rather than scoring with the candidate's definitions."""
    task = TASKS[task_name]
    rows = {"test": [task["test"]] * 2, "entry_point": [task["entry"]] * 2}
    correct = program(task, task["body"])
    helper = "poly" if task_name == "poly" else "encode_shift"
    for prompts in (None, ["Write the function."] * 2, [[{"role": "user", "content": "Write it."}]] * 2):
        with pytest.raises(ValueError, match=rf"row 0: check\(\) reads .*{helper}.*'prompt_code'"):
            reward(prompts=prompts, completions=[correct] * 2, **rows)
    stub = [task["prompt"].replace("return", "pass  #")]  # the helper left for the completion to write
    with pytest.raises(ValueError, match="row 0"):
        reward(prompts=stub * 2, completions=[correct] * 2, **rows)
    assert score(reward, task, "raw", [correct, program(task, task["wrong"])]) == [1.0, 0.0]


def test_rows_are_checked_before_training():
    """``check_rows`` (called by trl_rlvr.checks before the model loads) finds the first row that cannot be
    scored and names it; with the helpers in the ``prompt_code`` column the same rows pass."""
    datasets = pytest.importorskip("datasets")
    from trl_rlvr.checks.columns import check_dataset_columns

    f = code_sandbox(isolation="rlimits")  # only its row check runs: no pool is started
    rows = {
        "prompt": [[{"role": "user", "content": "Solve it."}]] * 2,
        "test": [SHIFT["test"], "def check(candidate):\n    assert candidate(1) == 2\n"][::-1],
        "entry_point": ["decode_shift", "add"][::-1],
    }
    with pytest.raises(ValueError, match=r"row 1: check\(\) reads encode_shift"):
        check_dataset_columns(datasets.Dataset.from_dict(rows), [f])
    check_dataset_columns(datasets.Dataset.from_dict({**rows, "prompt_code": ["", SHIFT["prompt"]]}), [f])
    assert f._pool is None


def test_a_trusted_name_the_test_code_defines_wins_over_the_prompt(reward):
    task = dict(SHIFT, test="SHIFT = 5\n" + SHIFT["test"], prompt=SHIFT["prompt"].replace("SHIFT = 5", "SHIFT = 7"))
    correct7 = program(task, task["body"])  # the prompt's helpers with the prompt's SHIFT = 7 on both sides
    assert score(reward, task, "raw", [correct7]) == [0.0]  # check()'s encode_shift reads the test's SHIFT = 5
    fixed = task["prompt"] + "    return ''.join(chr((ord(ch) - 5 - ord('a')) % 26 + ord('a')) for ch in s)\n"
    assert score(reward, task, "raw", [fixed, program(task, task["wrong"])]) == [1.0, 0.0]


# ---------------------------------------------------------------- property: layouts x redefinitions
FENCES = [("```", "python"), ("```", "Python"), ("```", "py"), ("```", "python3"), ("```", ""), ("~~~", ""), ("````", "python")]


@st.composite
def prompt_layout(draw, task):
    """A prompt a user could feed: the task's code raw, or in a chat in any fence (or none), with a system
    message, prose around it, a usage example after it, an assistant prefill; or in the prompt_code column."""
    if draw(st.booleans()) and draw(st.booleans()):
        return task["prompt"], {}
    fence, info = draw(st.sampled_from(FENCES))
    code = task["prompt"] if draw(st.booleans()) else fenced(task["prompt"], fence, info)
    before = draw(st.sampled_from(["", "Complete the function.\n\n", "Here is the code:\n"]))
    after = draw(st.sampled_from(["", "\nExplain nothing.", "\nUsage:\n" + fenced(f"{task['entry']}([1, 2])\n", fence, info)]))
    messages = [{"role": "user", "content": before + code + after}]
    if draw(st.booleans()):
        messages.insert(0, {"role": "system", "content": draw(st.sampled_from(["You write Python.", fenced("x = 1\n")]))})
    if draw(st.booleans()):
        messages.append({"role": "assistant", "content": draw(st.sampled_from(["```python\n", f"def {task['entry']}("]))})
    extra = {"prompt_code": task["prompt"]} if draw(st.booleans()) else {}
    return messages, extra


@st.composite
def wrong_answer(draw, task_name):
    task = TASKS[task_name]
    parts = draw(st.lists(st.sampled_from([*task["redefine"], MUTATING[task_name]]), min_size=1, max_size=3))
    head = task["prompt"] + task["wrong"] if draw(st.booleans()) else ""
    fence = draw(st.sampled_from(["", "```python\n"]))
    return fence + head + "\n\n".join(parts) + ("```\n" if fence else "")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_property_a_wrong_answer_never_scores_one(reward, data):
    task_name = data.draw(st.sampled_from(sorted(TASKS)))
    task = TASKS[task_name]
    prompt, extra = data.draw(prompt_layout(task))
    hostile = data.draw(wrong_answer(task_name))
    rows = {"test": [task["test"]] * 2, "entry_point": [task["entry"]] * 2, **{k: [v] * 2 for k, v in extra.items()}}
    got = reward(prompts=[prompt] * 2, completions=[hostile, program(task, task["body"])], **rows)
    assert got == [0.0, 1.0]
