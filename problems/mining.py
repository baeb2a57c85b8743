"""Executable problems mined from doctests: top-level, self-contained functions whose docstrings carry examples.

``mine_doctest_problems(files)`` takes ``(repo, path, content)`` of Python files and returns *unverified*
``ExecProblem`` records plus the number of files and functions each step kept or dropped. The caller runs
every reference solution in the sandbox and keeps only the problems whose original function passes its own
examples (printing side effects, results that are not plain data, examples that depend on state the
function mutates: all fail there and are dropped then).

A problem is the function cut in two, exactly as HumanEval composes prompt + completion:

* ``prompt`` = the module-level standard-library imports the function needs + decorators + signature +
  docstring (a valid definition on its own: the judge executes it for helpers, and it defines nothing the
  tests need);
* ``reference_solution`` = the body after the docstring, so ``prompt + reference_solution`` is the original
  function (plus its imports);
* ``tests`` = a program defining ``check(candidate)`` that runs the kept examples with doctest's own
  ``DocTestRunner`` and ``OutputChecker`` in a fresh namespace where the entry-point name is the candidate,
  so ``ELLIPSIS``/``NORMALIZE_WHITESPACE`` directives, expected exceptions and printed output keep their
  doctest meaning;
* ``test_cases`` = one self-contained snippet per checking example whose value comes from the function,
  carrying the earlier examples that bind or may change the names it reads, for partial credit.

Self-contained means every free name of the function (found with ``symtable``, so scoping is Python's own)
is a builtin, one of its own parameters or locals, or a module-level import of a standard-library module
(``sys.stdlib_module_names``); names read at definition time (decorators, defaults, annotations unless the
module has ``from __future__ import annotations``) obey the same rule. A static check on the dotted names
the function uses drops network, files, processes and the environment (``socket``, ``urllib``,
``subprocess``, ``os`` except its pure path and constant helpers, ``pathlib``, ``open()``, ...). Examples
that read names other than the function, builtins, stdlib modules and what earlier kept examples bound are
dropped one by one, and so are examples the harness cannot run as doctest meant them: ``+SKIP``, arguments
that are not plain data (lambdas, ranges, iterators, objects: the candidate is called across a process
boundary), the function used as a decorator, output showing a set of strings (its order varies with the hash
seed). A closing Markdown code fence is not taken as expected output. A function left without an example that
calls it and checks something is dropped; so are generator functions and functions that only return lazy
iterators (their result cannot cross the boundary).

Nothing here raises on bad input: a file that does not parse, an odd docstring or a huge file is counted.
"""

from __future__ import annotations

import ast
import builtins
import doctest
import hashlib
import re
import symtable
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

from codemill.problems.problem import ExecProblem

SOURCE = "mined"
MINING_CODE_VERSION = "mining-v2"  # bump when what is mined, or how its tests are written, changes
MAX_FILE_CHARS = 2_000_000
MAX_TESTS_CHARS = 200_000

# Steps, in the order a file or a function meets them; every function with doctests is counted in exactly one
# of the function steps after "functions_with_doctests" (a drop reason or "kept").
FILE_STEPS = ("files", "files_without_examples", "file_too_large", "syntax_error", "miner_error_files",
              "files_parsed")
FUNCTION_STEPS = ("functions_with_doctests", "not_top_level", "async_def", "bad_docstring", "no_body",
                  "generator_function", "returns_iterator", "decorated", "not_self_contained", "non_stdlib_import",
                  "uses_io_or_network", "no_checkable_example", "too_large", "miner_error", "duplicate", "kept")
EXAMPLE_STEPS = ("examples_in_kept", "examples_dropped_in_kept", "test_cases")

STDLIB = frozenset(sys.stdlib_module_names)
BUILTIN_NAMES = frozenset(n for n in dir(builtins) if not n.startswith("_")) | {"__debug__", "__build_class__"}
IO_BUILTINS = frozenset({"open", "input", "breakpoint", "exit", "quit", "help", "copyright", "credits", "license"})
DYNAMIC_BUILTINS = frozenset({"exec", "eval", "compile", "__import__", "globals"})

