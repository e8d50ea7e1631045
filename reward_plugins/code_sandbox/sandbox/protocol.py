"""Verdict protocol: the only bytes that cross a trust boundary, and how they are read.

Stdlib only: this file also runs inside the sandbox (the worker imports it by path).

Channels, each with one writer, all created for one job and closed after it, so that nothing a
sample writes can be read during a later sample (``recv_frame`` reads exactly one frame and keeps
no buffer, per fd or otherwise):

* candidate -> tester (frames): the untrusted program's names (``manifest``) and the *return
  values* of calls (``reply``), as typed, data-only JSON.
* candidate -> host (value records, value path): ``{"i": k, "v": value}`` per test call, judged on
  the host against expectations that never left it (``verdict.parse_values``, host side).
* tester -> host (verdict records): ``{"i": k, "ok": bool}``; only the tester (trusted test code in
  its own sandboxed process) holds this pipe (written by ``record``; read by ``verdict.parse_records``).
* program stdout -> host (memfd, io path): compared by the host (``verdict.same_output``).

Every byte a candidate controls goes through three checks before anything uses it:

1. ``parse``: bounded JSON. Size, item count, nesting depth and (optionally) a deadline are checked
   while parsing, iteratively (no recursion); decimal integers are at most 19 digits and floats
   short, so no number costs more than linear time (big integers travel as hex, ``{"I": ...}``:
   linear both ways and not subject to Python's 4300-digit limit on decimal conversion).
2. A schema per message (``manifest``, ``reply``, the host's record readers in ``verdict``): known keys only, exact
   types, names that are ASCII identifiers, not keywords, not private or dunder, bounded counts.
3. ``decode``: builds builtin containers and scalars only, plus opaque ``Remote`` handles whose
   equality is identity, so a forged ``__eq__``/``__bool__`` cannot cross. Sets, frozensets and
   dict keys refuse more than ``MAX_SAME_HASH`` elements of one hash value: CPython's hash of
   ints (and of tuples of them) is not keyed, so equal-hash elements can be made at will, and
   each would cost a comparison with every earlier one (quadratic); capped, it is linear.

Exceptions raised by candidate code during a call come back to the trusted side as one plain type,
``CandidateError`` (never the candidate's own type: a ``StopIteration`` re-raised inside
``all(map(f, xs))`` would end the iteration early and a wrong ``f`` would pass).
"""

from __future__ import annotations

import json
import keyword
import math
import os
import re
import struct
import time

MAX_FRAME = 32 << 20  # bytes, one message crossing candidate -> tester (or one sample's value records)
MAX_ITEMS = 1 << 20  # JSON values in one message (or one sample's value records), containers included
MAX_DEPTH = 320  # JSON nesting (a Python value of nesting 100, the encoder's limit, needs at most 3 per level)
MAX_ENCODE_DEPTH = 100
MAX_SAME_HASH = 16  # distinct elements of a set (or keys of a dict) that may share one hash value
MAX_NAMES = 4096  # names in a candidate's manifest
MAX_NAME_LEN = 200
MAX_MESSAGE = 1000  # characters of a candidate exception's message
_BIG = 1 << 63  # ints outside (-_BIG, _BIG) travel as hex
_LEN = struct.Struct(">I")


class ProtocolError(Exception):
    """Malformed bytes from the other side, or a message outside its schema."""


class CandidateError(Exception):
    """Candidate code raised during a call from the trusted side. ``kind`` is the candidate's
    exception type name (data only); the type on the trusted side is always this plain one,
    which no builtin catches specially (unlike StopIteration, StopAsyncIteration, GeneratorExit,
    KeyboardInterrupt, SystemExit)."""

    def __init__(self, kind: str, message: str = ""):
        super().__init__(f"{kind}: {message}" if message else kind)
        self.kind = kind


def is_public_name(name) -> bool:
    """A name the candidate may give the trusted side: an ASCII identifier, not a keyword, not
    private or dunder (``__builtins__``, ``_x``), at most MAX_NAME_LEN characters."""
    return (
        type(name) is str
        and 0 < len(name) <= MAX_NAME_LEN
        and name.isascii()
        and name.isidentifier()
        and not keyword.iskeyword(name)
        and not name.startswith("_")
    )


# ---------------------------------------------------------------- bounded JSON parsing
class Budget:
    """What reading one message (or one sample's records) may still cost: JSON items and,
    optionally, wall time (a monotonic deadline)."""

    __slots__ = ("items", "deadline")

    def __init__(self, items: int = MAX_ITEMS, seconds: float | None = None):
        self.items = items
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def spend(self, n: int):
        self.items -= n
        if self.items < 0:
            raise ProtocolError("too many items")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise ProtocolError("reading took past the deadline")


