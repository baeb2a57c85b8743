"""The ``repo`` RL environment through the rollout loop, token in and token out: scripted agents as the policy
(the oracle resolves every task, doing nothing resolves none, a hack gets 0 and is flagged), tool output under
loss mask 0, the episode's tool numbers in the rollouts table, and the limits that end an episode (turns, tokens)
graded but cut, with no workspace left behind."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from codemill.models.engines import Completion, HFEngine, RolloutParams
from codemill.repos.agents import do_nothing, oracle
from codemill.repos.cache import RepoCache
from codemill.repos.config import RepoTasksConfig
from codemill.repos.sources.imported import ImportedRepoTasksConfig
from codemill.repos.task import RepoTask, write_tasks
from codemill.repos.taskset import build_task_set
from codemill.repos.toolcall import render_call
from codemill.rl.envs import env_for, opened, read_tasks
from codemill.rl.envs.repo import END_OF_TURN, RepoEnv, RepoEnvConfig, RepoProblem
from codemill.rl.metrics import rollout_metrics, scalar_metrics
from codemill.rl.rollout import collect_rollouts
from codemill.rl.trajectory import rollouts_table
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool
from tests.integration.repo_fixture import make_repo

PARAMS = RolloutParams(temperature=1.0, max_new_tokens=400, stop=(END_OF_TURN,))
Agent = Callable[[RepoTask], Iterator[str]]


@pytest.fixture(scope="module")
def taskset(tmp_path_factory) -> Path:
    """A built repo_tasks artifact folder: the fixture's task, imported and validated."""
    root = tmp_path_factory.mktemp("repo-env")
    repos = root / "repos"
    _, task = make_repo(repos)
    write_tasks([task], root / "tasks.jsonl")
    cfg = RepoTasksConfig(sources=[ImportedRepoTasksConfig(tasks=str(root / "tasks.jsonl"), repos=str(repos))],
                          val_fraction=0.0)
    out = root / "taskset"
    out.mkdir()
    build_task_set(cfg, out, RepoCache(root / "cache"), workers=1)
    return out


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    from tests.tiny_policy import make_policy

    return make_policy(tmp_path_factory.mktemp("policy"), max_len=8192)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch) -> None:
    monkeypatch.setenv("CODEMILL_REPO_CACHE", str(tmp_path_factory.getbasetemp() / "repo-env-cache"))


class ScriptedEngine:
    """A scripted agent as the policy: the context's task (found by its problem statement) and turn (the
    assistant turns opened so far) pick the agent's text, returned as the tokens a model would have sampled."""

    def __init__(self, engine: HFEngine, agent: Agent, tasks: Sequence[RepoProblem]) -> None:
        self.tokenizer, self.max_context = engine.tokenizer, engine.max_context
        self.agent, self.tasks = agent, tasks
        self.turns: list[str] = []

    def generate_ids(self, contexts: Sequence[Sequence[int]], k: int, params: RolloutParams,
                     seeds: Sequence[int]) -> list[list[Completion]]:
        out = []
        for context in contexts:
            text = self.tokenizer.decode(list(context), skip_special_tokens=False)
            task = next(p.task for p in self.tasks if p.prompt in text)
            turn = text.count("<|im_start|>assistant") - 1
            reply = next(itertools.islice(self.agent(task), turn, None), "I am done.") + END_OF_TURN
            ids = list(self.tokenizer(reply, add_special_tokens=False)["input_ids"])
            self.turns.append(reply)
            out.append([Completion(reply.removesuffix(END_OF_TURN), list(context), ids, [-1.0] * len(ids), "stop")
                        for _ in range(k)])
        return out


def _rollouts(policy: Path, taskset: Path, agent: Agent, k: int = 2, **env: Any) -> tuple[list[dict], Any, RepoEnv]:
    engine = HFEngine(policy)
    problems = read_tasks(RepoEnvConfig(), taskset, "train")
    scripted = ScriptedEngine(engine, agent, problems)  # type: ignore[arg-type]
    with JudgePool(Limits(wall_s=5.0), workers=1) as pool, \
            opened(env_for(RepoEnvConfig(tools_prompt="brief", **env), scripted, pool,
                           PARAMS.max_new_tokens)) as repo_env:  # type: ignore[arg-type]
        rows, timings = collect_rollouts(scripted, repo_env, problems, k, PARAMS, seed=0)  # type: ignore[arg-type]
    rollouts_table(rows)  # the contract's schema holds them
    assert isinstance(repo_env, RepoEnv)
    return rows, timings, repo_env


def test_the_oracle_resolves_through_the_loop_with_tool_output_masked(policy, taskset):
    rows, timings, env = _rollouts(policy, taskset, oracle)
    assert [r["outcome"] for r in rows] == ["passed", "passed"] and [r["reward"] for r in rows] == [1.0, 1.0]
    tok = HFEngine(policy).tokenizer
    row = rows[0]
    assert row["turns"] == 4 and row["finish_reason"] == "stop" and row["turn_rewards"] == [0.0, 0.0, 0.0, 1.0]
    sampled = tok.decode([t for t, m in zip(row["completion_ids"], row["loss_mask"], strict=True) if m])
    observed = tok.decode([t for t, m in zip(row["completion_ids"], row["loss_mask"], strict=True) if not m])
    assert "<tool_call>" in sampled and "<tool_response>" not in sampled  # the policy's tokens: calls only
    assert observed.count("<tool_response>") == 4 and "<tool_call>" not in observed  # 2 + 1 + 1 results
    assert observed.startswith("\n<|im_start|>user\n") and observed.endswith("<|im_start|>assistant\n")
    assert observed.count("<|im_end|>") == 3  # the user messages' own: each turn closed itself (the stop)
    stats = json.loads(row["env_stats"])
    assert stats["tool_calls"] == {"list_dir": 1, "read_file": 1, "edit": 1, "run_tests": 1}
    assert stats["finish"] == "submitted" and stats["status"] == "resolved" and stats["tool_errors"] == {}
    metrics = rollout_metrics(rows, 2)
    assert metrics["pass_rate"] == 1.0 and metrics["tool_calls_mean"] == 4.0 and metrics["limits_hit_frac"] == 0.0
    assert scalar_metrics(metrics)["tool_calls.edit"] == 2.0
    assert not env.scratch.exists()  # every workspace removed, and the scratch with them


