"""``PythonEnvironment``: the sandboxed Python tool for TRL's ``environment_factory``.

State persists within a rollout and never across resets or between instances; the hostile programs of the
reward's suite, run as cells (and their functions called in a later cell), are contained: they fail, or harm
only their own interpreter, which is then replaced; a neighbor rollout's state and the next rollout are intact.
"""

import inspect
import os
import re
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

from reward_plugins.code_sandbox import PythonEnvironment, environment  # noqa: E402
from reward_plugins.code_sandbox.host import interpreter_server, launcher  # noqa: E402
from tests.reward_plugins.code_sandbox.test_code_sandbox_hostile import HOSTILE  # noqa: E402

TIMEOUT = 1.0


@pytest.fixture()
def env():
    with PythonEnvironment(timeout=TIMEOUT, rollout_timeout=30.0, memory_mb=512) as e:
        e.reset()
        yield e


@pytest.fixture()
def neighbor():
    """A second rollout, live beside the one under attack, with state of its own."""
    with PythonEnvironment(timeout=TIMEOUT, rollout_timeout=30.0, memory_mb=512) as e:
        e.reset()
        assert e.python("canary = 41\nopen('mine.txt', 'w').write('kept')") == "4\n"
        yield e


# ------------------------------------------------------------------------------------------------ the tool
def test_tool_schema_is_what_trl_offers():
    from transformers.utils import get_json_schema

    e = PythonEnvironment()
    # TRL offers every public function of the environment's class except reset/get_reward as a tool
    public = [n for n, _ in inspect.getmembers(type(e), predicate=inspect.isfunction)
              if n not in ("reset", "get_reward") and not n.startswith("_")]  # fmt: skip
    assert public == ["python"]
    schema = get_json_schema(e.python)["function"]
    assert schema["name"] == "python"
    assert schema["parameters"]["required"] == ["code"]
    assert schema["parameters"]["properties"]["code"]["type"] == "string"
    assert "persist" in schema["description"]


def test_notebook_replies(env):
    assert env.python("x = 6\nx * 7") == "42\n"
    assert env.python("print('a'); print('b')\nx + 1") == "a\nb\n7\n"
    assert env.python("import math\nmath.factorial(30)") == f"{__import__('math').factorial(30)}\n"
    assert env.python("_ + 1") == f"{__import__('math').factorial(30) + 1}\n"  # the last value, as in a notebook
    assert env.python("y = 1") == "(no output)"
    assert env.python("None") == "(no output)"
    assert env.python("2 ** 20000 > 0") == "True\n"
    assert len(env.python("str(7 ** 20000)")) <= env.limits.max_output_chars  # big ints print, clipped
    out = env.python("def f(n):\n    return 1 / n\nf(0)")
    assert out.startswith("Traceback (most recent call last):\n  File \"<cell 9>\", line 3, in <module>\n    f(0)\n")
    assert out.endswith("ZeroDivisionError: division by zero\n") and "interpreter.py" not in out
    assert env.python("def g(:") .endswith("SyntaxError: invalid syntax\n")
    assert env.python("import sys\nsys.exit(3)").endswith("SystemExit: 3\n")  # the interpreter lives on
    assert env.python("x") == "6\n"
    assert env.stats == {"calls": 12, "errors": 3, "timeouts": 0, "restarts": 0, "printed_errors": 0}


def test_output_and_code_are_bounded(env):
    limit = env.limits.max_output_chars
    flood = env.python("print('x' * 10**6)\nprint('end')")
    assert len(flood) <= limit and "more characters of output not shown" in flood
    deep = env.python("def r(n):\n    return r(n + 1)\nr(0)")
    assert len(deep) <= limit and deep.rstrip().endswith("maximum recursion depth exceeded")
    assert env.python("'y' * 10**6").count("characters cut") == 1
    assert env.python("x = 1\n" * 20000).startswith("error: the code has")
    assert env.python(123).startswith("error: code must be a string")