_WS = re.compile(r"[ \t\n\r]*")
_WS_CHARS = (" ", "\t", "\n", "\r")  # "" (the end) is not one
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_MAX_NUMBER_CHARS = 32  # repr(float) is at most 24; a decimal int here is at most 19 digits and a sign
_INT_CHARS = 20
_scanstring = json.decoder.scanstring  # C, linear
_CHECK_EVERY = 4096  # items between two checks of the budget


def _string(s: str, pos: int):
    """The JSON string whose opening quote is at ``pos - 1`` -> (str, position after it)."""
    try:
        return _scanstring(s, pos, True)
    except ValueError as e:
        raise ProtocolError(f"bad string: {e}") from None


def _key(s: str, pos: int):
    """``"key" :`` at ``pos`` -> (key, position of the value)."""
    if s[pos : pos + 1] != '"':
        raise ProtocolError("object key must be a string")
    key, pos = _string(s, pos + 1)
    pos = _WS.match(s, pos).end()
    if s[pos : pos + 1] != ":":
        raise ProtocolError("expected ':'")
    return key, _WS.match(s, pos + 1).end()


def parse(raw: bytes, budget: Budget | None = None, max_depth: int = MAX_DEPTH):
    """Strict JSON (RFC 8259, no NaN/Infinity, no duplicate keys) -> Python structure, with every
    bound checked as it goes: ``len(raw) <= MAX_FRAME``, items and deadline from ``budget``
    (checked every few thousand items and at the end), nesting ``<= max_depth``. Iterative, so
    its cost is linear in ``len(raw)``; raises ProtocolError at the first violation."""
    s = _decode(raw)
    budget = Budget() if budget is None else budget
    ws, string = _WS.match, _string
    n, count, next_check = len(s), 0, _CHECK_EVERY
    stack, keys = [], []  # open containers, and for each dict the key whose value comes next
    pos = ws(s, 0).end()
    while True:  # here a value starts at pos
        c = s[pos : pos + 1]
        count += 1
        if c == '"':
            value, pos = string(s, pos + 1)
        elif c == "[" or c == "{":
            if len(stack) >= max_depth:
                raise ProtocolError("nested too deeply")
            pos = ws(s, pos + 1).end()
            if s[pos : pos + 1] == ("]" if c == "[" else "}"):
                value, pos = ([] if c == "[" else {}), pos + 1
            elif c == "[":
                stack.append([])
                keys.append(None)
                continue
            else:
                stack.append({})
                key, pos = _key(s, pos)
                keys.append(key)
                continue
        else:
            value, pos = _scalar(s, pos, c)
        while True:  # attach the value; close every container that ends here
            if count >= next_check:
                budget.spend(count - next_check + _CHECK_EVERY)
                next_check = count + _CHECK_EVERY
            if not stack:
                if ws(s, pos).end() != n:
                    raise ProtocolError("data after the value")
                budget.spend(count - next_check + _CHECK_EVERY)
                return value
            key = keys[-1]
            _attach(stack[-1], key, value)
            c = s[pos : pos + 1]
            if c in _WS_CHARS:
                pos = ws(s, pos).end()
                c = s[pos : pos + 1]
            if c == ",":
                pos += 1
                if s[pos : pos + 1] in _WS_CHARS:
                    pos = ws(s, pos).end()
                if key is not None:
                    keys[-1], pos = _key(s, pos)
                break
            if c == ("]" if key is None else "}"):
                value, pos = stack.pop(), pos + 1
                keys.pop()
                continue
            raise ProtocolError(f"expected ',' or the end of a container at {pos}")


def _attach(container, key, value) -> None:
    """``value`` into the open container: appended to a list (``key`` None), else under ``key`` in a dict (a key
    it already holds: ProtocolError, JSON's duplicate keys being ambiguous)."""
    if key is None:
        container.append(value)
    elif key in container:
        raise ProtocolError("duplicate key")
    else:
        container[key] = value


def _decode(raw: bytes) -> str:
    """A frame's text: at most ``MAX_FRAME`` bytes, valid UTF-8."""
    if len(raw) > MAX_FRAME:
        raise ProtocolError("message too large")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("not UTF-8") from None