# Whole modules that reach the network, files, processes, threads, the interpreter's state or the environment.
IO_MODULES = frozenset({
    "socket", "ssl", "select", "selectors", "asyncio", "asyncore", "asynchat", "urllib", "http", "ftplib",
    "smtplib", "smtpd", "poplib", "imaplib", "nntplib", "telnetlib", "xmlrpc", "socketserver", "wsgiref",
    "webbrowser", "subprocess", "multiprocessing", "concurrent", "threading", "_thread", "signal", "pty", "tty",
    "termios", "fcntl", "mmap", "resource", "pwd", "grp", "spwd", "crypt", "getpass", "pathlib", "shutil",
    "tempfile", "glob", "filecmp", "fileinput", "linecache", "sqlite3", "dbm", "shelve", "zipfile", "tarfile",
    "zipimport", "importlib", "pkgutil", "runpy", "site", "sysconfig", "platform", "ctypes", "curses", "tkinter",
    "turtle", "turtledemo", "idlelib", "pdb", "bdb", "trace", "tracemalloc", "cProfile", "profile", "pstats",
    "faulthandler", "atexit", "syslog", "mailbox", "netrc", "mimetypes", "locale", "gettext", "venv",
    "ensurepip", "distutils", "unittest", "doctest", "code", "pydoc", "msvcrt", "winreg", "winsound", "_winapi",
    "nt", "posix", "_posixsubprocess", "_socket", "_io", "imp", "compileall", "py_compile", "tabnanny",
    "pyclbr", "modulefinder", "ossaudiodev", "aifc", "wave", "sunau", "cgi", "cgitb", "sched", "readline",
    "rlcompleter", "_ctypes", "gc", "inspect", "_signal", "_multiprocessing", "_ssl", "_sqlite3", "_osx_support",
})
OS_PATH_PURE = frozenset({"join", "split", "splitext", "splitdrive", "basename", "dirname", "normpath", "normcase",
                          "isabs", "commonprefix", "commonpath", "splitroot", "sep", "altsep", "extsep", "pathsep",
                          "curdir", "pardir", "defpath", "devnull"})
OS_PURE = frozenset({"sep", "altsep", "extsep", "pathsep", "linesep", "curdir", "pardir", "defpath", "devnull",
                     "name", "fspath", "fsencode", "fsdecode", "PathLike", "strerror", "SEEK_SET", "SEEK_CUR",
                     "SEEK_END"})
SYS_PURE = frozenset({"maxsize", "maxunicode", "byteorder", "float_info", "int_info", "hash_info",
                      "float_repr_style", "version_info", "version", "hexversion", "implementation", "getsizeof",
                      "intern", "getrecursionlimit", "getdefaultencoding", "getfilesystemencoding", "exc_info",
                      "exception", "platform"})
OPEN_NAMES = frozenset({"open", "open_code", "fdopen", "FileIO", "uuid1", "getnode"})
READING_BUILTINS = frozenset({"len", "sorted", "list", "tuple", "set", "frozenset", "dict", "str", "repr", "print",
                              "type", "isinstance", "sum", "min", "max", "abs", "bool", "int", "float", "hash",
                              "round", "any", "all", "format", "ascii", "bytes", "complex", "divmod", "pow"})
TRIVIAL_DECORATORS = frozenset({"functools.lru_cache", "functools.cache"})

# The judge-side runner every tests program and test case carries (stdlib only; it runs in the sandbox).
# The candidate is a proxy: its exceptions arrive rebuilt with their own type and message where the judge has
# the type loaded (judge_server.candidate_exception), so doctest compares them as it would the original's.
HELPER = r'''import doctest as _doctest
import traceback as _traceback


def _doctest_examples(candidate, entry, imports, examples):
    """Run doctest examples with doctest's own runner and output checker; ``entry`` is the candidate."""

    def call(*args, **kwargs):
        return candidate(*args, **kwargs)

    call.__name__ = call.__qualname__ = entry
    globs = {"__name__": "__doctest__"}
    exec(imports, globs)
    globs[entry] = call
    parsed = [_doctest.Example(source, want, exc_msg, lineno=lineno,
                               options={_doctest.OPTIONFLAGS_BY_NAME[k]: v for k, v in options.items()})
              for source, want, exc_msg, options, lineno in examples]
    report = []
    runner = _Runner(verbose=False)
    result = runner.run(_doctest.DocTest(parsed, globs, entry, None, 0, None), out=report.append,
                        clear_globs=False)
    if result.failed:
        raise AssertionError("".join(report)[:2000])


class _Runner(_doctest.DocTestRunner):
    """doctest's runner with short reports: the example, then what differed or the exception's last line."""

    def report_failure(self, out, test, example, got):
        out("Failed example:\n" + example.source + self._checker.output_difference(example, got, self.optionflags))

    def report_unexpected_exception(self, out, test, example, exc_info):
        out("Failed example:\n" + example.source + "Exception raised: "
            + "".join(_traceback.format_exception_only(*exc_info[:2])))
'''


