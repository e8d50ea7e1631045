"""The Python tool keeps one rollout from touching another, the server or the host, by construction.

Each class of attack has a hostile rollout, a correct rollout beside it that must still work, and a later rollout
on the same server that must still answer exactly: reaching siblings (their files, the server's objects), breaking
what is shared, leftovers that outgrow cleanup, CPU between calls, a server killed from outside. Then a property:
any sequence of cells from a hostile alphabet leaves every concurrent and later rollout's replies identical to a
run without it. Plus: a tool turn costs about its slowest call (the trainer's round dispatch), and
``PythonTestsEnvironment`` scores and checks every column ``code_sandbox`` reads.
"""

import functools
import os
import signal
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

from reward_plugins.code_sandbox import PythonEnvironment, PythonTestsEnvironment  # noqa: E402
from reward_plugins.code_sandbox.host import interpreter_server  # noqa: E402

TIMEOUT = 2.0
OPTIONS = dict(timeout=TIMEOUT, rollout_timeout=60.0, memory_mb=512)

# A correct rollout's script and its replies (its own files, arithmetic, a counter across calls).
HONEST = [
    ("open('notes.txt', 'w').write('x' * 1000)", "1000\n"),
    ("import os\nsorted(os.listdir('.')), os.path.getsize('notes.txt')", "(['notes.txt'], 1000)\n"),
    ("n = sum(i * i for i in range(1000))\nn", "332833500\n"),
    ("import threading\nt = threading.Thread(target=lambda: None)\nt.start(); t.join()\nn + 1", "332833501\n"),
    ("open('notes.txt').read().count('x'), open('big', 'wb').write(bytes(1 << 20))", "(1000, 1048576)\n"),
]


def run_honest(env, steps=HONEST):
    return [env.python(code) for code, _ in steps]


def expect_honest(env, steps=HONEST):
    assert run_honest(env, steps) == [want for _, want in steps]


@pytest.fixture()
def envs():
    made = []

    def make(**kw):
        e = PythonEnvironment(**{**OPTIONS, **kw})
        made.append(e)
        e.reset()
        return e

    yield make
    for e in made:
        e._close()


# ------------------------------------------------------------------------------------------------ 1. siblings
def _frames_fingerprint_cell():
    # everything the interpreter's own call stack holds above the REPL: the frames it was forked in
    return (
        "import sys\nf, out = sys._getframe(), []\n"
        "while f is not None:\n"
        "    if not f.f_code.co_filename.startswith('<cell'):\n"
        "        out.append((f.f_code.co_name, sorted((k, repr(v)) for k, v in f.f_locals.items()\n"
        "                   if isinstance(v, (int, str, bytes, float, list, dict, tuple)) and k not in ('ns', 'src', 'number'))))\n"
        "    f = f.f_back\n"
        "out"
    )


def test_an_interpreter_holds_nothing_of_the_server_or_of_other_rollouts(envs):
    first = envs()
    before = first.python(_frames_fingerprint_cell())
    others = [envs() for _ in range(3)]
    for k, e in enumerate(others):
        assert e.python(f"secret = 'rollout-{k}'; open('f{k}', 'w').write(secret)") == "9\n"
    later = envs()
    after = later.python(_frames_fingerprint_cell())
    assert after == before  # the same image for every rollout: no id, path or table of the others
    assert "rollout-" not in later.python(
        "import gc\n[o for o in gc.get_objects() if isinstance(o, (dict, list))\n"
        " for v in (o.values() if isinstance(o, dict) else o) if isinstance(v, str) and v.startswith('rollout-')]"
    )


