"""The trusted prelude of a HumanEval-style ``check(candidate)``: every name the test code relies on but does not
define, taken from trusted row data only. Host side only.

HumanEval's test code calls helpers that its *prompt* defines (``poly`` for ``find_zero``, ``encode_cyclic`` for
``decode_cyclic``, ``encode_shift`` for ``decode_shift``), and a helper may read a prompt constant or import. In
the original harness they come from the candidate's namespace, so a completion that redefines ``poly`` to return
0 passes any ``find_zero``. Here the candidate contributes exactly one name to the test code, the entry point (as
an opaque proxy, ``worker._run_spec``); everything else the test code reads is

1. defined by the test code itself,
2. a builtin, or a standard-library module the tester imports for it (``import math`` added when the test code
   reads ``math`` without importing it),
3. or defined by the *trusted source* of the row, in this order of preference: the ``prompt_code`` column (the
   plugin's ``prompt_code_column`` option names it; HumanEval's raw ``prompt`` belongs there when the ``prompt``
   column holds a chat), else the row's prompt (plain text or every message of a chat: system, user, an
   assistant prefill), never the completion.

From the trusted source only top-level imports, functions and classes with a body (a stub, only a docstring or
``pass``/``...``, is for the completion to write, like the entry point), and assignments of names (constants
such as ``SHIFT = 5``) are taken, and of those only the statements that define a name the test code needs,
directly or through a helper it calls (``required_names``). Code is found in a prompt in any layout
(``code_segments``): the whole text when it parses, every fenced block (```` ``` ```` or ``~~~``, any info
string, an unclosed fence running to the end), and runs of top-level code lines in prose.

A name that none of these defines is not looked up anywhere else: ``Prelude.missing`` names it, and the plugin
raises a configuration error for the row rather than scoring it.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import re
import symtable
import sys
import textwrap

from .._text import content_text

_PARSE_ERRORS = (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError)
_FENCE_OPEN = re.compile(r"[ \t]{0,3}(`{3,}|~{3,})")
# A line that starts a top-level statement the prelude may take (in prose, where the whole text is not code).
_CODE_START = re.compile(r"(?:async[ \t]+def|def|class|import|from)[ \t]|@|[A-Za-z_]\w*(?:[ \t]*:[^=\n]+)?[ \t]*=(?!=)")
_BUILTINS = frozenset(dir(builtins))
_DEFINING = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


@dataclasses.dataclass(frozen=True)
class Prelude:
    """What the tester defines before the test code (``source``), and what the test code needs that no trusted
    source defines (``missing``: the row cannot be scored)."""

    source: str
    missing: tuple[str, ...] = ()


def _parse(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except _PARSE_ERRORS:
        return None


def _fenced(text: str) -> tuple[list[str], list[str]]:
    """The fenced blocks of a markdown text (``` or ~~~, any info string, closed by the same fence of at least the
    same length on its own line or at the end of the last code line; an unclosed fence runs to the end) and the
    prose between them."""
    blocks, prose, cur, fence = [], [], [], None
    for line in text.splitlines():
        m = _FENCE_OPEN.match(line)
        if fence is None:
            if m:
                prose.append("\n".join(cur))
                cur, fence = [], m.group(1)
            else:
                cur.append(line)
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line[m.end() :].strip():
            blocks.append(textwrap.dedent("\n".join(cur)))
            cur, fence = [], None
        elif line.rstrip().endswith(fence):  # the closing fence at the end of the last code line
            blocks.append(textwrap.dedent("\n".join([*cur, line.rstrip()[: -len(fence)]])))
            cur, fence = [], None
        else:
            cur.append(line)
    if fence is None:
        prose.append("\n".join(cur))
    else:  # an unclosed fence (a prompt or an assistant prefill that opens the block for the answer)
        blocks.append(textwrap.dedent("\n".join(cur)))
    return blocks, prose


def _prose_code(text: str) -> list[ast.Module]:
    """Runs of top-level code in prose: a line that starts a definition, an import or an assignment at column 0,
    with the indented (or blank) lines after it; each run that parses on its own."""
    out, cur = [], []
    for line in [*text.splitlines(), ""]:
        if cur and (line[:1] in (" ", "\t") or not line.strip() or line[:1] in ")]}"):
            cur.append(line)
            continue
        if cur:
            tree = _parse("\n".join(cur))
            if tree is not None:
                out.append(tree)
            cur = []
        if _CODE_START.match(line):
            cur = [line]
    return out


def code_segments(text: str) -> list[ast.Module]:
    """Every piece of Python code in ``text``, in order: the whole text when it parses; else each fenced block that
    parses (and the top-level code runs of one that does not), and the top-level code runs of the prose."""
    whole = _parse(text)
    if whole is not None:
        return [whole]
    blocks, prose = _fenced(text)
    out = []
    for b in blocks:
        tree = _parse(b)
        out += [tree] if tree is not None else _prose_code(b)
    for p in prose:
        out += _prose_code(p)
    return out


def prompt_texts(prompt) -> list[str]:
    """The texts of a prompt: a string; for a conversation, the content of every message in order (system, user,
    an assistant prefill: all of it is the dataset's); nothing for None."""
    if prompt is None:
        return []
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, dict):
        return [content_text(prompt.get("content"))]
    if isinstance(prompt, (list, tuple)):
        return [content_text(m.get("content")) if isinstance(m, dict) else content_text(m) for m in prompt]
    return [str(prompt)]


def _is_docstring(stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _is_stub(fn) -> bool:
    body = fn.body[1:] if fn.body and _is_docstring(fn.body[0]) else fn.body
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)) for s in body)


def _targets(stmt) -> set[str]:
    """The module-level names a statement the prelude may take defines (empty: it is not taken)."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            return set()
        return {a.asname or a.name.split(".")[0] for a in stmt.names if a.name != "*"}
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set() if _is_stub(stmt) else {stmt.name}
    if isinstance(stmt, ast.ClassDef):
        return {stmt.name}
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if stmt.value is not None else []
        names = set()
        for t in targets:
            for node in [t, *(t.elts if isinstance(t, (ast.Tuple, ast.List)) else [])]:
                if isinstance(node, ast.Name):
                    names.add(node.id)
                elif not isinstance(node, (ast.Tuple, ast.List)):
                    return set()  # an attribute or item assignment changes an object: not a definition
        return names
    return set()


def _globals_used(source: str) -> tuple[set[str], set[str]]:
    """(global names that ``source`` reads, names its module level binds), from its symbol tables: a name
    read at module level, or read in a function, class or comprehension where it is not local."""
    top = symtable.symtable(source, "<trusted>", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    reads = {s.get_name() for s in top.get_symbols() if s.is_referenced()}
    scopes = list(top.get_children())
    while scopes:
        t = scopes.pop()
        scopes += t.get_children()
        reads |= {s.get_name() for s in t.get_symbols() if s.is_referenced() and s.is_global()}
    return reads, bound


def required_names(test_code: str, entry_point: str) -> frozenset[str] | None:
    """The global names the test code reads but does not define, other than the entry point; None when it does
    not compile (the tester then fails the sample by itself)."""
    try:
        reads, bound = _globals_used(test_code)
    except _PARSE_ERRORS:
        return None
    return frozenset(reads - bound - {entry_point})


def build_prelude(test_code: str, entry_point: str, sources: tuple[str, ...]) -> Prelude:
    """The prelude for ``test_code`` from the trusted texts ``sources`` (see the module docstring): the
    statements that define a needed name, in source order (a later definition wins, as in Python), a needed name
    being one the test code reads, or one a taken statement reads, that neither the test code nor the entry point
    provides."""
    return _build(test_code, entry_point, tuple(sources))


@functools.lru_cache(maxsize=512)  # a group's completions share their row
def _build(test_code: str, entry_point: str, sources: tuple[str, ...]) -> Prelude:
    need = required_names(test_code, entry_point)
    if need is None:
        return Prelude("")
    test_bound = _globals_used(test_code)[1]  # bound after the prelude has run: the test code's own win
    stmts = [(s, t) for text in sources for tree in code_segments(text) for s in tree.body if (t := _targets(s) - {entry_point})]
    defined: dict[str, list[int]] = {}
    for k, (_, names) in enumerate(stmts):
        for name in names:
            defined.setdefault(name, []).append(k)
    take, seen, todo, missing, imports = set(), set(), list(need), set(), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in defined:
            for k in defined[name]:
                if k not in take:
                    take.add(k)
                    try:
                        read, bound = _globals_used(ast.unparse(stmts[k][0]))
                    except _PARSE_ERRORS:  # parses but does not compile (``await`` outside a function)
                        missing.add(name)
                        continue
                    todo += [n for n in read - bound if n not in test_bound and n != entry_point]
        elif name in _BUILTINS:
            continue
        elif _stdlib_module(name):
            imports.add(name)
        else:
            missing.add(name)
    body = [ast.Import(names=[ast.alias(name=m)]) for m in sorted(imports)] + [stmts[k][0] for k in sorted(take)]
    return Prelude(ast.unparse(ast.Module(body=body, type_ignores=[])) if body else "", tuple(sorted(missing)))


def _stdlib_module(name: str) -> bool:
    return name in sys.stdlib_module_names and not name.startswith("_")