class _Drop(Exception):
    def __init__(self, step: str, detail: str = "") -> None:
        super().__init__(detail)
        self.step, self.detail = step, detail


@dataclass
class _Binding:
    """A name bound by an import: the dotted name it stands for and the statements that bind it."""

    dotted: str
    statements: list[str] = field(default_factory=list)
    stdlib: bool = True


@dataclass
class _Example:
    source: str
    want: str
    exc_msg: str | None
    options: dict[str, bool]
    lineno: int
    loads: set[str]
    stores: set[str]
    touches: set[str]
    is_expression: bool
    uses_entry: bool = False  # the function is called or passed on (not only ``f.__name__``)

    def as_data(self) -> tuple[str, str, str | None, dict[str, bool], int]:
        return (self.source, self.want, self.exc_msg, self.options, self.lineno)


def mine_doctest_problems(files: Iterable[tuple[str, str, str]],
                          split_unit_of: Callable[[str, str], str] | None = None
                          ) -> tuple[list[ExecProblem], dict[str, int]]:
    """Unverified problems from ``(repo, path, content)`` Python files, and counts per step (ordered).
    ``split_unit_of(repo, path)`` names a problem's split unit (default: the repository)."""
    counts: dict[str, int] = dict.fromkeys(FILE_STEPS + FUNCTION_STEPS + EXAMPLE_STEPS, 0)
    problems: list[ExecProblem] = []
    seen: set[str] = set()
    for repo, path, content in files:
        counts["files"] += 1
        if not isinstance(content, str) or ">>>" not in content:
            counts["files_without_examples"] += 1
            continue
        if len(content) > MAX_FILE_CHARS:
            counts["file_too_large"] += 1
            continue
        module = _parse(content)
        if module is None:
            counts["syntax_error"] += 1
            continue
        try:
            outcomes = list(_mine_module(repo, path, *module))
        except Exception:  # the module-level analysis failed: no function of this file is counted
            counts["miner_error_files"] += 1
            continue
        counts["files_parsed"] += 1
        for outcome in outcomes:
            counts["functions_with_doctests"] += 1
            if isinstance(outcome, _Drop):
                counts[outcome.step] += 1
                continue
            problem, n_examples, n_dropped = outcome
            key = hashlib.sha256((problem.prompt + "\0" + (problem.reference_solution or "") + "\0"
                                  + problem.tests).encode()).hexdigest()
            if key in seen:
                counts["duplicate"] += 1
                continue
            seen.add(key)
            counts["kept"] += 1
            counts["examples_in_kept"] += n_examples
            counts["examples_dropped_in_kept"] += n_dropped
            counts["test_cases"] += len(problem.test_cases)
            if split_unit_of is not None:
                problem = replace(problem, split_unit=split_unit_of(repo, path))
            problems.append(problem)
    return problems, counts


def drop_reasons() -> tuple[str, ...]:
    """The function steps that drop (everything between "functions_with_doctests" and "kept")."""
    return FUNCTION_STEPS[1:-1]


# --- one module ------------------------------------------------------------------------------------------
def _parse(content: str) -> tuple[str, ast.Module, symtable.SymbolTable] | None:
    text = content.replace("\r\n", "\n").replace("\r", "\n")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(text)
            table = symtable.symtable(text, "<mined>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None
    return text, tree, table


def _mine_module(repo: str, path: str, text: str, tree: ast.Module,
                 table: symtable.SymbolTable) -> Iterator[_Drop | tuple[ExecProblem, int, int]]:
    lines = text.split("\n")
    top_level = {id(node) for node in tree.body if isinstance(node, ast.FunctionDef)}
    bindings = _module_imports(tree)
    module_bound = {s.get_name() for s in table.get_symbols()
                    if s.is_assigned() or s.is_imported() or s.is_namespace()}
    future_annotations = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                             and any(a.name == "annotations" for a in n.names) for n in tree.body)
    tables = {(t.get_name(), t.get_lineno()): t for t in table.get_children() if t.get_type() == "function"}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = _docstring(node)
        if doc is None or ">>>" not in doc:
            continue
        try:
            raw = doctest.DocTestParser().get_examples(doc)
        except Exception:  # inconsistent indentation and the like: doctest itself would refuse it
            yield _Drop("bad_docstring")
            continue
        if not raw:
            continue
        try:
            if isinstance(node, ast.AsyncFunctionDef) and node in tree.body:
                raise _Drop("async_def")
            if id(node) not in top_level or not isinstance(node, ast.FunctionDef):
                raise _Drop("not_top_level")
            ftable = tables.get((node.name, node.lineno))
            if ftable is None:
                raise _Drop("not_top_level", "no symbol table")
            yield _make_problem(repo, path, lines, node, ftable, raw, bindings, module_bound, future_annotations)
        except _Drop as drop:
            yield drop
        except (RecursionError, MemoryError, ValueError, SyntaxError):
            yield _Drop("bad_docstring")
        except Exception as exc:  # a case this miner does not handle: counted, never raised
            yield _Drop("miner_error", repr(exc))