def test_cell_timeout_keeps_state_and_hard_timeout_restarts(env):
    env.python("kept = 1")
    t = time.monotonic()
    assert env.python("import time\ntime.sleep(100)") == f"timed out after {TIMEOUT:g} s\n"
    assert env.python("kept") == "1\n"  # the alarm stopped the cell; the interpreter is the same
    out = env.python("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass")
    assert out.startswith(f"timed out after {TIMEOUT:g} s; the interpreter was restarted")
    assert time.monotonic() - t < 2 * TIMEOUT + 2 * environment.GRACE_S + 2
    assert "NameError" in env.python("kept")  # a fresh interpreter, as the reply said
    assert env.stats["timeouts"] == 2 and env.stats["restarts"] == 1


def test_rollout_budget():
    with PythonEnvironment(timeout=0.5, rollout_timeout=1.2) as e:
        e.reset()
        replies = [e.python("while True:\n    pass") for _ in range(3)]
        assert replies[:2] == ["timed out after 0.5 s\n"] * 2
        assert re.match(r"stopped after 0\.\d s: this rollout's 1\.2 s of run time are used up", replies[2])
        assert e.python("1").startswith("not run: this rollout's 1.2 s of run time are used up")
        assert e.stats["timeouts"] == 4 and e.stats["restarts"] == 1
        e.reset()  # a new rollout, a new budget
        assert e.python("1") == "1\n"


# ------------------------------------------------------------------------------------------------ isolation
def test_state_persists_within_a_rollout_only(env, neighbor):
    env.python("import json\nvalue = [1, 2]\nopen('f.txt', 'w').write('hi')\nimport os\nos.environ['SECRET'] = 's'")
    got = env.python("value, open('f.txt').read(), json.dumps(1), os.environ.get('SECRET')")
    assert got == "([1, 2], 'hi', '1', 's')\n"
    assert "NameError" in neighbor.python("value")
    assert neighbor.python("import os\nsorted(os.listdir('.')), dict(os.environ)") == "(['mine.txt'], {})\n"
    env.reset()
    for probe in ("value", "json", "os"):
        assert f"NameError: name '{probe}' is not defined" in env.python(probe)
    assert env.python("import os, sys\nos.listdir('.'), dict(os.environ), 'json' in sys.modules") == "([], {}, True)\n"
    # json is in sys.modules because the clean server pre-imports it for every interpreter, not from the last rollout
    assert neighbor.python("canary + 1, open('mine.txt').read()") == "(42, 'kept')\n"


def test_module_state_does_not_survive_reset(env):
    env.python("import math\nmath.pi = 3\nimport builtins\nbuiltins.abs = lambda x: 0\nimport random\nrandom.seed(0)")
    assert env.python("math.pi, abs(-1)") == "(3, 0)\n"
    draws = env.python("random.random()")
    env.reset()
    assert env.python("import math\nmath.pi, abs(-1)") == f"({__import__('math').pi!r}, 1)\n"
    assert env.python("import random\nrandom.random()") != draws  # every interpreter is reseeded at fork


def test_cannot_see_other_interpreters_files_or_processes(env, neighbor):
    out = env.python("import os\n[p for p in ('/tmp', '..', '/proc', '/sbx', '/etc')\n"
                     " if os.path.exists(p) and os.access(p, os.R_OK) and os.listdir(p)]")
    assert out == "[]\n" or "PermissionError" in out
    assert env.python("import os\nopen('f', 'w').close()\nos.listdir('/tmp'), os.getcwd()") == "(['f'], '/tmp')\n"
    assert "Error" in env.python("import os\nos.kill(1, 9)")  # pid 1 of the sandbox: the server
    assert neighbor.python("canary") == "41\n"


def _server_uid():
    server = interpreter_server._SERVERS.get("bwrap")
    return launcher.slot_uid(0, server.claim.id) if server is not None else None