def test_a_rollout_cannot_name_stat_or_chmod_a_siblings_files(envs):
    victim = envs()
    assert victim.python("import os; os.chmod('.', 0o755); open('mine.txt', 'w').write('kept')") == "4\n"
    attacker = envs()
    out = attacker.python(
        "import os\nfound, changed = [], []\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    if root.startswith(('/usr', '/sbx')): dirs[:] = []; continue\n"
        "    found += [os.path.join(root, n) for n in files if n == 'mine.txt']\n"
        "    for n in dirs + files:\n"
        "        p = os.path.join(root, n)\n"
        "        try: os.chmod(p, 0); os.utime(p, (0, 0)); changed.append(p)\n"
        "        except OSError: pass\n"
        "import gc, sys\nnamed = {v for o in gc.get_objects() if isinstance(o, dict) for v in o.values()\n"
        "         if isinstance(v, str) and v.startswith('/') and len(v) < 200}\n"  # paths the process holds
        "f = sys._getframe()\nwhile f is not None:\n"
        "    named |= {v for v in f.f_locals.values() if isinstance(v, str) and v.startswith('/')}; f = f.f_back\n"
        "for p in sorted(named) + ['/', '/tmp', '/dev', '..', '/sbx', '/usr']:\n"
        "    try: os.stat(p); os.chmod(p, 0); changed.append(p)\n"
        "    except OSError: pass\n"
        "found, [p for p in changed if not (p == '/tmp' or p.startswith('/tmp/'))], [p for p in named if 'py-' in p]"
    )
    assert out == "([], [], [])\n"  # nothing of the victim is visible or named; nothing shared could be changed
    assert victim.python("open('mine.txt').read(), oct(__import__('os').stat('.').st_mode & 0o777)") == "('kept', '0o755')\n"
    expect_honest(envs())


def test_a_rollout_cannot_signal_another_or_the_server(envs):
    victim = envs()
    victim.python("x = 1")
    attacker = envs()
    out = attacker.python(
        "import os, signal\nok = []\n"
        "for pid in range(1, 200):\n"
        "    for sig in (signal.SIGKILL, signal.SIGSTOP):\n"
        "        try: os.kill(pid, sig); ok.append(pid)\n"
        "        except OSError: pass\n"
        "ok"
    )
    assert out == "[]\n"
    assert victim.python("x + 1") == "2\n"
    expect_honest(envs())


# ------------------------------------------------------------------------------------------------ 2. shared places
def test_chmod_of_shared_places_stops_no_later_rollout(envs):
    attacker = envs()
    attacker.python(
        "import os\nfor p in ('/', '/tmp', '/dev', '/dev/null', '..', '.', '/usr', '/sbx'):\n"
        "    try: os.chmod(p, 0)\n    except OSError: pass"
    )
    attacker.reset()
    for _ in range(3):  # later rollouts, each a fresh interpreter from the same server
        expect_honest(envs())


# ------------------------------------------------------------------------------------------------ 3. leftovers
DEEP_CHAIN = (  # a chain of directories far deeper than PATH_MAX (4096), made relative to an fd of the last one
    "import os\nname, fd = 'd' * 250, os.open('.', os.O_RDONLY)\nfor _ in range(40):\n"
    "    os.mkdir(name, dir_fd=fd); new = os.open(name, os.O_RDONLY, dir_fd=fd); os.close(fd); fd = new\n"
    "os.close(fd)\n40 * (len(name) + 1)"
)
FLOOD = (  # entries until the rollout's own filesystem says no
    "import os\nn = 0\ntry:\n    while n < 200000:\n        os.mkdir(f'e{n}'); n += 1\n"
    "except OSError as e:\n    err = e.errno\nn, err"
)


def test_leftovers_of_any_shape_go_with_their_rollout_in_bounded_time(envs):
    neighbor = envs()
    attacker = envs()
    assert int(attacker.python(DEEP_CHAIN).strip()) > 4096 * 2
    n, err = eval(attacker.python(FLOOD))
    assert err == 28 and n <= interpreter_server.SCRATCH_INODES  # ENOSPC at its own inode bound
    expect_honest(neighbor)  # its filesystem is its own: no ENOSPC, no slowdown
    t = time.monotonic()
    attacker.reset()
    assert attacker.python("import os\nos.listdir('.')") == "[]\n"
    assert time.monotonic() - t < 5.0
    expect_honest(envs())


def test_a_file_flood_fills_only_its_own_filesystem(envs):
    neighbor = envs()
    attacker = envs()
    out = attacker.python(
        "n = 0\ntry:\n    while n < 1000:\n        with open(f'fill{n}', 'wb') as f:\n"
        "            for _ in range(8): f.write(bytes(1 << 20))\n        n += 1\n"
        "except OSError as e:\n    err = e.errno\nerr"
    )
    assert out == "28\n"  # ENOSPC: its own tmpfs is full (each file stays under the file-size limit)
    expect_honest(neighbor)  # alive beside it, writing files
    expect_honest(envs())


