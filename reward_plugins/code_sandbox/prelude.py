"""The trusted prelude of a HumanEval-style ``check(candidate)``: the helper functions its prompt defines.

HumanEval prompts define helpers besides the function to write (``poly`` for ``find_zero``,
``encode_cyclic`` for ``decode_cyclic``, ``encode_shift`` for ``decode_shift``) and ``check`` calls
them to judge the answer (``assert math.fabs(poly(coeffs, candidate(coeffs))) < 1e-4``). Taken from
the candidate's namespace, as the original harness does, they are the completion's to redefine
(``poly`` returning 0 passes any ``find_zero``). So the tester defines them itself from the prompt,
after the candidate's names and before the test code: ``check`` always sees the prompt's helpers.

Kept from the prompt: imports, and functions and classes that have a body (a stub, only a docstring
or ``pass``/``...``, is for the completion to write, like the entry point itself). Host side only.
"""

from __future__ import annotations

import ast
import functools
import re

from .._text import completion_text

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)
_PARSE_ERRORS = (SyntaxError, ValueError, MemoryError, RecursionError)


def _source(text: str) -> ast.Module | None:
    """The prompt's code: the whole text when it parses as Python (HumanEval's own prompts), else
    its last fenced block that does (a chat prompt that quotes the code)."""
    for candidate in [text, *reversed(_FENCE.findall(text))]:
        try:
            return ast.parse(candidate)
        except _PARSE_ERRORS:
            continue
    return None


def _is_stub(fn) -> bool:
    body = fn.body[1:] if fn.body and _is_docstring(fn.body[0]) else fn.body
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)) for s in body)


def _is_docstring(stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def prompt_helpers(prompt, entry_point: str) -> str:
    """Source of the prompt's imports and helper definitions (every top-level function or class
    with a body, other than ``entry_point``), or "" when there are none or the prompt has no
    parseable code. ``prompt`` is plain text or a conversation (its last message)."""
    return _helpers(completion_text(prompt), entry_point)


@functools.lru_cache(maxsize=512)  # a group's completions share their prompt
def _helpers(text: str, entry_point: str) -> str:
    tree = _source(text)
    if tree is None:
        return ""
    keep, helpers = [], 0
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            keep.append(stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name != entry_point:
            if isinstance(stmt, ast.ClassDef) or not _is_stub(stmt):
                keep.append(stmt)
                helpers += 1
    return ast.unparse(ast.Module(body=keep, type_ignores=[])) if helpers else ""
