"""ToRL's error replies as an option of the environment: ``PythonEnvironment(error_reply="last_line")``.

The cut used to live in two places (a wrapper of TRL's tool dicts in the trainer's tool loop, and a subclass of
``PythonEnvironment`` for the tool job's evaluation); both cut a reply with
``last_error_line(reply) if stats["errors"] went up during the call else reply``. :func:`old_cut` is that rule,
copied, applied to a ``error_reply="full"`` environment; the option must give the same bytes, for cells that
raised, cells that printed a fake traceback, normal output, refusals, and cells sent ahead (the trainer's rounds).
"""

from __future__ import annotations

import sys
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

from reward_plugins.code_sandbox import PythonEnvironment  # noqa: E402
from trl_rlvr.algorithms.multi_turn import last_error_line  # noqa: E402

OPTIONS = dict(timeout=1.0, rollout_timeout=600.0, memory_mb=512)
FAKE = "print('Traceback (most recent call last):\\n  File \"<cell>\", line 1\\nValueError: printed, not raised')"

CELLS = [
    "x = 6\nx * 7",  # a value
    "print('hello')\nprint('world')",  # output of two lines
    "print(y * 28)",  # NameError
    "print('before')\n1/0",  # output, then a traceback
    "print(347 *)",  # SyntaxError
    "raise ValueError('line one\\nline two\\n\\n')",  # a message of several lines
    "raise RuntimeError('x' * 2000)",  # a long last line: bounded
    FAKE,  # a fake traceback, printed: output
    "import sys\nsys.stderr.write('Traceback (most recent call last):\\nKeyError: 1\\n')",  # on stderr: output
    "try:\n    1/0\nexcept Exception:\n    import traceback; traceback.print_exc()",  # caught and printed
    "raise SystemExit(3)",  # an exit
    "import os\nos._exit(0)",  # the interpreter died: restarted
    "while True:\n    pass",  # a timeout: not an error
    "",  # nothing
    "print('   ')\nraise KeyError('')",  # a blank line before the error
    "x",  # x is gone after the restart: NameError
]
REFUSED = [12345, "#" * 70000]  # not a string; too long (counted as errors, one line each)


def old_cut(env: PythonEnvironment, call) -> str:
    """The rule both copies applied (``_cut_error_replies``, ``ShortErrorsPythonEnvironment.python``)."""
    errors = env.stats["errors"]
    reply = call()
    return last_error_line(reply) if isinstance(reply, str) and env.stats["errors"] > errors else reply


@pytest.fixture()
def pair():
    """Two rollouts fed the same cells: one replying in full (cut by :func:`old_cut`), one with the option."""
    with PythonEnvironment(**OPTIONS) as full, PythonEnvironment(**OPTIONS, error_reply="last_line") as short:
        full.reset(), short.reset()
        yield full, short


def test_the_option_gives_the_old_cuts_bytes_on_every_kind_of_cell(pair):
    full, short = pair
    for code in CELLS + REFUSED:
        assert short.python(code) == old_cut(full, lambda code=code: full.python(code)), code
        assert short.stats == full.stats
    assert full.stats["errors"] >= 8 and full.stats["printed_errors"] >= 2 and full.stats["timeouts"] == 1
    assert short.python("print(y)") == "NameError: name 'y' is not defined"
    assert short.python(FAKE).startswith("Traceback (most recent call last):\n")  # output is never cut


def test_cells_sent_ahead_are_cut_as_the_trainers_rounds_were(pair):
    """The trainer sends a turn's cells ahead (``_dispatch_call``) and TRL's call collects; a cell sent ahead for
    a call that did not come as sent runs and counts within the next call (so that call's reply is cut too, as
    the old wrapper, measuring around the same call, cut it)."""
    full, short = pair
    for sent, called in [("1/0", "1/0"), (FAKE, FAKE), ("print(2)", "print(2)"), ("1/0", "print(3)"),
                         ("print(4)", "1/0")]:
        for env in (full, short):
            env._dispatch_call("python", {"code": sent})
        assert short.python(called) == old_cut(full, lambda called=called: full.python(called)), (sent, called)
        assert short.stats == full.stats


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=400) | st.lists(
    st.sampled_from(["Traceback (most recent call last):", '  File "<cell>", line 1', "ValueError: no", "", "  ",
                     "KeyboardInterrupt", "x" * 350, "error: made up"]), max_size=8).map("\n".join)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT, how=st.sampled_from(["print", "stderr", "raise", "print_then_raise", "exit"]))
def test_any_output_or_error_message_gives_the_old_cuts_bytes(pair, text, how):
    full, short = pair
    code = {
        "print": f"print({text!r})",
        "stderr": f"import sys\nsys.stderr.write({text!r})",
        "raise": f"raise ValueError({text!r})",
        "print_then_raise": f"print({text!r})\nraise Exception({text!r})",
        "exit": f"raise SystemExit({text!r})",
    }[how]
    assert short.python(code) == old_cut(full, lambda: full.python(code))
    assert short.stats == full.stats


def test_the_option_is_checked_and_the_tool_schema_is_unchanged():
    from transformers.utils import get_json_schema

    with pytest.raises(ValueError, match="error_reply must be one of"):
        PythonEnvironment(error_reply="short")
    assert get_json_schema(PythonEnvironment(error_reply="last_line").python) == get_json_schema(
        PythonEnvironment().python)


@pytest.mark.parametrize("config,factory,expected", [
    ("last_line", "full", "last_line"),  # tool_error_reply sets it on the trainer's environments
    ("full", "last_line", "last_line"),  # the default leaves the factory's own (the tool job's --short_tool_errors)
    ("full", "full", "full"),
])
def test_tool_error_reply_sets_the_option_on_the_trainers_environments(tiny_model_dir, config, factory, expected):
    from tests.rollouts.test_tool_rollouts import make_trainer

    trainer = make_trainer(tiny_model_dir, tool_error_reply=config,
                           environment_factory=partial(PythonEnvironment, error_reply=factory))
    # TRL builds the rollouts' environments from these, per batch (TRL 1.16: a pool it grows as batches need)
    built = [factory() for factory in trainer.environment_factories.values()]
    assert built and {env.error_reply for env in built} == {expected}