def _scalar(s: str, pos: int, c: str):
    """The literal (``true``, ``false``, ``null``) or number starting at ``pos`` (``c`` its first character) ->
    ``(value, end)``. A decimal integer is at most ``_INT_CHARS`` characters, any other number at most
    ``_MAX_NUMBER_CHARS`` and finite; anything else is a ProtocolError."""
    if c == "t" and s.startswith("true", pos):
        return True, pos + 4
    if c == "f" and s.startswith("false", pos):
        return False, pos + 5
    if c == "n" and s.startswith("null", pos):
        return None, pos + 4
    m = _NUMBER.match(s, pos)
    if m is None:
        raise ProtocolError(f"unexpected {c!r} at {pos}")
    tok, pos = m.group(), m.end()
    if m.lastindex is None:
        if len(tok) > _INT_CHARS:
            raise ProtocolError("decimal integer too long (big integers travel as hex)")
        return int(tok), pos
    if len(tok) > _MAX_NUMBER_CHARS:
        raise ProtocolError("number too long")
    value = float(tok)
    if value - value != 0.0:  # inf (nan cannot be written in JSON)
        raise ProtocolError("non-finite number")
    return value, pos


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
_HEX = re.compile(r"-?[0-9a-f]+")
_HEXPAIRS = re.compile(r"(?:[0-9a-f]{2})*")
MAX_REF = 1 << 31


def is_ref(ref) -> bool:
    """A handle: a small non-negative int (candidate side) or a public name (tester side)."""
    return (type(ref) is int and 0 <= ref < MAX_REF) or is_public_name(ref)


def encode(obj, handle=None, _depth=0):
    """Plain data -> JSON-able structure. Containers are tagged so tuple/list/set/dict/bytes keep
    their type; ints and floats stay distinct; ints past 63 bits are hex (``{"I": "-ff"}``).
    ``handle(obj)`` is called for anything else (the candidate side turns it into a reference);
    without it, such objects are an error."""
    if _depth > MAX_ENCODE_DEPTH:
        raise ValueError("value nested too deeply")
    d = _depth + 1
    if obj is None or obj is True or obj is False:
        return obj
    if isinstance(obj, str):
        return str.__str__(obj)
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        v = int.__index__(obj) if type(obj) is not int else obj
        return v if -_BIG < v < _BIG else {"I": format(v, "x")}
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


def no_hash_flood(items):
    """Raise ProtocolError when more than MAX_SAME_HASH of ``items`` share one hash value (or one
    is unhashable): then building a set or dict of them costs at most MAX_SAME_HASH comparisons
    per element instead of one per earlier element. The counting dict itself cannot be flooded:
    its keys are the hash values, distinct ints, which hash to themselves."""
    seen = {}
    try:
        for x in items:
            h = hash(x)
            k = seen.get(h, 0) + 1
            if k > MAX_SAME_HASH:
                raise ProtocolError("too many elements with one hash value")
            seen[h] = k
    except TypeError:
        raise ProtocolError("unhashable element") from None


def decode(data, handle=None, _depth=0):
    """The strict inverse of ``encode``: builds only builtin types; a handle ``{"h": ref}`` becomes
    ``handle(ref)`` when given (a ``Remote`` on the tester side, the referenced object on the
    candidate side). Anything unexpected raises ProtocolError."""
    if _depth > MAX_DEPTH:
        raise ProtocolError("value nested too deeply")
    d = _depth + 1
    t = type(data)
    if data is None or t is bool or t is int or t is str or t is float:
        return data
    if t is list:
        return [decode(x, handle, d) for x in data]
    if t is dict and len(data) == 1:
        ((tag, v),) = data.items()
        tv = type(v)
        if tag == "t" and tv is list:
            return tuple([decode(x, handle, d) for x in v])
        if (tag == "s" or tag == "z") and tv is list:
            items = [decode(x, handle, d) for x in v]
            no_hash_flood(items)
            return set(items) if tag == "s" else frozenset(items)
        if tag == "d" and tv is list:
            pairs = []
            for kv in v:
                if type(kv) is not list or len(kv) != 2:
                    raise ProtocolError("bad dict item")
                pairs.append((decode(kv[0], handle, d), decode(kv[1], handle, d)))
            no_hash_flood([k for k, _ in pairs])
            return dict(pairs)  # every key hashable: checked by no_hash_flood
        if tag == "I" and tv is str and _HEX.fullmatch(v):
            return int(v, 16)
        if (tag == "b" or tag == "y") and tv is str and _HEXPAIRS.fullmatch(v):
            return bytes.fromhex(v) if tag == "b" else bytearray.fromhex(v)
        if tag == "T" and tv is str and v in _TYPES:
            return _TYPES[v]
        if tag == "F" and v in ("nan", "inf", "-inf"):
            return float(v)
        if tag == "c" and tv is list and len(v) == 2:
            re_, im = (decode(x, None, d) for x in v)
            if type(re_) is not float or type(im) is not float:
                raise ProtocolError("bad complex")
            return complex(re_, im)
        if tag == "h" and handle is not None and is_ref(v):
            return handle(v)
    raise ProtocolError(f"unexpected value of type {t.__name__}")


