"""Scripted agents: fixed policies that drive an episode through the same tools a model uses.

They check the environment end to end without a model: the **oracle** solves every validated task through the
tools (reads the code, applies the gold patch hunk by hunk with ``edit``, runs the tests it can see, submits), a
**do-nothing** agent submits at once, and hack agents (the tests' own) try every published trick. A scripted
agent is a function from the task to the turns it writes; ``play`` feeds them to an episode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from codemill.repos.episode import RepoEpisode
from codemill.repos.task import RepoTask, patch_paths
from codemill.repos.toolcall import render_call

Agent = Callable[[RepoTask], Iterator[str]]


def hunks(patch: str) -> Iterator[tuple[str, str, str]]:
    """``(path, old text, new text)`` of each hunk of a unified diff (context lines in both)."""
    path = ""
    old: list[str] = []
    new: list[str] = []
    in_hunk = False

    def flush() -> Iterator[tuple[str, str, str]]:
        if in_hunk and (old or new):
            yield path, "".join(old), "".join(new)

    for line in patch.splitlines(keepends=True):
        if line.startswith("+++ "):
            yield from flush()
            in_hunk, old, new = False, [], []
            name = line[4:].strip()
            path = name[2:] if name.startswith("b/") else name
        elif line.startswith("@@"):
            yield from flush()
            in_hunk, old, new = True, [], []
        elif in_hunk and line[:1] in (" ", "-", "+"):
            if line[0] in " -":
                old.append(line[1:])
            if line[0] in " +":
                new.append(line[1:])
        elif in_hunk and line.startswith("\\"):
            continue
    yield from flush()


def oracle(task: RepoTask) -> Iterator[str]:
    files = patch_paths(task.patch)
    yield render_call("list_dir", path=".") + "".join(render_call("read_file", path=p) for p in files)
    yield "".join(render_call("edit", path=p, old=o, new=n) for p, o, n in hunks(task.patch))
    visible = sorted({t.split("::", 1)[0] for t in task.PASS_TO_PASS} - {t.split("::", 1)[0]
                                                                          for t in task.FAIL_TO_PASS})
    yield render_call("run_tests", tests=visible)
    yield render_call("submit")


def do_nothing(task: RepoTask) -> Iterator[str]:
    yield render_call("submit")


def play(agent: Agent, episode: RepoEpisode) -> list[tuple[str, str]]:
    """Run ``agent`` until the episode ends: each turn's text and the observation it got."""
    turns = []
    for text in agent(episode.task):
        turns.append((text, episode.act(text)))
        if episode.done:
            break
    return turns
