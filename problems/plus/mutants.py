"""Mutants of a reference solution: small syntactic faults, the yardstick for how strong a test suite is.

Operators (mutation testing's classic set, as EvalPlus's test-suite reduction uses): a comparison flipped at its
boundary (``<`` to ``<=``) or negated (``<`` to ``>=``, ``==`` to ``!=``, ``in`` to ``not in``); an arithmetic
operator swapped (``+``/``-``, ``*``/``//``, ``%``/``//``); ``and``/``or`` swapped; a ``not`` dropped; an int
constant off by one either way, a bool constant flipped, a float constant plus one, a short string emptied;
a unary minus dropped; ``min``/``max`` and ``any``/``all`` swapped, ``abs``/``sorted``/``int``/``round`` dropped; a
comprehension's filter dropped; an ``if`` dropped (its ``else`` runs instead) or its
test negated; a statement dropped from a block of several; a boolean return value negated. Only nodes on the
solution's lines mutate, never the prompt's. Mutants are whole programs (``ast.unparse``), deduplicated by text
and against the unparsed original; ``limit`` of them are kept, taken round-robin over the operators in a
seeded order so that every kind of fault is represented.
"""

from __future__ import annotations

import ast
import copy
import random
from collections.abc import Callable, Iterator
from typing import Any

_CMP_BOUNDARY: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_CMP_NEGATE: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.GtE, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.GtE: ast.Lt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_ARITH: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}

_CALL_SWAP: dict[str, str] = {"min": "max", "max": "min", "any": "all", "all": "any", "abs": "", "sorted": "",
                              "reversed": "list", "int": "", "round": ""}

Edit = Callable[[ast.AST], "ast.AST | list[ast.stmt] | None"]  # in place (None), or the node's replacement


def _sites(node: ast.AST) -> Iterator[tuple[str, Edit]]:
    """(operator name, edit) for every mutation this one node allows."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            for name, table in (("cmp_boundary", _CMP_BOUNDARY), ("cmp_negate", _CMP_NEGATE)):
                new = table.get(type(op))
                if new is not None:
                    yield name, _set_item("ops", i, new)
    elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _ARITH:
        yield "arith", _set_attr("op", _ARITH[type(node.op)])
    elif isinstance(node, ast.BoolOp):
        yield "bool_op", _set_attr("op", ast.Or if isinstance(node.op, ast.And) else ast.And)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "drop_not", lambda n: n.operand  # type: ignore[attr-defined]
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        yield "const_bool", _set_value(not node.value)
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield "const_plus1", _set_value(node.value + 1)
        yield "const_minus1", _set_value(node.value - 1)
    elif isinstance(node, ast.Constant) and type(node.value) is float:
        yield "const_float", _set_value(node.value + 1.0)
    elif isinstance(node, ast.Constant) and type(node.value) is str and len(node.value) < 40 and "\n" not in node.value:
        yield "const_str", _set_value("" if node.value else " ")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        yield "drop_neg", lambda n: n.operand  # type: ignore[attr-defined]
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALL_SWAP
          and not node.keywords):
        new_name = _CALL_SWAP[node.func.id]
        if new_name:
            yield "call_swap", _rename_call(new_name)
        elif len(node.args) == 1:
            yield "call_drop", lambda n: n.args[0]  # type: ignore[attr-defined]
    elif isinstance(node, ast.comprehension) and node.ifs:
        yield "filter_drop", _clear_ifs
    elif isinstance(node, ast.Return) and isinstance(node.value, (ast.Compare, ast.BoolOp)):
        yield "return_negate", lambda n: ast.Return(ast.UnaryOp(ast.Not(), n.value))  # type: ignore[attr-defined]
    if isinstance(node, ast.If):
        yield "if_drop", lambda n: n.orelse or [ast.Pass()]  # type: ignore[attr-defined]
        yield "if_negate", _negate_test
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if isinstance(block, list) and len(block) > 1 and not isinstance(node, (ast.Module, ast.ClassDef)):
            for i in range(len(block)):
                if not _is_docstring(block, i):
                    yield "stmt_drop", _drop_stmt(name, i)


def _is_docstring(block: list[ast.stmt], i: int) -> bool:
    s = block[i]
    return i == 0 and isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)


def _set_item(attr: str, i: int, kind: type[ast.AST]) -> Edit:
    def edit(n: ast.AST) -> None:
        getattr(n, attr)[i] = kind()
    return edit


def _set_attr(attr: str, kind: type[ast.AST]) -> Edit:
    def edit(n: ast.AST) -> None:
        setattr(n, attr, kind())
    return edit


def _set_value(value: object) -> Edit:
    def edit(n: ast.AST) -> None:
        n.value = value  # type: ignore[attr-defined]
    return edit


def _rename_call(name: str) -> Edit:
    def edit(n: ast.AST) -> None:
        n.func = ast.Name(name, ast.Load())  # type: ignore[attr-defined]
    return edit


def _clear_ifs(n: ast.AST) -> None:
    n.ifs = []  # type: ignore[attr-defined]


def _negate_test(n: ast.AST) -> None:
    n.test = ast.UnaryOp(ast.Not(), n.test)  # type: ignore[attr-defined]


def _drop_stmt(attr: str, i: int) -> Edit:
    def edit(n: ast.AST) -> None:
        del getattr(n, attr)[i]
    return edit


class _Replace(ast.NodeTransformer):
    """Replace the node at one ``ast.walk`` index with what ``edit`` makes of it."""

    def __init__(self, target: ast.AST, edit: Edit) -> None:
        self.target, self.edit = target, edit

    def visit(self, node: ast.AST) -> Any:
        if node is self.target:
            new = self.edit(node)
            return node if new is None else new
        return super().visit(node)


def mutants(prompt: str, solution: str, limit: int, seed: int = 0) -> list[str]:
    """Up to ``limit`` distinct mutant programs of ``prompt + solution`` (whole sources); [] if it does not parse."""
    source = prompt + solution
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    first_line = prompt.count("\n") + 1  # the prompt ends with a newline: the solution starts on this line
    original = ast.unparse(tree)
    by_op: dict[str, list[tuple[int, int]]] = {}
    nodes = list(ast.walk(tree))
    for index, node in enumerate(nodes):
        if getattr(node, "lineno", 0) < first_line:
            continue
        for k, (name, _edit) in enumerate(_sites(node)):
            by_op.setdefault(name, []).append((index, k))
    rng = random.Random(seed)
    queues = []
    for name in sorted(by_op):
        sites = by_op[name]
        rng.shuffle(sites)
        queues.append(sites)
    seen = {original}
    out: list[str] = []
    while any(queues) and len(out) < limit:
        for sites in queues:
            if not sites or len(out) >= limit:
                continue
            index, k = sites.pop()
            text = _apply(tree, index, k)
            if text is not None and text not in seen:
                seen.add(text)
                out.append(text)
    return out


def _apply(tree: ast.Module, index: int, k: int) -> str | None:
    fresh = copy.deepcopy(tree)
    target = list(ast.walk(fresh))[index]
    _name, edit = list(_sites(target))[k]
    try:
        new = _Replace(target, edit).visit(fresh)
        assert isinstance(new, ast.Module)
        text = ast.unparse(ast.fix_missing_locations(new))
        compile(text, "<mutant>", "exec")
    except (SyntaxError, ValueError, TypeError, AssertionError, RecursionError):
        return None
    return text
