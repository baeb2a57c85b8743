"""The tools an agent works with in a repository workspace, each with its own limits.

``list_dir``, ``read_file`` and ``edit`` run in this process on the workspace's layers (no process to start: well
under a millisecond over the work itself), never following a link. ``search`` (grep -P), ``apply_patch``,
``run_tests`` and ``bash`` run in the sandbox over the workspace's overlay mount (no network, a wall clock per
call, output cut in the middle to a budget). A tool's failure (a missing file, an ambiguous edit, a patch that
does not apply, a command that times out) is its result, marked as an error, never an exception: the agent reads
it and goes on.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codemill.repos.git import GIT_SAFE
from codemill.repos.pytest_run import ENV_MOUNT, env_mounts, run_pytest
from codemill.repos.workspace import MOUNT_POINT, Workspace, WorkspaceError, clean_relative
from codemill.sandbox.runner import Outcome, Sandbox


@dataclass(frozen=True)
class ToolLimits:
    output_chars: int = 8000  # what one result may hold (cut in the middle)
    read_lines: int = 400  # lines one read_file returns
    list_entries: int = 300
    search_results: int = 50
    command_s: float = 60.0  # bash and apply_patch
    tests_s: float = 300.0  # run_tests


SPECS: list[dict[str, Any]] = [
    {"name": "list_dir", "description": "List a folder of the repository (folders end with /).",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
    {"name": "read_file", "description": "Read lines start..end (1-based, inclusive) of a file, numbered.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "start": {"type": "integer"},
                                                     "end": {"type": "integer"}}, "required": ["path"]}},
    {"name": "search", "description": "Regular-expression search in the repository's files: path:line:text.",
     "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                    "required": ["pattern"]}},
    {"name": "edit", "description": "Replace the exact text old with new in a file (old must occur exactly once; "
                                    "an empty old creates a new file).",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"},
                                                     "new": {"type": "string"}}, "required": ["path", "new"]}},
    {"name": "apply_patch", "description": "Apply a unified diff to the repository.",
     "parameters": {"type": "object", "properties": {"patch": {"type": "string"}}, "required": ["patch"]}},
    {"name": "run_tests", "description": "Run pytest on test files or node ids (none: the whole suite).",
     "parameters": {"type": "object", "properties": {"tests": {"type": "array", "items": {"type": "string"}}}}},
    {"name": "bash", "description": "Run a shell command in the repository (no network, bounded time and output).",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
    {"name": "submit", "description": "Finish: the repository as it is now is graded.",
     "parameters": {"type": "object", "properties": {}}},
]
NAMES = tuple(s["name"] for s in SPECS)
READ_ONLY = ("list_dir", "read_file")  # answered in this process; search runs in the sandbox


class ToolError(Exception):
    """A tool's failure, shown to the agent as the tool's result."""


def cut_middle(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


class RepoTools:
    """The tools over one workspace. Reading tools may run at once; the rest take the workspace in turn
    (overlayfs must not see its upper layer change under a mount)."""

    def __init__(self, ws: Workspace, env: Path, sandbox: Sandbox, limits: ToolLimits | None = None) -> None:
        self.ws, self.env, self.sandbox = ws, env, sandbox
        self.limits = limits or ToolLimits()
        self.writing = threading.Lock()

    def run(self, name: str, args: dict[str, Any]) -> str:
        """One call's result text; ToolError for the agent's mistakes."""
        if name not in NAMES or name == "submit":
            raise ToolError(f"unknown tool {name!r} (tools: {', '.join(NAMES)})")
        try:
            if name in READ_ONLY:
                return getattr(self, name)(**args)
            with self.writing:
                return getattr(self, name)(**args)
        except WorkspaceError as e:
            raise ToolError(str(e)) from None
        except (TypeError, ValueError, AttributeError, OSError) as e:  # arguments of the wrong kind, a bad path
            raise ToolError(f"{name}: {type(e).__name__}: {e}") from None

    # --- in this process ------------------------------------------------------------------------------
    def list_dir(self, path: str = ".") -> str:
        entries = self.ws.list_dir(path)
        shown = [name + ("/" if is_dir else "") for name, is_dir in entries[:self.limits.list_entries]]
        more = len(entries) - len(shown)
        return "\n".join(shown) + (f"\n[... {more} more entries]" if more > 0 else "")

    def read_file(self, path: str, start: int = 1, end: int | None = None) -> str:
        lines = self._text(path).splitlines()
        start = max(1, int(start))
        end = min(len(lines), int(end) if end is not None else start + self.limits.read_lines - 1,
                  start + self.limits.read_lines - 1)
        if start > max(len(lines), 1):
            raise ToolError(f"{clean_relative(path)} has {len(lines)} lines; start {start} is past the end")
        body = "\n".join(f"{n}: {lines[n - 1]}" for n in range(start, end + 1))
        return cut_middle(body + (f"\n[lines {start}-{end} of {len(lines)}]" if end < len(lines) or start > 1
                                  else ""), self.limits.output_chars)

    def search(self, pattern: str, path: str = ".") -> str:
        """grep -P in the sandbox: its wall clock bounds a pattern that backtracks forever, and it reads the tree
        as the agent's commands see it."""
        if not isinstance(pattern, str) or not pattern:
            raise ToolError("search needs a pattern")
        try:
            re.compile(pattern)
        except re.error as e:
            raise ToolError(f"not a regular expression: {e}") from None
        rel = clean_relative(path) or "."
        n = self.limits.search_results
        command = (f"grep -rnIP --exclude-dir=.git --max-count={n} -e \"$1\" -- \"$2\" 2>/dev/null | "
                   f"head -n {n + 1} | cut -c1-300")
        text, _ = self._command(["/bin/sh", "-c", command, "search", pattern, rel], self.limits.command_s)
        lines = [ln for ln in text.splitlines() if not ln.startswith("[exit code")]
        if len(lines) > n:
            return "\n".join(lines[:n]) + f"\n[stopped at {n} results]"
        return "\n".join(lines) or "no matches"

    def edit(self, path: str, new: str, old: str = "") -> str:
        rel = clean_relative(path)
        if not old:
            if self.ws.kind(rel) == "file":
                raise ToolError(f"{rel} exists; give the text to replace as old")
            self.ws.write_bytes(rel, new.encode())  # refuses a link, a folder or a special file on the way
            return f"created {rel}"
        text = self._text(rel)
        count = text.count(old)
        if count == 0:
            raise ToolError(f"the old text is not in {rel}")
        if count > 1:
            raise ToolError(f"the old text occurs {count} times in {rel}; include more lines around it")
        self.ws.write_bytes(rel, text.replace(old, new, 1).encode())
        return f"edited {rel}"

    def _text(self, path: str) -> str:
        return self.ws.read_bytes(path).decode("utf-8", errors="replace")

    # --- in the sandbox --------------------------------------------------------------------------------
    def _box(self, wall_s: float) -> Sandbox:
        """The run's sandbox with this tool's wall clock (and as much CPU time)."""
        import dataclasses

        limits = dataclasses.replace(self.sandbox.limits, wall_s=wall_s, cpu_s=int(wall_s) + 1)
        return Sandbox(limits, unsafe=self.sandbox.unsafe, overlay=True)

    def _command(self, argv: list[str], wall_s: float, stdin: bytes = b"") -> tuple[str, bool]:
        box = self._box(wall_s)
        res = box.execute(argv, stdin=stdin, mounts=(*env_mounts(self.env), *self.ws.mounts()), chdir=MOUNT_POINT,
                          env={"PATH": f"{ENV_MOUNT}/bin:/usr/bin:/bin", "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1",
                               **GIT_SAFE}, output_budget=self.limits.output_chars)
        text = res.stdout
        if res.outcome == Outcome.TIMED_OUT:
            text += f"\n[stopped: the command ran past {wall_s:.0f} s]"
        elif res.returncode:
            text += f"\n[exit code {res.returncode}]"
        return text, res.outcome == Outcome.PASSED

    def bash(self, command: str) -> str:
        text, _ = self._command(["/bin/bash", "-c", "exec 2>&1\n" + command], self.limits.command_s)
        return text or "(no output)"

    def apply_patch(self, patch: str) -> str:
        text, ok = self._command(["/bin/sh", "-c", "exec 2>&1; git apply --whitespace=nowarn --recount -"],
                                 self.limits.command_s, patch.encode())
        if not ok:
            raise ToolError("the patch does not apply: " + (text.strip().splitlines() or ["?"])[0])
        return "patch applied"

    def run_tests(self, tests: list[str] | None = None) -> str:
        if tests is not None and not (isinstance(tests, list) and all(isinstance(t, str) for t in tests)):
            raise ToolError("tests is a list of test files or node ids")
        run = run_pytest(self.ws, self.env, self._box(self.limits.tests_s), tests or [],
                         output_budget=self.limits.output_chars)
        out = run.exit.stdout if run.exit is not None else ""
        if run.exit is not None and run.exit.outcome == Outcome.TIMED_OUT:
            out += f"\n[stopped: the tests ran past {self.limits.tests_s:.0f} s]"
        return cut_middle(out.strip() or "no output", self.limits.output_chars)