def _processes_of(uid):
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    out.append(pid)
            except OSError:
                pass
    return out


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_programs_as_cells(env, neighbor, name):
    """Each hostile program as one cell, then its function called in the next cell (across turns)."""
    uid = _server_uid()
    # root: the server and its interpreters run as the pool uid; the processes there before the cell (the server,
    # this test's two interpreters, other environments this test process still holds) are the baseline
    before = set(_processes_of(uid)) if uid is not None else set()
    t = time.monotonic()
    replies = [env.python(HOSTILE[name]), env.python("add(1, 2)"), env.python("ok if 'ok' in dir() else None")]
    for reply in replies:
        assert isinstance(reply, str) and len(reply) <= env.limits.max_output_chars
    if "ok = False" in HOSTILE[name] and env.stats["restarts"] == 0:
        assert replies[2] == "False\n", f"the attack worked: {replies}"  # its body raised: it failed
    assert time.monotonic() - t < 3 * (TIMEOUT + environment.GRACE_S) + 5
    assert neighbor.python("canary + 1, open('mine.txt').read()") == "(42, 'kept')\n"
    env.reset()  # the next rollout: nothing left, everything works
    assert env.python("import os\n1 + 1, os.listdir('.'), dict(os.environ)") == "(2, [], {})\n"
    if uid is not None:  # nothing the cell started outlives it: at most env's new interpreter and one dying
        deadline = time.monotonic() + 5
        while len(set(_processes_of(uid)) - before) > 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(set(_processes_of(uid)) - before) <= 2, sorted(set(_processes_of(uid)) - before)


TOOL_ATTACKS = {  # aimed at the tool's own machinery
    "fake_reply_frame": (
        "import os\nfor fd in range(3, 64):\n    try:\n"
        "        os.write(fd, (9).to_bytes(4, 'big') + b'ofake' + b'\\xff' * 8)\n    except OSError:\n        pass"
    ),
    "steal_next_cell": (
        "import threading, os\nfor fd in range(3, 64):\n"
        "    threading.Thread(target=os.read, args=(fd, 1 << 20), daemon=True).start()"
    ),
    "patch_reply_writer": (
        "import sys\nm = sys.modules['reward_plugins.code_sandbox.sandbox.interpreter']\nm.write_frame = lambda *a: None"
    ),
    "close_channels": "import os\nos.closerange(3, 64)",
    "memory_hog_slowly": "xs = []\nwhile True:\n    xs.append(bytearray(1 << 24))",
    "thread_bomb_busy": (
        "import threading\nfor _ in range(10000):\n"
        "    threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()"
    ),
    "alarm_disarm": (
        "import signal\nsignal.setitimer(signal.ITIMER_REAL, 0)\nsignal.alarm(0)\nimport time\ntime.sleep(100)"
    ),
    "segfault": "import ctypes\nctypes.string_at(0)",
    "socket": "import socket\nsocket.socket()",
}


@pytest.mark.parametrize("name", sorted(TOOL_ATTACKS))
def test_attacks_on_the_tool_channel(env, neighbor, name):
    env.python("kept = 1")
    for _ in range(2):
        reply = env.python(TOOL_ATTACKS[name])
        assert isinstance(reply, str) and len(reply) <= env.limits.max_output_chars
        env.python("kept")  # whatever the interpreter's state, the host goes on
    assert neighbor.python("canary + 1") == "42\n"
    env.reset()
    assert env.python("1 + 1") == "2\n"


def test_a_host_that_forked_gets_its_own_server():
    with PythonEnvironment() as e:
        e.reset()
        assert e.python("1") == "1\n"
        server = interpreter_server._SERVERS["bwrap"]
        server.pid = -1  # as a forked child sees a server it did not start
        e.reset()
        assert interpreter_server._SERVERS["bwrap"] is not server and e.python("2") == "2\n"
        server.pid = os.getpid()
        server.close()