def _docstring(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    if node.body and isinstance(node.body[0], ast.Expr):
        value = node.body[0].value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return value.value
    return None


def _module_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-scope statements, through if/try/with/for/while blocks but not into functions or classes."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in ("body", "orelse", "finalbody"):
            sub = getattr(stmt, name, None)
            if isinstance(sub, list):
                yield from _module_statements(sub)
        for handler in getattr(stmt, "handlers", []) or []:
            yield from _module_statements(handler.body)


def _import_bindings(stmt: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, _Binding]]:
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            stdlib = alias.name.split(".")[0] in STDLIB
            if alias.asname:
                yield alias.asname, _Binding(alias.name, [f"import {alias.name} as {alias.asname}"], stdlib)
            else:
                top = alias.name.split(".")[0]
                yield top, _Binding(top, [f"import {alias.name}"], stdlib)
        return
    module = stmt.module or ""
    stdlib = stmt.level == 0 and module.split(".")[0] in STDLIB and module != "__future__"
    for alias in stmt.names:
        if alias.name == "*":
            continue
        bound = alias.asname or alias.name
        text = f"from {'.' * stmt.level}{module} import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
        yield bound, _Binding(f"{module}.{alias.name}" if stmt.level == 0 else f".{module}.{alias.name}",
                              [text], stdlib)


def _module_imports(tree: ast.Module) -> dict[str, _Binding]:
    out: dict[str, _Binding] = {}
    for stmt in _module_statements(tree.body):
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue
        for name, binding in _import_bindings(stmt):
            old = out.get(name)
            if old is None:
                out[name] = binding
            elif old.dotted == binding.dotted:
                for s in binding.statements:
                    if s not in old.statements:
                        old.statements.append(s)
            else:  # bound twice to different things (a try/except ImportError fallback): not a plain stdlib name
                old.stdlib = False
    return out


# --- what a name may be used for -------------------------------------------------------------------------
def io_reason(dotted: str) -> str | None:
    """Why using ``dotted`` (a module-qualified name such as ``os.path.join``) reaches outside a pure function."""
    parts = dotted.split(".")
    top = parts[0]
    if top == "builtins" and len(parts) > 1:
        return parts[1] if parts[1] in IO_BUILTINS | DYNAMIC_BUILTINS else None
    if top in IO_MODULES:
        return top
    if any(p in OPEN_NAMES for p in parts[1:]):
        return dotted
    if top in ("os", "posixpath", "ntpath", "genericpath"):
        rest = parts[1:]
        if top == "os" and rest[:1] == ["path"]:
            rest = rest[1:]
            return None if rest and rest[0] in OS_PATH_PURE else dotted
        if top == "os":
            return None if rest and rest[0] in OS_PURE else dotted
        return None if rest and rest[0] in OS_PATH_PURE else dotted
    if top == "sys":
        return None if len(parts) > 1 and parts[1] in SYS_PURE else dotted
    return None


def _dotted_uses(tree: ast.AST, names: set[str]) -> Iterator[tuple[str, str]]:
    """(name, the attribute chain it heads) for every load of one of ``names``."""
    heads: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain: list[str] = []
            cur: ast.expr = node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id in names and id(cur) not in heads:
                heads.add(id(cur))
                yield cur.id, ".".join([cur.id, *reversed(chain)])
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in names and id(node) not in heads:
            yield node.id, node.id


