"""Seed inputs: the argument tuples a problem's ``check(candidate)`` passes to ``candidate(...)``.

Read from the test program's syntax tree, not by running it: only calls whose positional arguments are all
literals (``ast.literal_eval``: numbers, strings, tuples, lists, dicts, sets, negative numbers) are seeds.
Calls with keywords, ``*args`` or computed arguments (``candidate(x)`` inside a loop, ``encode(s)``) are not
plain inputs and are left to the original tests.
"""

from __future__ import annotations

import ast
from typing import Any

from codemill.problems.plus.literals import key


def _candidate_names(tree: ast.Module, entry: str) -> set[str]:
    """The names a call of the function under test goes by: ``check``'s first parameter, and the entry point
    itself (mined and hand-written tests sometimes call it by name)."""
    names = {entry}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check" and node.args.args:
            names.add(node.args.args[0].arg)
    return names


def _literal_args(call: ast.Call) -> tuple[Any, ...] | None:
    if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    try:
        return tuple(ast.literal_eval(a) for a in call.args)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def seed_inputs(tests: str, entry: str) -> list[tuple[Any, ...]]:
    """Distinct literal argument tuples of the candidate's calls in ``tests``, in source order."""
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return []
    names = _candidate_names(tree, entry)
    out: list[tuple[Any, ...]] = []
    seen: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            args = _literal_args(node)
            if args is None:
                continue
            try:
                k = key(args)
            except TypeError:
                continue
            if k not in seen:
                seen.add(k)
                out.append(args)
    return out