# ------------------------------------------------------------------------------------------------ properties
NAMES = st.sampled_from(["a", "b", "c"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(0, 1), NAMES, st.integers(-5, 5)),
        st.tuples(st.just("get"), st.integers(0, 1), NAMES),
        st.tuples(st.just("write"), st.integers(0, 1), NAMES, st.integers(0, 9)),
        st.tuples(st.just("read"), st.integers(0, 1), NAMES),
        st.tuples(st.just("reset"), st.integers(0, 1)),
    ),
    max_size=12,
)


@pytest.fixture(scope="module")
def pair():
    envs = [PythonEnvironment(timeout=2.0), PythonEnvironment(timeout=2.0)]
    yield envs
    for e in envs:
        e._close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_cell_sequences_match_a_model_of_two_rollouts(pair, ops):
    """Two live environments, random cells and resets: each sees exactly the names and files of its own
    rollout since its last reset."""
    names, files = [{}, {}], [{}, {}]
    for e in pair:
        e.reset()
    for op in ops:
        kind, i = op[0], op[1]
        e = pair[i]
        if kind == "reset":
            e.reset()
            names[i], files[i] = {}, {}
        elif kind == "set":
            assert e.python(f"{op[2]} = {op[3]}") == "(no output)"
            names[i][op[2]] = op[3]
        elif kind == "get":
            out = e.python(op[2])
            assert out == (f"{names[i][op[2]]}\n" if op[2] in names[i] else out)
            if op[2] not in names[i]:
                assert re.search(rf"NameError: name '{op[2]}' is not defined\n$", out)
        elif kind == "write":
            e.python(f"open('{op[2]}.txt', 'w').write('{op[3]}')")
            files[i][op[2]] = str(op[3])
        else:
            out = e.python(f"open('{op[2]}.txt').read()")
            assert out == (f"{files[i][op[2]]!r}\n" if op[2] in files[i] else out)
            if op[2] not in files[i]:
                assert "FileNotFoundError" in out


# ------------------------------------------------------------------------------------------------ get_reward
def test_tests_environment_judges_the_cells_by_the_rows_tests_not_by_the_interpreter():
    from reward_plugins.code_sandbox import PythonTestsEnvironment, code_sandbox

    reward = code_sandbox(num_workers=1, timeout=2.0)
    row = {"prompt": "write double", "tests": ["assert double(2) == 4", "assert double(-1) == -2"]}
    with PythonTestsEnvironment(reward=reward, timeout=TIMEOUT) as e:
        e.reset(**row)
        e.python("def double(x):\n    return x * 2")
        e.python("double(21)")
        assert e.get_reward() == 1.0
        e.reset(**row)  # the interpreter says yes; the verdict path says no
        e.python("def double(x):\n    return x * 3\nclass Yes:\n    def __eq__(self, o):\n        return True")
        e.python("print('all tests passed')")
        assert e.get_reward() == 0.0
        e.reset(**row)  # a cell that raised is left out whole: double is defined in the interpreter, not in the program
        e.python("def double(x):\n    return x * 2\n1 / 0")
        assert e.python("double(2)") == "4\n" and e.get_reward() == 0.0
        e.reset(prompt="no tests here")
        assert e.get_reward() is None
    reward.close()


def test_options_are_checked_with_their_names():
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        PythonEnvironment(timeout=0)
    with pytest.raises(ValueError, match="max_output_chars must be at least 200"):
        PythonEnvironment(max_output_chars=10)
    with pytest.raises(ValueError, match="isolation must be 'bwrap' or 'rlimits'"):
        PythonEnvironment(isolation="none")
    with pytest.raises(TypeError):
        PythonEnvironment(5.0)  # keyword arguments only: TRL calls the factory with none


def test_rlimits_isolation_runs_and_persists():
    with PythonEnvironment(isolation="rlimits", timeout=TIMEOUT) as e:
        e.reset()
        assert e.python("import os\nx = 5\nos.listdir('.')") == "[]\n"
        assert e.python("x * 2") == "10\n"
        assert "Error" in e.python("import os\nos.fork()")  # the seccomp allowlist holds here too
        e.reset()
        assert "NameError" in e.python("x")