def test_codemill_trajectory_shows_turns_and_masks(policy, taskset, tmp_path):
    from typer.testing import CliRunner

    from codemill.cli import app
    from codemill.rl.trajectory import write_rollouts

    rows, _, _ = _rollouts(policy, taskset, oracle, k=1)
    path = write_rollouts(rows, tmp_path)
    shown = CliRunner().invoke(app, ["trajectory", str(path), "--tokenizer", str(policy), "--width", "0"])
    assert shown.exit_code == 0, shown.output
    text = shown.output
    heads = [line for line in text.splitlines() if line.startswith("-- ")]
    assert heads[0].startswith("-- prompt") and len(heads) == 1 + 4 + 3  # prompt, 4 turns, 3 observed answers
    assert heads[1].startswith("-- turn 1: sampled (mask 1,") and heads[2].startswith("-- observed (mask 0,")
    assert '"name": "edit"' in text and "<tool_response>" in text and "== end: stop, outcome passed, reward 1" in text
    missing = CliRunner().invoke(app, ["trajectory", str(path), "--tokenizer", str(policy), "--row", "5"])
    assert missing.exit_code == 2 and "no row 5 (it has 1)" in missing.output


# ChatML as Qwen2.5's template writes a conversation without tools passed to it (the tools are in the system
# message), so a tokenizer with this template must give the same prompt text as one without.
CHATML_TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                   "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_a_tokenizer_with_a_chat_template_renders_the_prompt_with_it(policy, taskset):
    from codemill.rl.envs.repo import first_observation, messages, render_chatml

    tok = HFEngine(policy).tokenizer
    (problem,) = read_tasks(RepoEnvConfig(), taskset, "train")
    plain = first_observation(tok, problem, "full")  # type: ignore[arg-type]
    tok.chat_template = CHATML_TEMPLATE
    templated = first_observation(tok, problem, "full")  # type: ignore[arg-type]
    assert tok.decode(templated) == tok.decode(plain) == render_chatml(messages(problem, "full"))  # type: ignore[arg-type]
    tok.chat_template = CHATML_TEMPLATE.replace("<|im_end|>", "<|im_end|>!")  # the template, not ChatML, decides
    assert tok.decode(first_observation(tok, problem, "full")).count("<|im_end|>!") == 2  # type: ignore[arg-type]


def test_doing_nothing_resolves_nothing(policy, taskset):
    rows, _, _ = _rollouts(policy, taskset, do_nothing)
    assert {r["outcome"] for r in rows} == {"unresolved"} and {r["reward"] for r in rows} == {0.0}
    assert all(r["turns"] == 1 and r["suspicious"] == "" for r in rows)


def _conftest_hack(task: RepoTask) -> Iterator[str]:
    hook = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
            "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
    yield render_call("edit", path="conftest.py", old="", new=hook) + render_call("submit")


def test_a_conftest_forgery_gets_nothing_and_is_flagged(policy, taskset):
    rows, _, _ = _rollouts(policy, taskset, _conftest_hack, k=1)
    (row,) = rows
    assert row["reward"] == 0.0 and row["outcome"] == "unresolved" and row["suspicious"], row["suspicious"]
    assert "conftest.py" in json.loads(row["env_stats"])["dropped"]


def _never_submits(task: RepoTask) -> Iterator[str]:
    while True:
        yield render_call("list_dir", path=".")


def test_an_agent_that_never_submits_is_graded_but_cut_on_its_turns(policy, taskset):
    rows, _, env = _rollouts(policy, taskset, _never_submits, k=1, max_turns=3)
    (row,) = rows
    assert row["turns"] == 3 and row["finish_reason"] == "max_turns" and row["reward"] == 0.0
    assert row["outcome"] == "unresolved"  # graded all the same: the verdict is there to read
    assert json.loads(row["env_stats"])["finish"] == "max_turns"
    assert not env.scratch.exists()


def test_a_turn_with_no_room_for_the_next_ends_on_max_tokens(policy, taskset):
    engine = HFEngine(policy)
    (problem,) = read_tasks(RepoEnvConfig(), taskset, "train")
    from codemill.rl.envs.repo import first_observation

    prompt = len(first_observation(engine.tokenizer, problem, "brief"))  # type: ignore[arg-type]
    rows, _, _ = _rollouts(policy, taskset, _never_submits, k=1, max_total_tokens=prompt + PARAMS.max_new_tokens + 20)
    (row,) = rows
    assert row["turns"] == 1 and row["finish_reason"] == "max_tokens" and all(row["loss_mask"])