def _no_constant(name):
    raise ProtocolError(f"non-standard JSON constant {name}")


# built once: every fork inherits them
_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))
_TRUSTED_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def loads(raw: bytes, budget: Budget | None = None):
    """Bytes that anything outside the trusted side may have written: ``parse``."""
    return parse(raw, budget)


def loads_trusted(raw: bytes):
    """JSON that trusted code wrote (the host's test spec, the tester's requests to the candidate),
    read with the stdlib's C decoder: faster, and with no bound but the caller's trust. Never for
    bytes a candidate controls."""
    try:
        return _TRUSTED_DECODER.decode(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise ProtocolError(str(e)) from None


def dumps(obj) -> bytes:
    return _ENCODER.encode(obj).encode()


# ---------------------------------------------------------------- message schemas (candidate -> tester)
def manifest(msg):
    """The candidate's first frame -> list of (name, kind, payload), or None when the program did
    not load. Accepted: ``{"names": {name: {"f": 1} | {"m": module name} | {"v": value}}}`` with
    public names only (``is_public_name``) and at most MAX_NAMES of them, or ``{"load_error": type
    name}``. Anything else raises ProtocolError. (Which names the test code then gets is the
    tester's policy: never a builtin's, and a stdlib module's name is always the real module.)"""
    if type(msg) is not dict or len(msg) != 1:
        raise ProtocolError("bad manifest")
    if "load_error" in msg:
        if not _is_type_name(msg["load_error"]):
            raise ProtocolError("bad load_error")
        return None
    names = msg.get("names")
    if type(names) is not dict or len(names) > MAX_NAMES:
        raise ProtocolError("bad manifest")
    out = []
    for name, desc in names.items():
        if not is_public_name(name) or type(desc) is not dict or len(desc) != 1:
            raise ProtocolError(f"bad manifest entry {name[:40]!r}")
        ((kind, payload),) = desc.items()
        if kind == "f" and payload == 1 and type(payload) is int:
            pass
        elif kind == "m" and type(payload) is str and all(is_public_name(p) for p in payload.split(".")):
            pass
        elif kind != "v":
            raise ProtocolError(f"bad manifest entry {name!r}")
        out.append((name, kind, payload))
    return out


def _is_type_name(name) -> bool:
    return type(name) is str and 0 < len(name) <= MAX_NAME_LEN and name.isascii() and name.isidentifier()


def reply(msg):
    """A reply frame -> the (still encoded) value of ``{"v": value}``; ``{"e": [type name,
    message]}`` raises CandidateError; anything else ProtocolError."""
    if type(msg) is dict and len(msg) == 1:
        if "v" in msg:
            return msg["v"]
        e = msg.get("e")
        if type(e) is list and len(e) == 2 and _is_type_name(e[0]) and type(e[1]) is str and len(e[1]) <= MAX_MESSAGE:
            raise CandidateError(e[0], e[1])
    raise ProtocolError("bad reply")


# ---------------------------------------------------------------- length-prefixed frames on pipes
def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def send_frame(fd, obj):
    raw = dumps(obj)
    if len(raw) > MAX_FRAME:
        raise ValueError("frame too large")
    write_all(fd, _LEN.pack(len(raw)) + raw)


def _read_exactly(fd, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        b = os.read(fd, min(n - len(buf), 1 << 20))
        if not b:
            raise EOFError("peer closed the channel")
        buf += b
    return bytes(buf)


def recv_frame(fd, budget: Budget | None = None, trusted: bool = False):
    """One frame: exactly its 4-byte length and its body are read, never a byte past it, and
    nothing is kept between calls. Bytes a peer wrote beyond stay in the pipe, which belongs to
    one job and is closed with it: they can never be read as a later job's frame. The body is
    read by ``parse`` (bounded), or ``loads_trusted`` when the writer is trusted (the tester)."""
    (n,) = _LEN.unpack(_read_exactly(fd, 4))
    if n > MAX_FRAME:
        raise ProtocolError("frame too large")
    body = _read_exactly(fd, n)
    return loads_trusted(body) if trusted else parse(body, budget)


# ---------------------------------------------------------------- verdict records (tester -> host)
def record(i: int, ok: bool) -> bytes:
    return dumps({"i": i, "ok": bool(ok)}) + b"\n"
