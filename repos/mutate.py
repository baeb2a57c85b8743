"""Procedural bug injection: one small rewrite of one function, as SWE-smith's procedural modifiers do.

Every operator finds its sites with ``ast`` and edits the source text at the node's exact span, so the rest of
the file (comments, formatting) is untouched and the diff is the change alone. Operators, each named in the
yield report:

- ``flip_comparison``: ``<`` -> ``>=``, ``==`` -> ``!=``, ``in`` -> ``not in``, ... (the negation)
- ``flip_arithmetic``: ``+`` <-> ``-``, ``*`` -> ``+``, ``/`` and ``//`` -> ``*``, ``%`` -> ``//``
- ``off_by_one``: an integer constant n -> n + 1, or a slice bound b -> b + 1
- ``drop_condition``: ``a and b`` / ``a or b`` -> ``a`` (one operand of a boolean operator dropped)
- ``drop_branch``: an ``if`` without ``else`` removed
- ``drop_statement``: an expression statement, assignment or augmented assignment removed
- ``drop_return``: a ``return`` removed
- ``swap_arguments``: the first two positional arguments of a call swapped
"""

from __future__ import annotations

import ast
import random
from collections.abc import Iterator
from dataclasses import dataclass

OPERATORS = ("flip_comparison", "flip_arithmetic", "off_by_one", "drop_condition", "drop_branch",
             "drop_statement", "drop_return", "swap_arguments")
NEGATED = {ast.Lt: ">=", ast.LtE: ">", ast.Gt: "<=", ast.GtE: "<", ast.Eq: "!=", ast.NotEq: "==",
           ast.Is: "is not", ast.IsNot: "is", ast.In: "not in", ast.NotIn: "in"}
SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
          ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
          ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%"}
ARITHMETIC = {ast.Add: "-", ast.Sub: "+", ast.Mult: "+", ast.Div: "*", ast.FloorDiv: "*", ast.Mod: "//"}


@dataclass(frozen=True)
class Mutation:
    operator: str
    path: str
    function: str  # qualified name: Class.method
    line: int
    source: str  # the whole file after the rewrite

    @property
    def label(self) -> str:
        return f"{self.operator} {self.path}:{self.function}:{self.line}"


