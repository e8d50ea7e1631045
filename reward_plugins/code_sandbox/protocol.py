"""Verdict protocol: the only bytes that cross a trust boundary, and how they are read.

Stdlib only: this file also runs inside the sandbox (the worker imports it by path).

Three channels, each with one writer:

* candidate -> tester (``Frame``): the untrusted program's *return values*, as typed, data-only
  JSON. The decoder (``decode``) builds nothing but builtin containers and scalars, plus opaque
  ``Remote`` handles whose equality is identity, so a forged ``__eq__``/``__bool__`` cannot cross.
* tester -> host (result pipe): one JSON line per test, ``{"i": k, "ok": bool}``. Only the tester
  (trusted test code in its own sandboxed process) holds this pipe; ``parse_records`` accepts a
  record only when its line arrived complete, and a duplicate or malformed record voids the sample.
* program stdout -> host (memfd): compared by the host, which alone knows the expected output
  (``same_output``).
"""

from __future__ import annotations

import json
import math
import os
import struct

MAX_FRAME = 32 << 20  # bytes, one value crossing candidate -> tester
_LEN = struct.Struct(">I")


class ProtocolError(Exception):
    """Malformed bytes from the other side; the test that needed them fails."""


# ---------------------------------------------------------------- typed, data-only codec
class Remote:
    """An opaque reference to an object that lives in the candidate process (a function, a class,
    an instance it returned). Calling it, or reading an attribute, is a round trip; it has no
    truthiness, and equality is identity of the reference, so it cannot vouch for a result."""

    __slots__ = ("_ref", "_conn")

    def __init__(self, ref, conn):
        self._ref = ref
        self._conn = conn

    def __call__(self, *args, **kwargs):
        return self._conn.call(self._ref, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._conn.getattr(self._ref, name)

    def __eq__(self, other):
        return type(other) is Remote and other._ref == self._ref

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash(("Remote", json.dumps(self._ref)))

    def __bool__(self):
        raise TypeError("the truth value of an opaque candidate object is undefined")

    def __repr__(self):
        return f"<Remote {self._ref!r}>"


_TYPES = {t.__name__: t for t in (int, float, complex, str, bytes, bytearray, bool, list, tuple, dict, set, frozenset)}


def encode(obj, handle=None, _depth=0):
    """Plain data -> JSON-able structure. Containers are tagged so tuple/list/set/dict/bytes keep
    their type; ints and floats stay distinct. ``handle(obj)`` is called for anything else (the
    candidate side turns it into a reference); without it, such objects are an error."""
    if _depth > 200:
        raise ValueError("value nested too deeply")
    d = _depth + 1
    if obj is None or obj is True or obj is False:
        return obj
    if isinstance(obj, str):
        return str.__str__(obj)
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        return int.__index__(obj) if type(obj) is not int else obj
    if isinstance(obj, float):
        v = float.__float__(obj)
        return v if math.isfinite(v) else {"F": repr(v)}
    if isinstance(obj, Remote):
        return {"h": obj._ref}
    if isinstance(obj, list):
        return [encode(x, handle, d) for x in list.__iter__(obj)]
    if isinstance(obj, tuple):
        return {"t": [encode(x, handle, d) for x in tuple.__iter__(obj)]}
    if isinstance(obj, dict):
        return {"d": [[encode(k, handle, d), encode(v, handle, d)] for k, v in dict.items(obj)]}
    if isinstance(obj, frozenset):
        return {"z": [encode(x, handle, d) for x in frozenset.__iter__(obj)]}
    if isinstance(obj, set):
        return {"s": [encode(x, handle, d) for x in set.__iter__(obj)]}
    if isinstance(obj, bytes):
        return {"b": bytes(obj).hex()}
    if isinstance(obj, bytearray):
        return {"y": bytes(obj).hex()}
    if isinstance(obj, complex):
        return {"c": [encode(obj.real, None, d), encode(obj.imag, None, d)]}
    if type(obj) is type and _TYPES.get(getattr(obj, "__name__", None)) is obj:
        return {"T": obj.__name__}
    if handle is not None:
        return {"h": handle(obj)}
    raise TypeError(f"cannot send a {type(obj).__name__} across the sandbox boundary")


def decode(data, handle=None, _depth=0):
    """The strict inverse of ``encode``: builds only builtin types; a handle ``{"h": ref}`` becomes
    ``handle(ref)`` when given (a ``Remote`` on the tester side, the referenced object on the
    candidate side). Anything unexpected raises ProtocolError."""
    if _depth > 200:
        raise ProtocolError("value nested too deeply")
    d = _depth + 1
    t = type(data)
    if data is None or t is bool or t is int or t is str:
        return data
    if t is float:
        return data
    if t is list:
        return [decode(x, handle, d) for x in data]
    if t is dict and len(data) == 1:
        (tag, v), = data.items()
        if tag == "t" and type(v) is list:
            return tuple(decode(x, handle, d) for x in v)
        if tag == "s" and type(v) is list:
            return {decode(x, handle, d) for x in v}
        if tag == "z" and type(v) is list:
            return frozenset(decode(x, handle, d) for x in v)
        if tag == "d" and type(v) is list:
            out = {}
            for kv in v:
                if type(kv) is not list or len(kv) != 2:
                    raise ProtocolError("bad dict item")
                out[decode(kv[0], handle, d)] = decode(kv[1], handle, d)
            return out
        if tag == "b" and type(v) is str:
            return bytes.fromhex(v)
        if tag == "y" and type(v) is str:
            return bytearray.fromhex(v)
        if tag == "T" and type(v) is str and v in _TYPES:
            return _TYPES[v]
        if tag == "F" and v in ("nan", "inf", "-inf"):
            return float(v)
        if tag == "c" and type(v) is list and len(v) == 2:
            re_, im = (decode(x, None, d) for x in v)
            if type(re_) is not float or type(im) is not float:
                raise ProtocolError("bad complex")
            return complex(re_, im)
        if tag == "h" and handle is not None and (type(v) is int or type(v) is str):
            return handle(v)
    raise ProtocolError(f"unexpected value of type {t.__name__}")


def _no_constant(name):
    raise ProtocolError(f"non-standard JSON constant {name}")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)  # built once: every fork inherits them