# ------------------------------------------------------------------------------- the errors a rollout shows
RAISED = "xs = [1, 2]\nxs[5]"
#: The same IndexError, caught and shown in the ways a policy could learn to; each still counts as one error.
CAUGHT_AND_SHOWN = {
    "print_exc": "import traceback\ntry:\n    [1, 2][5]\nexcept Exception:\n    traceback.print_exc()",
    "format_exc_to_stdout": "import traceback\ntry:\n    [1, 2][5]\nexcept Exception:\n    print(traceback.format_exc())",
    "stderr_line": "import sys\ntry:\n    [1, 2][5]\nexcept Exception as e:\n    print(f'{type(e).__name__}: {e}', file=sys.stderr)",
    "repr": "try:\n    [1, 2][5]\nexcept Exception as e:\n    print(repr(e))",
    "logging": "import logging\ntry:\n    [1, 2][5]\nexcept Exception:\n    logging.exception('failed')",
    "fake_traceback": "print('Traceback (most recent call last):\\n  File x\\nValueError: printed')",
    "then_more_output": "import traceback\ntry:\n    [1, 2][5]\nexcept Exception:\n    traceback.print_exc()\nprint(42)\n7",
}
#: Exits: each ends the cell as a raised one (SystemExit) or kills the interpreter (a restart, counted an error).
EXITS = {"sys_exit_1": "import sys\nsys.exit(1)", "system_exit": "raise SystemExit(1)", "os_exit": "import os\nos._exit(1)"}


@pytest.mark.parametrize("code", CAUGHT_AND_SHOWN.values(), ids=CAUGHT_AND_SHOWN)
def test_an_error_caught_and_shown_counts_as_the_raised_one(env, code):
    """Resample-on-correct keeps the right rollouts with the fewest shown errors: catching an error and printing it
    must not make it disappear (the raised one counted 1, the printed one 0, and the hider was always kept)."""
    from trl_rlvr.algorithms.metrics import shown_tool_errors

    with PythonEnvironment(timeout=TIMEOUT, rollout_timeout=30.0, memory_mb=512) as honest:
        honest.reset()
        assert "IndexError" in honest.python(RAISED)
        env.python(code)
        assert env.stats["errors"] == 0 and env.stats["printed_errors"] == 1  # ran to the end: not cut (ToRL)
        assert shown_tool_errors([honest, env]) == [1.0, 1.0]


@pytest.mark.parametrize("code", EXITS.values(), ids=EXITS)
def test_an_exit_counts_as_an_error(env, code):
    from trl_rlvr.algorithms.metrics import shown_tool_errors

    env.python(code)
    assert env.stats["errors"] == 1 and shown_tool_errors([env]) == [1.0]


def test_clean_output_counts_no_error(env):
    for code in ("print('Errors found: 0')", "print('no error here')", "print('ValueErrors are rare')", "1 + 1"):
        env.python(code)
    assert env.stats["printed_errors"] == 0 and env.stats["errors"] == 0


def test_the_hider_is_no_longer_always_kept():
    """Two right rollouts, the same IndexError raised by one and caught and printed by the other: before, the hider
    had 0 errors and was kept in 20 of 20 draws. Now they tie, and the draws keep either."""
    import torch

    from trl_rlvr.algorithms.metrics import shown_tool_errors
    from trl_rlvr.algorithms.multi_turn import resample_on_correct

    with PythonEnvironment(timeout=TIMEOUT) as honest, PythonEnvironment(timeout=TIMEOUT) as hider:
        honest.reset()
        hider.reset()
        honest.python(RAISED)
        hider.python(CAUGHT_AND_SHOWN["print_exc"])
        errors = torch.tensor(shown_tool_errors([honest, hider, None, None]))
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])  # two right, two wrong: keep one right and one wrong
    generator = torch.Generator().manual_seed(0)
    kept = [resample_on_correct(rewards, errors, 4, 2, generator=generator).tolist() for _ in range(20)]
    assert {k[0] for k in kept} == {0, 1}
