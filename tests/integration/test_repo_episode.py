"""Agents in a repository workspace, through the tools: the oracle resolves, doing nothing does not, and agents
that try the published hacks through the tools get reward 0 with their attempts named."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
import time

import pytest

from codemill.repos.agents import do_nothing, hunks, oracle, play
from codemill.repos.episode import EpisodeLimits, RepoEpisode
from codemill.repos.synthesis import Synthesizer
from codemill.repos.toolcall import parse, render_call
from codemill.repos.tools import ToolLimits
from tests.integration.repo_fixture import prepared
from tests.integration.test_repo_grading import HACKS


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = prepared(tmp_path_factory.mktemp("repo-episodes"))
    w["synthesized"] = Synthesizer(w["cache"], w["tmp"] / "tasks", per_operator=2).synthesize(
        "mathlib", w["repo"]).tasks
    return w


def _episode(w, task=None, snapshot=None, **kw) -> RepoEpisode:
    task = task or w["task"]
    snapshot = snapshot or w["snapshot"]
    return RepoEpisode(task, snapshot, w["cache"].env(snapshot), w["sandbox"], scratch=w["tmp"], **kw)


def _results(observation: str) -> list[dict]:
    return [json.loads(b) for b in re.findall(r"<tool_response>\n(.*?)\n</tool_response>", observation, re.S)]


def _tree_digest(path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


def test_the_oracle_resolves_every_task_and_doing_nothing_none(world):
    tasks = [(world["task"], world["snapshot"])] + [
        (t, world["cache"].snapshot(world["tmp"] / "tasks" / "mathlib", t.base_commit)) for t in world["synthesized"]]
    assert len(tasks) >= 4
    for task, snapshot in tasks:
        solved = _episode(world, task, snapshot)
        turns = play(oracle, solved)
        grade = solved.grade()
        assert grade.status == "resolved" and solved.stats.finish == "submitted", (task.instance_id, grade.reasons)
        assert grade.suspicious == [] and sum(solved.stats.tool_errors.values()) == 0, turns
        idle = _episode(world, task, snapshot)
        play(do_nothing, idle)
        assert idle.grade().reward == 0.0
        solved.close()
        idle.close()


def _tool_writes(changes: dict[str, bytes | None]) -> str:
    """The turn that makes ``changes`` through the tools: new text files with edit, the rest with bash."""
    out = []
    for path, data in changes.items():
        if data is None:
            out.append(render_call("bash", command=f"rm -f {shlex.quote(path)}"))
        elif data.startswith(b"symlink:"):
            target = data[len(b"symlink:"):].decode()
            out.append(render_call("bash", command=f"ln -sf {shlex.quote(target)} {shlex.quote(path)}"))
        else:
            encoded = base64.b64encode(data).decode()
            out.append(render_call("bash", command=f"mkdir -p $(dirname {shlex.quote(path)}) && echo {encoded} | "
                                                   f"base64 -d > {shlex.quote(path)}"))
    return "".join(out)


@pytest.mark.parametrize("name", sorted(HACKS))
def test_hacks_through_the_tools_get_reward_zero(world, name):
    changes, suspicious = HACKS[name]
    before = _tree_digest(world["snapshot"])
    episode = _episode(world)
    written = _results(episode.act(_tool_writes(changes)))
    assert not any(r["content"].startswith("[exit code") for r in written), written
    episode.act(render_call("submit"))
    grade = episode.grade()
    assert grade.reward == 0.0 and grade.status == "unresolved", (name, grade.record())
    assert bool(grade.suspicious) == suspicious, (name, grade.suspicious)
    assert _tree_digest(world["snapshot"]) == before, "the agent changed the shared snapshot"
    episode.close()


def test_reading_history_and_the_network_are_named_and_show_nothing(world):
    episode = _episode(world)
    out = episode.act(render_call("bash", command="git log --all --oneline | wc -l") +
                      render_call("bash", command="curl -sS --max-time 2 http://1.1.1.1 || echo offline"))
    results = [r["content"] for r in _results(out)]
    assert results[0].strip() == "1" and "offline" in results[1]
    episode.act(render_call("submit"))
    grade = episode.grade()
    assert grade.reward == 0.0
    assert any(s.startswith("read git history") for s in grade.suspicious)
    assert any(s.startswith("network") for s in grade.suspicious)
    episode.close()


def test_a_turn_may_carry_several_calls_answered_in_order(world):
    episode = _episode(world)
    turn = (render_call("read_file", path="mathlib/ops.py", start=4, end=5) + render_call("list_dir", path="tests")
            + "<tool_call>{not json}</tool_call>" + render_call("search", pattern="def span")
            + render_call("edit", path="mathlib/ops.py", old="return x", new="return x ") +
            render_call("read_file", path="nowhere.py"))
    out = episode.act(turn)
    names = [r["name"] for r in _results(out)]
    assert names == ["read_file", "list_dir", "", "search", "edit", "read_file"]
    assert "4: def clamp(x, lo, hi):" in out and "test_ops.py" in out and "mathlib/ops.py:19:def span" in out
    assert "not valid JSON" in out and "the old text occurs 1 times" not in out and "edited mathlib/ops.py" in out
    assert "no such file: nowhere.py" in out
    assert episode.stats.tool_errors == {"(malformed)": 1, "read_file": 1}
    assert set(episode.ws.changes()) == {"mathlib/ops.py"}
    episode.close()


def test_limits_end_an_episode_and_say_which(world):
    episode = _episode(world, limits=EpisodeLimits(max_turns=2))
    episode.act(render_call("list_dir"))
    episode.act(render_call("list_dir"))
    assert episode.done and episode.stats.finish == "max_turns"
    episode.close()
    calls = _episode(world, limits=EpisodeLimits(max_tool_calls=3))
    calls.act(render_call("list_dir") * 5)
    assert calls.stats.finish == "max_tool_calls" and sum(calls.stats.tool_calls.values()) == 3
    calls.close()


def test_floods_forks_and_hangs_are_bounded(world):
    episode = _episode(world, tool_limits=ToolLimits(output_chars=2000, command_s=3))
    flood = episode.act(render_call("bash", command="yes flood | head -c 5000000"))
    assert "bytes of output cut" in flood and len(flood) < 4000
    started = time.monotonic()
    episode.act(render_call("bash", command=":(){ :|:& };: ; echo survived"))
    assert time.monotonic() - started < 10, "the fork bomb outlived its call's wall clock"
    assert "alive" in episode.act(render_call("bash", command="echo alive"))
    hang = episode.act(render_call("bash", command="sleep 30"))
    assert "ran past 3 s" in hang
    assert not episode.done
    episode.close()


def test_edits_are_exact_and_patches_apply_or_say_why(world):
    episode = _episode(world)
    twice = episode.act(render_call("edit", path="mathlib/ops.py", old="return lo", new="return hi"))
    assert "occurs 2 times" in twice
    bad = episode.act(render_call("apply_patch", patch="--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"))
    assert "the patch does not apply" in bad
    good = episode.act(render_call("apply_patch", patch=world["task"].patch))
    assert "patch applied" in good
    assert [(p, o != n) for p, o, n in hunks(world["task"].patch)] == [("mathlib/ops.py", True)]
    episode.act(render_call("submit"))
    assert episode.grade().resolved
    assert parse(render_call("submit")) == parse('<tool_call>{"name": "submit", "arguments": "{}"}</tool_call>')
    episode.close()


def test_the_host_tools_never_follow_links_or_block_on_special_files(world, tmp_path):
    outside = tmp_path / "host-secret.txt"
    outside.write_text("host only")
    episode = _episode(world)
    episode.act(render_call("bash", command=f"ln -s {outside} leak.txt; ln -s / hostroot; ln -s {tmp_path} out; "
                                            "mkfifo pipe"))
    started = time.monotonic()
    results = _results(episode.act(
        render_call("read_file", path="leak.txt") + render_call("list_dir", path="hostroot")
        + render_call("edit", path="out/planted.py", old="", new="x = 1\n") + render_call("read_file", path="pipe")
        + render_call("search", pattern="host only")))
    assert time.monotonic() - started < 10, "a FIFO blocked the reader"
    assert [r["content"] for r in results[:4]] == [
        "leak.txt is a symbolic link (the tools do not follow links)",
        "hostroot is a symbolic link (the tools do not follow links)",
        "out is a symbolic link", "pipe is not a regular file"]
    assert results[4]["content"] == "no matches" and not (tmp_path / "planted.py").exists()
    episode.close()


def test_bad_arguments_are_tool_errors_and_a_read_sees_an_earlier_edit(world):
    episode = _episode(world)
    results = _results(episode.act(
        render_call("read_file", path="mathlib/ops.py", start="x") + render_call("list_dir", path=None)
        + render_call("edit", path="mathlib/ops.py", old="return x\n", new="return x  # seen\n")
        + render_call("read_file", path="mathlib/ops.py", start=10, end=10)))
    assert results[0]["content"].startswith("read_file: ValueError") and "AttributeError" in results[1]["content"]
    assert results[3]["content"].startswith("10:     return x  # seen")
    assert not episode.done
    episode.close()


def test_a_tree_the_task_files_cannot_fit_is_graded_not_raised(world):
    episode = _episode(world)
    episode.act(render_call("bash", command="rm -rf tests && echo x > tests"))
    episode.act(render_call("submit"))
    grade = episode.grade()
    assert grade.reward == 0.0 and grade.controls == "not run"
    assert grade.reasons[0].startswith("the grading tree cannot be built from the change")
    episode.close()