class _Text:
    """The file as bytes with line offsets: ``ast`` columns count UTF-8 bytes."""

    def __init__(self, source: str) -> None:
        self.data = source.encode()
        self.starts = [0]
        for line in self.data.split(b"\n")[:-1]:
            self.starts.append(self.starts[-1] + len(line) + 1)

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.offset(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def replace(self, start: int, end: int, new: bytes) -> str:
        return (self.data[:start] + new + self.data[end:]).decode()


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield prefix + child.name, child
                yield from walk(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, prefix + child.name + ".")
    yield from walk(tree, "")


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not those of functions or classes nested in it (they are their own)."""
    stack = list(getattr(fn, "body", []))
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                stack.append(child)


def _gap_op(text: _Text, left: ast.AST, right: ast.AST, symbol: str) -> tuple[int, int] | None:
    """Where the operator ``symbol`` stands between two operands (only brackets and spaces besides it)."""
    start, end = text.span(left)[1], text.span(right)[0]
    gap = text.data[start:end].decode()
    stripped = gap.replace("(", " ").replace(")", " ").replace("\\\n", " ").split()
    if " ".join(stripped) != symbol:
        return None
    at = gap.find(symbol.split()[0])
    close = gap.rfind(symbol.split()[-1]) + len(symbol.split()[-1])
    return start + at, start + close


def _block_of(fn: ast.AST, stmt: ast.stmt) -> list[ast.stmt] | None:
    for node in [fn, *_own_nodes(fn)]:
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and any(s is stmt for s in block):
                return block
        for handler in getattr(node, "handlers", []) or []:
            if any(s is stmt for s in handler.body):
                return handler.body
    return None


def _remove_statement(text: _Text, fn: ast.AST, stmt: ast.stmt) -> str | None:
    """The file without ``stmt`` (``pass`` where it was alone in its block); None when it shares its lines."""
    start, end = text.span(stmt)
    line_start = text.starts[stmt.lineno - 1]
    if text.data[line_start:start].strip():
        return None
    line_end = text.data.find(b"\n", end)
    line_end = len(text.data) if line_end < 0 else line_end
    if text.data[end:line_end].strip() and not text.data[end:line_end].strip().startswith(b"#"):
        return None
    block = _block_of(fn, stmt)
    if block is None:
        return None
    if len(block) == 1:
        return text.replace(start, end, b"pass")
    return text.replace(line_start, min(line_end + 1, len(text.data)), b"")


def _droppable(operator: str, node: ast.AST) -> bool:
    """Whether ``node`` is a statement the ``drop_*`` operator removes."""
    if operator == "drop_branch":
        return isinstance(node, ast.If) and not node.orelse
    if operator == "drop_statement":
        return isinstance(node, ast.Assign | ast.AugAssign) or (
            isinstance(node, ast.Expr) and not isinstance(node.value, ast.Constant))
    return operator == "drop_return" and isinstance(node, ast.Return) and node.value is not None


def _sites(operator: str, text: _Text, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[tuple[int, str]]:
    """``(line, mutated file)`` for every place ``operator`` applies in ``fn``."""
    docstring = ast.get_docstring(fn) is not None and fn.body and fn.body[0]
    for node in sorted(_own_nodes(fn), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))):
        if node is docstring:
            continue
        line = getattr(node, "lineno", fn.lineno)
        if operator == "flip_comparison" and isinstance(node, ast.Compare) and len(node.ops) == 1:
            op = type(node.ops[0])
            where = _gap_op(text, node.left, node.comparators[0], SYMBOL[op])
            if where:
                yield line, text.replace(*where, NEGATED[op].encode())
        elif operator == "flip_arithmetic" and isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                continue  # "%" formatting and string concatenation
            where = _gap_op(text, node.left, node.right, SYMBOL[type(node.op)])
            if where:
                yield line, text.replace(*where, ARITHMETIC[type(node.op)].encode())
        elif operator == "off_by_one":
            if isinstance(node, ast.Constant) and type(node.value) is int:
                yield line, text.replace(*text.span(node), str(node.value + 1).encode())
            elif isinstance(node, ast.Slice):
                for bound in (node.lower, node.upper):
                    if bound is not None:
                        start, end = text.span(bound)
                        yield line, text.replace(start, end, b"(" + text.data[start:end] + b") + 1")
        elif operator == "drop_condition" and isinstance(node, ast.BoolOp) and len(node.values) == 2:
            start, end = text.span(node)
            first = text.span(node.values[0])
            yield line, text.replace(start, end, b"(" + text.data[first[0]:first[1]] + b")")
        elif _droppable(operator, node):
            mutated = _remove_statement(text, fn, node)  # type: ignore[arg-type]
            if mutated is not None:
                yield line, mutated
        elif operator == "swap_arguments" and isinstance(node, ast.Call) and len(node.args) >= 2 and not any(
                isinstance(a, ast.Starred) for a in node.args[:2]):
            (a0, a1), (b0, b1) = text.span(node.args[0]), text.span(node.args[1])
            one, two = text.data[a0:a1], text.data[b0:b1]
            if one != two:
                yield line, (text.data[:a0] + two + text.data[a1:b0] + one + text.data[b1:]).decode()


def mutations(path: str, source: str, operators: tuple[str, ...] = OPERATORS) -> Iterator[Mutation]:
    """Every single-site mutation of every function in one file that still compiles and changes the code."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    text = _Text(source)
    before = ast.dump(tree)
    for qualname, fn in _functions(tree):
        for operator in operators:
            for line, mutated in _sites(operator, text, fn):
                try:
                    changed = ast.dump(ast.parse(mutated)) != before
                except SyntaxError:
                    continue
                if changed:
                    yield Mutation(operator, path, qualname, line, mutated)


def sample(candidates: list[Mutation], per_operator: int, seed: int) -> list[Mutation]:
    """At most ``per_operator`` mutations of each operator, spread over functions (seeded, reproducible)."""
    rng = random.Random(seed)
    chosen: list[Mutation] = []
    for operator in OPERATORS:
        pool = [m for m in candidates if m.operator == operator]
        rng.shuffle(pool)
        seen: set[str] = set()
        first = [m for m in pool if not (m.function in seen or seen.add(m.function))]  # type: ignore[func-returns-value]
        rest = [m for m in pool if m not in first]
        chosen += (first + rest)[:per_operator]
    return chosen