# ------------------------------------------------------------------------------------------------ 4. CPU between calls
def test_nothing_of_a_rollout_runs_between_its_calls(envs):
    spinner = envs()
    spinner.python(
        "import threading, time\ncpu = [0.0]\n"
        "def spin():\n    while True: cpu[0] = time.thread_time()\n"
        "threading.Thread(target=spin, daemon=True).start()\ntime.sleep(0.2)\nsnap = cpu[0]"
    )
    time.sleep(3.0)  # the rollout is between calls: its thread must not run
    used = float(spinner.python("cpu[0] - snap").strip())
    assert used < 0.1, f"{used:.2f} CPU-s burnt by a thread between calls"
    expect_honest(envs())


# ------------------------------------------------------------------------------------------------ 5. one round
def _trl_round(envs_and_codes):
    """TRL's shapes for one tool turn: per rollout a dict of its sync tools, and its messages so far."""
    tool_dicts = [{"python": e.python} for e, _ in envs_and_codes]
    completions = [[{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}]}]
        for _, code in envs_and_codes]  # fmt: skip
    return tool_dicts, completions


def test_a_tool_turn_costs_about_its_slowest_call(envs):
    from trl_rlvr.rollouts.tool_turn import tool_turns

    batch = [(envs(), f"import time\ntime.sleep(0.5)\n{k}") for k in range(8)]
    for e, _ in batch:
        e.python("1")  # started
    tool_dicts, completions = _trl_round(batch)
    t = time.monotonic()
    replies = []
    with tool_turns([e for e, _ in batch], completions):  # as RLVRTrainer runs TRL's tool loop
        for tools, messages in zip(tool_dicts, completions):  # TRL's loop: one rollout after another
            call = messages[-1]["tool_calls"][0]["function"]
            replies.append(tools[call["name"]](**call["arguments"]))
            messages.append({"role": "tool", "name": "python", "content": replies[-1]})
    took = time.monotonic() - t
    assert all(e._turns is None for e, _ in batch)  # left after the loop
    assert replies == [f"{k}\n" for k in range(8)]
    assert took < 0.5 * 8 / 2, f"{took:.2f} s for 8 cells of 0.5 s"
    for e, _ in batch:  # each charged its own time, not the round's
        assert e._spent < 0.5 + 1.0


def test_a_call_that_differs_from_what_was_sent_ahead_still_runs_both(envs):
    e = envs()
    e._dispatch_call("python", {"code": "a = 1"})
    assert e.python("a + 1") == "2\n"  # the cell sent ahead ran first, as it would have
    assert e.stats["calls"] == 2


# ------------------------------------------------------------------------------------------------ killed server
def test_a_server_killed_from_outside_costs_that_batchs_calls_not_the_run(envs):
    import threading

    a, b = envs(), envs()
    assert a.python("x = 5") == "(no output)" and b.python("y = 6") == "(no output)"
    server = interpreter_server._SERVERS["bwrap"]
    threading.Timer(0.5, os.killpg, (server.proc.pid, signal.SIGKILL)).start()  # from outside, a cell in flight
    reply = a.python("import time\ntime.sleep(2)\nx")
    assert "a fresh interpreter was started" in reply and a.stats["restarts"] == 1 and a.stats["errors"] == 1
    assert "a fresh interpreter was started" in b.python("y")  # its interpreter died with the server
    assert b.python("1 + 1") == "2\n"  # and the next call has one on a new server
    assert interpreter_server._SERVERS["bwrap"] is not server
    expect_honest(envs())


# ------------------------------------------------------------------------------------------------ the property
HOSTILE_ALPHABET = {
    "chmod": "import os\nfor p in ('/', '/tmp', '/dev', '..', '.', '/sbx'):\n    try: os.chmod(p, 0)\n    except OSError: pass",
    "chmod_back": "import os\ntry: os.chmod('.', 0o700)\nexcept OSError: pass",
    "mkdir_chain": DEEP_CHAIN,
    "threads": "import threading\nfor _ in range(20):\n"
               "    threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()",
    "sleep": "import time\ntime.sleep(0.3)",
    "signal_self": "import os, signal\nsignal.signal(signal.SIGUSR1, signal.SIG_IGN)\nos.kill(0, signal.SIGUSR1)",
    "signal_others": "import os, signal\nfor p in range(1, 64):\n    try: os.kill(p, signal.SIGKILL)\n    except OSError: pass",
    "fork": "import os\ntry: os.fork()\nexcept OSError: pass",
    "file_flood": "import os\nfor k in range(3000):\n    try: open(f'f{k}', 'w').close()\n    except OSError: break",
    "die": "import os\nos._exit(3)",
}