def _canonical(binding: _Binding, use: str) -> str:
    return binding.dotted + use[use.index("."):] if "." in use else binding.dotted


def _scope_globals(table: symtable.SymbolTable) -> tuple[set[str], set[str]]:
    """(global names a function and its nested scopes use, names declared ``global``)."""
    used: set[str] = set()
    declared: set[str] = set()
    stack = [table]
    while stack:
        t = stack.pop()
        for sym in t.get_symbols():
            if sym.is_declared_global():
                declared.add(sym.get_name())
            if sym.is_global() and (sym.is_referenced() or sym.is_assigned()):
                used.add(sym.get_name())
        stack.extend(t.get_children())
    return used, declared


def _deftime_names(node: ast.FunctionDef, future_annotations: bool) -> set[str]:
    exprs: list[ast.AST] = [*node.decorator_list, *node.args.defaults,
                            *(d for d in node.args.kw_defaults if d is not None)]
    if not future_annotations:
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            if arg is not None and arg.annotation is not None:
                exprs.append(arg.annotation)
        if node.returns is not None:
            exprs.append(node.returns)
    return {n.id for e in exprs for n in ast.walk(e) if isinstance(n, ast.Name)}


def _local_imports(node: ast.FunctionDef) -> dict[str, _Binding]:
    out: dict[str, _Binding] = {}
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Import, ast.ImportFrom)):
            if isinstance(sub, ast.ImportFrom) and any(a.name == "*" for a in sub.names):
                raise _Drop("not_self_contained", "star import")
            for name, binding in _import_bindings(sub):
                out[name] = binding
    return out


# --- one function ----------------------------------------------------------------------------------------
def _make_problem(repo: str, path: str, lines: list[str], node: ast.FunctionDef, ftable: symtable.SymbolTable,
                  raw: list[doctest.Example], bindings: dict[str, _Binding], module_bound: set[str],
                  future_annotations: bool) -> tuple[ExecProblem, int, int]:
    entry = node.name
    if len(node.body) < 2:
        raise _Drop("no_body")
    if _is_generator(node):  # its result is an iterator, which cannot cross to the judge as plain data
        raise _Drop("generator_function")
    if _returns_iterator(node):
        raise _Drop("returns_iterator")
    doc_node = node.body[0]
    assert doc_node.end_lineno is not None and node.end_lineno is not None
    after_doc = lines[doc_node.end_lineno - 1].encode()[doc_node.end_col_offset or 0:].strip()
    if (after_doc and not after_doc.startswith(b"#")) or node.body[1].lineno <= doc_node.end_lineno:
        raise _Drop("no_body", "code on the docstring's last line")

    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(dec, ast.Call) and not all(isinstance(a, ast.Constant) for a in
                                                 [*dec.args, *(k.value for k in dec.keywords)]):
            raise _Drop("decorated")
        dotted = _dotted_name(target, bindings)
        if dotted not in TRIVIAL_DECORATORS:
            raise _Drop("decorated", str(dotted))
    # the names the function reads: its scopes' globals (symtable) and what the def line evaluates
    used, declared = _scope_globals(ftable)
    if declared:
        raise _Drop("not_self_contained", "global statement: " + ", ".join(sorted(declared)))
    deftime = _deftime_names(node, future_annotations)
    needed: list[str] = []
    for name in sorted((used | deftime) - {entry}):  # recursion is fine: the candidate defines the name
        if name in bindings:
            needed.append(name)
        elif name in module_bound or name not in BUILTIN_NAMES | DYNAMIC_BUILTINS | IO_BUILTINS:
            raise _Drop("not_self_contained", f"uses module name {name!r}")
        elif name in DYNAMIC_BUILTINS:
            raise _Drop("not_self_contained", f"dynamic code: {name}")
    local = _local_imports(node)
    for name in needed:
        if not bindings[name].stdlib:
            raise _Drop("non_stdlib_import", bindings[name].dotted)
    for binding in local.values():
        if not binding.stdlib:
            raise _Drop("non_stdlib_import", binding.dotted)
    # calls of builtins that reach files or the terminal
    for name in used | deftime:
        if name in IO_BUILTINS and name not in module_bound:
            raise _Drop("uses_io_or_network", name)
    scope = {**{n: bindings[n] for n in needed}, **local}
    for name, use in _dotted_uses(node, set(scope)):
        reason = io_reason(_canonical(scope[name], use))
        if reason:
            raise _Drop("uses_io_or_network", reason)

    examples, dropped, example_imports = _keep_examples(raw, entry, bindings)
    groups = _test_groups(examples, entry)
    if not groups:
        raise _Drop("no_checkable_example")
    in_groups = sorted({i for g in groups for i in g})
    kept = [examples[i] for i in in_groups]
    dropped += len(examples) - len(kept)
    renumber = {old: new for new, old in enumerate(in_groups)}

    start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
    head = "\n".join(lines[start:doc_node.end_lineno]) + "\n"
    body = "\n".join(lines[doc_node.end_lineno:node.end_lineno]) + "\n"
    imports = [s for n in sorted(needed, key=lambda n: bindings[n].statements[0]) for s in bindings[n].statements]
    preamble = ("from __future__ import annotations\n" if future_annotations else "") + "".join(
        s + "\n" for s in dict.fromkeys(imports))
    prompt = (preamble + "\n\n" if preamble else "") + head
    imports_src = "".join(s + "\n" for s in dict.fromkeys(example_imports))
    all_data = [e.as_data() for e in kept]
    tests = (HELPER + f"\n\n_ENTRY = {entry!r}\n_IMPORTS = {imports_src!r}\n_EXAMPLES = {all_data!r}\n\n\n"
             "def check(candidate):\n    _doctest_examples(candidate, _ENTRY, _IMPORTS, _EXAMPLES)\n")
    cases = [HELPER + f"\n\n_doctest_examples(candidate, {entry!r}, {imports_src!r}, "
             f"{[kept[renumber[i]].as_data() for i in g]!r})\n" for g in groups]
    if len(tests) + sum(map(len, cases)) > MAX_TESTS_CHARS:
        raise _Drop("too_large")
    digest = hashlib.sha256("\0".join([prompt, body, tests]).encode()).hexdigest()[:10]
    problem = ExecProblem(problem_id=f"{SOURCE}/{repo}/{path}::{entry}#{digest}", prompt=prompt, entry_point=entry,
                          tests=tests, test_cases=cases, reference_solution=body, source=SOURCE, split_unit=repo)
    return problem, len(kept), dropped


