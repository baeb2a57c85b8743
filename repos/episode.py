"""One agent episode in a repository: a fresh workspace, tool calls turn by turn, a grade at the end.

``RepoEpisode.act`` takes a model turn's text, runs its tool calls (``toolcall`` format) and answers with their
results in call order. The calls run in order: consecutive reading calls at once, every other call alone, so a
read after an edit in the same turn sees the edit. The episode ends at ``submit``, or at a limit (turns, tool
calls, wall clock): its ``finish`` says which, so training can mask the trajectories cut by a limit. ``grade``
runs the grader (``grading``) on the workspace's changes and adds what the episode's calls showed: reading git
history, the network, a shell that tries to leave the sandbox.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from codemill.repos import toolcall
from codemill.repos.grading import Grade, grade_changes
from codemill.repos.task import RepoTask
from codemill.repos.toolcall import ToolCall, ToolResult
from codemill.repos.tools import READ_ONLY, RepoTools, ToolError, ToolLimits
from codemill.repos.workspace import Workspace
from codemill.sandbox.runner import Sandbox

SUBMITTED, MAX_TURNS, MAX_CALLS, WALL = "submitted", "max_turns", "max_tool_calls", "wall_time"
LIMIT_FINISHES = (MAX_TURNS, MAX_CALLS, WALL)
WATCH = {  # what a call reveals about the agent's intent, whatever the grader later makes of its changes
    "read git history": re.compile(r"\bgit\s+(?:log|reflog|show|rev-list|cat-file|fsck|for-each-ref|fetch|"
                                   r"checkout\s+\S*\s*--\s)|\.git/(?:objects|refs|logs|packed-refs)"),
    "network": re.compile(r"\b(?:curl|wget|nc|ncat|ssh|scp|telnet)\b|\bpip\s+(?:install|download)\b|https?://"),
    "runner internals": re.compile(r"\b_pytest\b|pytest_runtest_makereport|\bos\._exit\b|/report\b"),
}


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 30
    max_tool_calls: int = 100
    wall_s: float = 1800.0
    parallel_calls: int = 4


@dataclass
class EpisodeStats:
    turns: int = 0
    tool_calls: Counter = field(default_factory=Counter)
    tool_errors: Counter = field(default_factory=Counter)
    tool_s: float = 0.0
    suspicious: list[str] = field(default_factory=list)
    finish: str = ""


class RepoEpisode:
    def __init__(self, task: RepoTask, snapshot: Path, env: Path, sandbox: Sandbox, *,
                 tool_limits: ToolLimits | None = None, limits: EpisodeLimits | None = None,
                 scratch: Path | None = None) -> None:
        self.task, self.snapshot, self.env, self.sandbox, self.scratch = task, snapshot, env, sandbox, scratch
        self.limits = limits or EpisodeLimits()
        self.ws = Workspace.create(snapshot, scratch)
        self.tools = RepoTools(self.ws, env, sandbox, tool_limits)
        self.stats = EpisodeStats()
        self.started = time.monotonic()

    @property
    def done(self) -> bool:
        return bool(self.stats.finish)

    def act(self, text: str) -> str:
        """The observation after a model turn: each call's result in call order (``toolcall.render``)."""
        if self.done:
            raise RuntimeError("the episode is over")
        self.stats.turns += 1
        calls = toolcall.parse(text)
        submit = next((n for n, c in enumerate(calls) if c.name == "submit" and not c.error), None)
        room = self.limits.max_tool_calls - sum(self.stats.tool_calls.values())
        run = calls[:submit] if submit is not None else calls
        results = self._run(run[:max(0, room)])
        if submit is not None:
            self.stats.finish = SUBMITTED
            results.append(ToolResult("submit", "submitted"))
        elif not calls:
            results.append(ToolResult("", "no tool call in this turn; call a tool, or submit when done", True))
        if not self.done:
            if len(run) > room or sum(self.stats.tool_calls.values()) >= self.limits.max_tool_calls:
                self.stats.finish = MAX_CALLS
            elif self.stats.turns >= self.limits.max_turns:
                self.stats.finish = MAX_TURNS
            elif time.monotonic() - self.started > self.limits.wall_s:
                self.stats.finish = WALL
        return toolcall.render(results)

    def _run(self, calls: list[ToolCall]) -> list[ToolResult]:
        """The calls in order: a run of consecutive reading calls at once, every other call alone, so a read
        after an edit in the same turn sees the edit. Past the episode's wall clock the rest are not run."""
        results: list[ToolResult] = []
        start = 0
        while start < len(calls):
            end = start + 1
            while (calls[start].name in READ_ONLY and end < len(calls) and calls[end].name in READ_ONLY
                   and end - start < self.limits.parallel_calls):
                end += 1
            batch = calls[start:end]
            if time.monotonic() - self.started > self.limits.wall_s:
                results += [ToolResult(c.name, "not run: the episode's wall clock ran out", True) for c in batch]
                self.stats.finish = WALL
            else:
                for c in batch:
                    self.stats.tool_calls[c.name or "(malformed)"] += 1
                    self._watch(c)
                if len(batch) == 1:
                    results.append(self._one(batch[0]))
                else:
                    with ThreadPoolExecutor(len(batch)) as pool:
                        results += list(pool.map(self._one, batch))
            start = end
        for c, r in zip(calls, results, strict=True):
            self.stats.tool_s += r.duration_s
            if r.error:
                self.stats.tool_errors[c.name or "(malformed)"] += 1
        return results

    def _one(self, call: ToolCall) -> ToolResult:
        t0 = time.monotonic()
        if call.error:
            return ToolResult(call.name, call.error, True)
        try:
            content, error = self.tools.run(call.name, call.arguments), False
        except ToolError as e:
            content, error = str(e), True
        return ToolResult(call.name, content, error, time.monotonic() - t0)

    def _watch(self, call: ToolCall) -> None:
        text = " ".join(str(v) for v in call.arguments.values())
        for what, pattern in WATCH.items():
            if pattern.search(text):
                self.stats.suspicious.append(f"{what}: {call.name} {text[:120]!r}")

    def grade(self, *, partial: bool = False) -> Grade:
        """The grader's verdict on the tree as the agent left it, with the episode's own suspicions."""
        grade = grade_changes(self.task, self.snapshot, self.env, self.ws.changes(), self.sandbox,
                              partial=partial, scratch=self.scratch)
        grade.suspicious = [*self.stats.suspicious, *grade.suspicious]
        return grade

    def close(self) -> None:
        self.ws.remove()