_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def loads(raw: bytes):
    try:
        return _DECODER.decode(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(str(e)) from None


def dumps(obj) -> bytes:
    return _ENCODER.encode(obj).encode()


# ---------------------------------------------------------------- length-prefixed frames on pipes
def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def send_frame(fd, obj):
    raw = dumps(obj)
    if len(raw) > MAX_FRAME:
        raise ValueError("frame too large")
    _write_all(fd, _LEN.pack(len(raw)) + raw)


_PENDING: dict = {}  # fd -> bytes read past the end of the last frame


def recv_frame(fd):
    """One frame, read in as few ``read`` calls as it arrived in (usually one: the length and the
    body come in a single write); bytes past it wait for the next call on the same fd."""
    buf = bytearray(_PENDING.pop(fd, b""))
    need = 4
    while True:
        if len(buf) >= need:
            if need == 4:
                (n,) = _LEN.unpack_from(buf)
                if n > MAX_FRAME:
                    raise ProtocolError("frame too large")
                need = 4 + n
                continue
            break
        b = os.read(fd, max(need - len(buf), 1 << 16))
        if not b:
            raise EOFError("peer closed the channel")
        buf += b
    if len(buf) > need:
        _PENDING[fd] = bytes(buf[need:])
    return loads(bytes(buf[4:need]))


# ---------------------------------------------------------------- verdict records (tester -> host)
def record(i: int, ok: bool) -> bytes:
    return dumps({"i": i, "ok": bool(ok)}) + b"\n"


def _indexed_records(raw: bytes, n: int, fields: tuple, flag_names: tuple):
    """The records of ``raw`` for tests 0..n-1 and the flags seen: only complete lines count (a
    record cut off by a kill is dropped); a line that is not a JSON object with exactly one of the
    ``fields`` sets, an index out of range or seen before makes the list None (the sample is void)."""
    out, seen, flags = [], set(), set()
    for line in raw.split(b"\n")[:-1]:  # the last element is incomplete (or empty)
        try:
            rec = loads(line)
        except ProtocolError:
            return None, flags
        if type(rec) is not dict:
            return None, flags
        if set(rec) == {"flag"} and rec["flag"] in flag_names:
            flags.add(rec["flag"])
            continue
        i = rec.get("i")
        if set(rec) not in fields or type(i) is not int or not 0 <= i < n or i in seen:
            return None, flags
        seen.add(i)
        out.append(rec)
    return out, flags


def parse_records(raw: bytes, n_tests: int):
    """Verdict records ``{"i": k, "ok": bool}`` -> (passed: list[bool] of length n_tests, status:
    "ok" | "void", flags: set[str]). A test without a record failed; a malformed record voids."""
    recs, flags = _indexed_records(raw, n_tests, ({"i", "ok"},), ("load_error", "end"))
    if recs is None or any(type(r["ok"]) is not bool for r in recs):
        return [False] * n_tests, "void", flags
    passed = [False] * n_tests
    for r in recs:
        passed[r["i"]] = r["ok"]
    return passed, "ok", flags


def parse_values(raw: bytes, expects: list):
    """Return-value records ``{"i": k, "v": value}`` (or ``{"i": k, "x": 1}``: it raised), judged
    here, on the host, by ``expects[k].matches(value)`` (an ``Expect`` of ``routing``: the
    expectation never left the host). -> (passed, status, flags)."""
    n = len(expects)
    recs, flags = _indexed_records(raw, n, ({"i", "v"}, {"i", "x"}), ("load_error",))
    if recs is None:
        return [False] * n, "void", flags
    passed = [False] * n
    for r in recs:
        if "v" in r:
            try:
                passed[r["i"]] = expects[r["i"]].matches(decode(r["v"]))
            except (ProtocolError, RecursionError):
                passed[r["i"]] = False
    return passed, "ok", flags


# ---------------------------------------------------------------- stdout comparison (host side)
def _lines(text: str):
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and lines[-1] == "":
        lines.pop()
    return lines


def same_output(actual: bytes, expected) -> bool:
    """Exact comparison modulo trailing whitespace on each line (and trailing blank lines).
    Every line counts: a missing or extra line fails. A non-string expectation never passes."""
    if not isinstance(expected, str):
        return False
    return _lines(actual.decode("utf-8", errors="replace")) == _lines(expected)