def _is_generator(node: ast.FunctionDef) -> bool:
    stack: list[ast.AST] = list(node.body)
    while stack:
        sub = stack.pop()
        if isinstance(sub, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(sub))
    return False


ITERATOR_BUILTINS = frozenset({"map", "filter", "zip", "iter", "reversed", "enumerate", "range"})


def _returns_iterator(node: ast.FunctionDef) -> bool:
    """Every ``return`` of the function gives a lazy iterator (``map(...)``, ``itertools.chain(...)``, ...)."""
    returns: list[ast.Return] = []
    stack: list[ast.AST] = list(node.body)
    while stack:
        sub = stack.pop()
        if isinstance(sub, ast.Return):
            returns.append(sub)
        if not isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(sub))

    def lazy(ret: ast.Return) -> bool:
        call = ret.value
        if not isinstance(call, ast.Call):
            return False
        func = call.func
        if isinstance(func, ast.Name):
            return func.id in ITERATOR_BUILTINS
        return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "itertools"

    return bool(returns) and all(map(lazy, returns))


def _dotted_name(expr: ast.expr, bindings: dict[str, _Binding]) -> str | None:
    chain: list[str] = []
    while isinstance(expr, ast.Attribute):
        chain.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name) or expr.id not in bindings:
        return None
    return ".".join([bindings[expr.id].dotted, *reversed(chain)])


# --- examples --------------------------------------------------------------------------------------------
_FLAG_NAMES = {v: k for k, v in doctest.OPTIONFLAGS_BY_NAME.items()}


def _example_names(tree: ast.AST) -> tuple[set[str], set[str]]:
    loads: set[str] = set()
    stores: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else stores).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stores.add(node.name)
        elif isinstance(node, ast.arg):
            stores.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                stores.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            stores.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            stores.update(node.names)
    return loads, stores