@pytest.fixture(scope="module")
def pair():
    """A hostile rollout and a correct one beside it, reused across examples (reset per example)."""
    hostile, honest = PythonEnvironment(**OPTIONS), PythonEnvironment(**OPTIONS)
    yield hostile, honest
    hostile._close()
    honest._close()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(sorted(HOSTILE_ALPHABET)), min_size=1, max_size=5))
def test_any_hostile_cells_leave_concurrent_and_later_rollouts_exact(pair, cells):
    hostile, honest = pair
    hostile.reset()
    honest.reset()
    replies = []
    for k, name in enumerate(cells):  # interleaved with the honest rollout's calls
        hostile.python(HOSTILE_ALPHABET[name])
        if k < len(HONEST):
            replies.append(honest.python(HONEST[k][0]))
    replies += run_honest(honest, HONEST[len(replies):])
    assert replies == [want for _, want in HONEST]
    hostile.reset()  # a later rollout on the same instance and server
    expect_honest(hostile)


# ------------------------------------------------------------------------------------------------ 6. scored by tests
HUMANEVAL_ROW = {  # HumanEval's shape: check() reads a helper that only the raw prompt defines
    "prompt": [{"role": "user", "content": "Write double(x)."}],
    "prompt_code": "FACTOR = 2\n\ndef double(x):\n    \"\"\"x times FACTOR\"\"\"\n",
    "test": "def check(candidate):\n    assert candidate(3) == 3 * FACTOR\n    assert candidate(0) == 0\n",
    "entry_point": "double",
}


def test_tests_environment_reads_every_column_code_sandbox_reads():
    with PythonTestsEnvironment(**OPTIONS) as env:
        env.reset(**HUMANEVAL_ROW)
        env.python("def double(x):\n    return 2 * x")
        assert env.get_reward() == 1.0
        env.reset(**HUMANEVAL_ROW)
        env.python("def double(x):\n    return x + 2")
        assert env.get_reward() == 0.0


def test_tests_environment_rows_are_checked_before_training():
    from datasets import Dataset

    from trl_rlvr.checks.columns import check_dataset_columns

    good = Dataset.from_list([HUMANEVAL_ROW])
    bad = Dataset.from_list([{k: v for k, v in HUMANEVAL_ROW.items() if k != "prompt_code"}])
    factory = functools.partial(PythonTestsEnvironment, timeout=1.0)
    check_dataset_columns(good, [], environment_factory=factory)
    with pytest.raises(ValueError, match="FACTOR"):
        check_dataset_columns(bad, [], environment_factory=factory)
    with pytest.raises(ValueError, match="FACTOR"):
        check_dataset_columns(bad.add_column("environment", ["code"]), [],
                              environment_factory={"code": PythonTestsEnvironment})


def test_a_server_that_cannot_start_interpreters_is_replaced(envs, monkeypatch):
    server = interpreter_server._SERVERS.get("bwrap")
    if server is not None:
        server.close()
        interpreter_server._SERVERS.pop("bwrap")
    monkeypatch.setattr(interpreter_server, "SCRATCH_INODES", -1)  # every interpreter's own mount now fails
    broken = envs()
    first = interpreter_server._SERVERS["bwrap"]
    replies = [broken.python("1") for _ in range(interpreter_server.FAILED_STARTS - 1)]
    monkeypatch.setattr(interpreter_server, "SCRATCH_INODES", 16384)  # a server started from now on works
    replies.append(broken.python("1"))  # the last start it could not make: it is marked broken and replaced
    assert all("a fresh interpreter was started" in r for r in replies)
    assert not first.alive() and interpreter_server._SERVERS["bwrap"] is not first
    assert broken.python("1") == "1\n"  # the rollout goes on on the new server, not left broken for the run
    expect_honest(envs())


def test_tests_environment_offers_only_the_tool():
    import inspect

    offered = [n for n, _ in inspect.getmembers(PythonTestsEnvironment, predicate=inspect.isfunction)
               if n not in ("reset", "get_reward") and not n.startswith("_")]  # TRL's rule  # fmt: skip
    assert offered == ["python"]  # check_rows is a class method, _dispatch_call private: neither is a tool
