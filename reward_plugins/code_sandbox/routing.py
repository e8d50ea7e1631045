"""Which verdict path a test can take: the value path when its shape allows, else the tester.

Value path: one sandboxed process evaluates each test's *call* and streams its typed value (data
only: a forged ``__eq__``/``__bool__`` cannot cross); the host applies the test's *verdict
operation* to that value, against an expectation that never leaves the host. It is taken only
when every test is ``assert <verdict>`` on a call ``E = name(<literals>)`` with one of these
verdicts (``L`` and ``T`` literals, read with ``ast.literal_eval``):

==========================================  ============================
``assert E == L`` (or ``L == E``)           ``Expect("==", L)``
``assert E is True|False|None``             ``Expect("is", L)``
``assert E`` / ``assert not E``              ``Expect("truthy")`` / ``Expect("falsy")``
``assert abs(E - L) < T`` (or ``<=``)       ``Expect("close", L, T)``
==========================================  ============================

Nothing but the program's own function runs inside the untrusted process: neither the verdict
(``assert f(1) == 2 and f(2) == 3``: a comparison the program could answer with a forged
object) nor a builtin wrapped around the result (``assert len(f(x)) == 3``: the program could
monkeypatch ``len``). Such tests go to the tester path, where trusted test code with the real
builtins works on the values that crossed as data.

HumanEval-style ``check(candidate)`` test code takes the value path when its ``check`` body is
only such asserts on ``candidate(<literals>)`` (plus docstrings and ``assert True``) and the module
around it only imports and assigns literals (``METADATA``); it is then *one* test that passes when
every assert does, exactly as ``check`` itself. Anything else runs in the tester process.
"""

from __future__ import annotations

import ast
import dataclasses
import math

_LITERAL_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)


@dataclasses.dataclass(frozen=True)
class Expect:
    """A verdict the host applies to one decoded value (builtin types only)."""

    op: str  # "==", "is", "truthy", "falsy", "close"
    value: object = None
    tol: float = 0.0
    strict: bool = True  # close: ``<`` (True) or ``<=``

    def matches(self, got) -> bool:
        try:
            if self.op == "==":
                return bool(got == self.value)
            if self.op == "is":
                return got is self.value
            if self.op == "truthy":
                return bool(got)
            if self.op == "falsy":
                return not got
            if self.op == "close":
                d = abs(got - self.value)
                return bool(d < self.tol if self.strict else d <= self.tol)
        except (TypeError, ValueError, OverflowError, RecursionError):
            return False
        raise ValueError(f"unknown verdict operation {self.op!r}")


def _literal(node):
    """(True, value) when ``node`` is a literal, else (False, None)."""
    try:
        return True, ast.literal_eval(node)
    except _LITERAL_ERRORS:
        return False, None


def _literal_call(node) -> bool:
    """``name(<literal>, ..., key=<literal>)``: nothing in it but the call runs in the sandbox."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and all(not isinstance(x, ast.Starred) and _literal(x)[0] for x in node.args)
        and all(k.arg is not None and _literal(k.value)[0] for k in node.keywords)
    )


def split_assert(node: ast.Assert):
    """``assert <verdict on E>`` -> (E, Expect), or None unless E is a call with literal arguments
    and the verdict one the host applies to a value (module docstring). The message is irrelevant."""
    split = _split(node.test)
    return split if split is not None and _literal_call(split[0]) else None


def _split(t):
    if isinstance(t, ast.Compare) and len(t.ops) == 1:
        (op,), left, right = t.ops, t.left, t.comparators[0]
        if isinstance(op, ast.Eq):
            for expr, lit in ((left, right), (right, left)):
                ok, value = _literal(lit)
                if ok and isinstance(expr, ast.Call):
                    return expr, Expect("==", value)
            return None
        if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value in (True, False, None):
            return left, Expect("is", right.value)
        if isinstance(op, (ast.Lt, ast.LtE)):
            ok, tol = _literal(right)
            if not (ok and type(tol) in (int, float) and math.isfinite(tol)):
                return None
            if not (isinstance(left, ast.Call) and isinstance(left.func, ast.Name) and left.func.id == "abs"):
                return None
            if len(left.args) != 1 or left.keywords:
                return None
            diff = left.args[0]
            if not (isinstance(diff, ast.BinOp) and isinstance(diff.op, ast.Sub)):
                return None
            ok, value = _literal(diff.right)
            if not (ok and type(value) in (int, float)):
                return None
            return diff.left, Expect("close", value, float(tol), isinstance(op, ast.Lt))
        return None
    if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
        return t.operand, Expect("falsy")
    return t, Expect("truthy")


def value_tests(tests, setup) -> tuple[list, list] | None:
    """MBPP-style assert statements -> (expressions, expectations), or None when any test (or
    setup code) needs the tester process."""
    if setup and str(setup).strip():
        return None
    exprs, expects = [], []
    for src in tests:
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return None
        if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
            return None
        split = split_assert(tree.body[0])
        if split is None:
            return None
        exprs.append(ast.unparse(split[0]))
        expects.append(split[1])
    return (exprs, expects) if _one_line(exprs) else None


def verifies_something(test_code: str) -> bool:
    """Whether trusted test code can fail at all: it has an ``assert`` other than ``assert True``, a ``raise``, or a
    call of an ``assert...``/``fail...`` function (``unittest``, ``numpy.testing``). Test code without any (``def
    check(candidate): pass``) passes every program, so a row with it is never scored as passed. Code that does not
    parse counts as verifying (running it fails every program)."""
    try:
        tree = ast.parse(test_code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and not (isinstance(node.test, ast.Constant) and node.test.value is True):
            return True
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name.startswith(("assert", "fail")):
                return True
    return False


def _is_docstring(stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def check_value_tests(test_code: str, entry_point: str) -> tuple[list, list] | None:
    """HumanEval-style test code -> (expressions on ``entry_point``, expectations) when ``check``
    is only value asserts on ``candidate(<literals>)``; None otherwise (tester path)."""
    try:
        tree = ast.parse(test_code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    checks = []
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "check":
            checks.append(stmt)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)) or _is_docstring(stmt):
            continue
        elif isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets) and _literal(stmt.value)[0]:
            continue
        else:
            return None
    if len(checks) != 1:
        return None
    fn = checks[0]
    a = fn.args
    if fn.decorator_list or len(a.args) != 1 or a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg:
        return None
    param = a.args[0].arg
    exprs, expects = [], []
    for stmt in fn.body:
        if _is_docstring(stmt):
            continue
        if not isinstance(stmt, ast.Assert):
            return None
        if isinstance(stmt.test, ast.Constant) and stmt.test.value is True:
            continue  # `assert True`: HumanEval's "this prints if this assert fails" filler
        split = split_assert(stmt)
        if split is None:
            return None
        call = split[0]
        if call.func.id != param:
            return None
        call = ast.Call(func=ast.Name(id=entry_point, ctx=ast.Load()), args=call.args, keywords=call.keywords)
        exprs.append(ast.unparse(call))
        expects.append(split[1])
    return (exprs, expects) if exprs and _one_line(exprs) else None


def _one_line(exprs) -> bool:
    """The worker receives the calls one per line, ended by a NUL (``ast.unparse`` escapes both
    in literals; this only guards the framing)."""
    return not any("\n" in e or "\0" in e for e in exprs)