def _base_name(expr: ast.expr) -> str | None:
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _touched(tree: ast.AST, entry: str) -> set[str]:
    """Names an example may change without rebinding them (the candidate cannot: it gets copies)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            candidates = [node.func.value] if isinstance(node.func, ast.Attribute) else []
            if not (isinstance(node.func, ast.Name) and node.func.id in READING_BUILTINS | {entry}):
                candidates += [*node.args, *(k.value for k in node.keywords)]
            candidates = [c.value if isinstance(c, ast.Starred) else c for c in candidates]
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and not isinstance(node.ctx, ast.Load):
            candidates = [node.value]
        else:
            continue
        out.update(n for n in map(_base_name, candidates) if n)
    return out


PLAIN_BUILTINS = frozenset({"list", "tuple", "dict", "set", "frozenset", "str", "int", "float", "bool", "bytes",
                            "complex", "sorted", "len", "abs", "round", "min", "max", "sum", "repr", "chr", "ord",
                            "hex", "oct", "bin", "divmod", "pow", "ascii", "format", "hash", "any", "all"})
PLAIN_MODULE_CALLS = frozenset({"math", "cmath", "json", "textwrap", "unicodedata"})  # their lowercase functions
PLAIN_CONSTANTS = frozenset({"math.pi", "math.e", "math.tau", "math.inf", "math.nan", "cmath.pi", "cmath.e",
                             "sys.maxsize", "sys.maxunicode", "string.ascii_letters", "string.ascii_lowercase",
                             "string.ascii_uppercase", "string.digits", "string.hexdigits", "string.octdigits",
                             "string.punctuation", "string.printable", "string.whitespace"})
_PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes)


def _plain(expr: ast.expr, names: set[str], entry: str, scope: dict[str, _Binding]) -> bool:
    """Whether ``expr`` surely evaluates to plain data (None/bool/int/float/complex/str/bytes and containers).

    Conservative: False drops one example (an argument the harness could not pass), never a wrong problem."""
    def plain(e: ast.expr | None) -> bool:
        if e is None:
            return True
        if isinstance(e, ast.Constant):
            return isinstance(e.value, _PLAIN_TYPES)
        if isinstance(e, ast.Starred):
            return plain(e.value)
        if isinstance(e, (ast.List, ast.Tuple, ast.Set)):
            return all(map(plain, e.elts))
        if isinstance(e, ast.Dict):
            return all(map(plain, e.keys)) and all(map(plain, e.values))
        if isinstance(e, (ast.ListComp, ast.SetComp, ast.DictComp, ast.JoinedStr, ast.Compare)):
            return True
        if isinstance(e, ast.UnaryOp):
            return plain(e.operand)
        if isinstance(e, ast.BinOp):
            return plain(e.left) and plain(e.right)
        if isinstance(e, ast.BoolOp):
            return all(map(plain, e.values))
        if isinstance(e, ast.IfExp):
            return plain(e.body) and plain(e.orelse)
        if isinstance(e, ast.Name):
            return e.id in names
        if isinstance(e, ast.Subscript):
            return plain(e.value)
        dotted = _dotted_name(e.func if isinstance(e, ast.Call) else e, scope) if isinstance(
            e, (ast.Call, ast.Attribute)) else None
        if isinstance(e, ast.Attribute):
            return dotted in PLAIN_CONSTANTS
        if isinstance(e, ast.Call):
            func = e.func
            if isinstance(func, ast.Name) and (func.id == entry or (func.id in PLAIN_BUILTINS and func.id not in
                                                                     names and func.id not in scope)):
                return True
            if isinstance(func, ast.Attribute) and isinstance(func.value, (ast.Constant, ast.JoinedStr)):
                return isinstance(func.value, ast.JoinedStr) or isinstance(func.value.value, (str, bytes))
            parts = dotted.split(".") if dotted else []
            return len(parts) == 2 and parts[0] in PLAIN_MODULE_CALLS and parts[1][:1].islower()
        return False

    return plain(expr)


# A set display of two or more strings ({'a', 'b'}): its order depends on the interpreter's hash seed.
_STRING_SET = re.compile(r"""\{\s*b?(['"])(?:(?!\1).)*\1\s*,""")


def _uses(tree: ast.AST, entry: str) -> bool:
    """The example calls the function or passes it on; reading an attribute of it (``f.__doc__``) is not a use."""
    attribute_bases = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    return any(isinstance(n, ast.Name) and n.id == entry and id(n) not in attribute_bases for n in ast.walk(tree))


def _unfenced(want: str) -> str:
    """The expected output without a closing Markdown code fence that doctest would read as output."""
    lines = want.splitlines(keepends=True)
    if lines and lines[-1].strip().startswith("```"):
        return "".join(lines[:-1])
    return want


def _keep_examples(raw: list[doctest.Example], entry: str,
                   bindings: dict[str, _Binding]) -> tuple[list[_Example], int, list[str]]:
    """Examples that only read the function, builtins, stdlib modules and earlier kept examples' names."""
    kept: list[_Example] = []
    dropped = 0
    defined: set[str] = set()
    imported: dict[str, _Binding] = {}
    module_imports: list[str] = []
    plain: set[str] = set()  # names earlier kept examples bound to plain data
    skip = doctest.OPTIONFLAGS_BY_NAME["SKIP"]
    for ex in raw:
        if ex.options.get(skip) or _STRING_SET.search(ex.want):  # not run by doctest; order varies with the seed
            dropped += 1
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(ex.source)
            loads, stores = _example_names(tree)
            own: dict[str, _Binding] = {}
            for sub in ast.walk(tree):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    if isinstance(sub, ast.ImportFrom) and any(a.name == "*" for a in sub.names):
                        raise _Drop("star import")
                    for name, binding in _import_bindings(sub):
                        if not binding.stdlib:
                            raise _Drop("non-stdlib import")
                        own[name] = binding
            free = loads - stores - defined - {entry}
            scope = {**imported, **own}
            extra: list[str] = []
            for name in free:
                if name in scope:
                    continue
                if name in bindings and bindings[name].stdlib and name not in defined:
                    scope[name] = bindings[name]
                    extra.extend(bindings[name].statements)
                elif name in IO_BUILTINS | DYNAMIC_BUILTINS:
                    raise _Drop(name)
                elif name not in BUILTIN_NAMES:
                    raise _Drop(f"unknown name {name}")
            for name, use in _dotted_uses(tree, set(scope) - {entry}):
                if io_reason(_canonical(scope[name], use)):
                    raise _Drop(use)
            for call in ast.walk(tree):  # arguments cross to the candidate as plain data only
                args = [*call.args, *(k.value for k in call.keywords)] if isinstance(call, ast.Call) else []
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == entry and \
                        not all(_plain(a, plain, entry, scope) for a in args):
                    raise _Drop("an argument that is not plain data")
                if isinstance(call, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
                        entry in {n.id for n in ast.walk(d) if isinstance(n, ast.Name)} for d in call.decorator_list):
                    raise _Drop("the function used as a decorator")
        except (_Drop, SyntaxError, ValueError, RecursionError, MemoryError):
            dropped += 1
            continue
        options = {_FLAG_NAMES[k]: v for k, v in ex.options.items() if k in _FLAG_NAMES}
        body = tree.body
        kept.append(_Example(ex.source, _unfenced(ex.want), ex.exc_msg, options, ex.lineno, loads, stores,
                             _touched(tree, entry), len(body) == 1 and isinstance(body[-1], ast.Expr),
                             _uses(tree, entry)))
        defined |= stores
        plain -= stores
        for stmt in body:
            if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets) \
                    and _plain(stmt.value, plain, entry, scope):
                plain.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        imported.update(own)
        module_imports.extend(extra)
    return kept, dropped, module_imports


def _test_groups(examples: list[_Example], entry: str) -> list[list[int]]:
    """Per checking example whose value comes from the function: the indices to run, in order.

    An example checks when it shows output, expects an exception or is a bare expression. It is a test case
    when it, or an earlier example that binds a name it reads (transitively), calls the function: ``r = f(x)``
    then ``r`` is one case, ``len(xs)`` after ``f(xs)`` is not. A case runs with every earlier example that
    binds or may change a name it reads (``xs.append(3)`` between ``xs = []`` and ``f(xs)``: a method call on
    it, an item or attribute assigned, the name passed to a call), not every earlier example that reads it.
    """
    bound = {n for e in examples for n in e.stores}
    groups: list[list[int]] = []
    for i, ex in enumerate(examples):
        checks = bool(ex.want) or ex.exc_msg is not None or ex.is_expression
        if not checks:
            continue
        producers = _closure(examples, i, bound, touching=False)
        if any(examples[k].uses_entry for k in producers):
            groups.append(sorted(_closure(examples, i, bound, touching=True)))
    return groups


def _closure(examples: list[_Example], i: int, bound: set[str], touching: bool) -> set[int]:
    members = {i}
    todo = [i]
    while todo:
        k = todo.pop()
        wanted = examples[k].loads & bound
        for j in range(k):
            names = examples[j].stores | examples[j].touches if touching else examples[j].stores
            if j not in members and names & wanted:
                members.add(j)
                todo.append(j)
    return members

