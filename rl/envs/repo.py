"""``repo``: an agent fixes a repository task through tools, turn by turn; the grader's verdict is the reward.

The tasks are rows of a ``repo_tasks`` artifact (``codemill.repos.taskset``): each episode gets a fresh
copy-on-write workspace over its task's snapshot (``codemill.repos.episode``). Token in, token out, in ChatML
(what Qwen and Hermes chat templates write):

* **reset** renders the system message (the task's rules and the tools, as JSON schemas or one line each:
  ``tools_prompt``) and the problem statement as the user's message, then opens the assistant's turn. A tokenizer
  with a chat template renders the same messages with its own template (a tool-calling model's own format).
* **step** runs the turn's tool calls (``codemill.repos.toolcall``) and answers with their results as the next
  user message: ``<|im_end|>`` (unless the turn's own tokens closed it) ``<|im_start|>user`` the
  ``<tool_response>`` blocks ``<|im_end|>`` ``<|im_start|>assistant``. These tokens are observed (loss mask 0).
* **The end.** ``submit`` grades the workspace (``codemill.repos.grading``: a fresh copy, screened changes,
  restored tests, controls) and ends the episode with reward 1 when resolved, or the fraction of FAIL_TO_PASS
  passing with PASS_TO_PASS intact (``rl.rollout.reward: partial``). An episode that uses its turns or tool calls,
  runs past its wall clock or would not fit the next turn in its tokens is graded too (the verdict is in its
  ``outcome``) but ends on the limit: reward 0 and no loss by default (DeepSWE's compact filtering).

Each step's ``StepInfo.stats`` holds the episode's numbers (tool calls and errors by tool, tool and grading time,
why it ended, what it did that deserves a look), which the rollouts table keeps as ``env_stats``.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from codemill.repos.episode import MAX_CALLS, MAX_TURNS, WALL, RepoEpisode
from codemill.repos.episode import EpisodeLimits as AgentLimits
from codemill.repos.grading import Grade
from codemill.repos.pytest_run import repo_sandbox
from codemill.repos.task import RepoTask
from codemill.repos.taskset import TaskSet
from codemill.repos.toolcall import describe_tools
from codemill.repos.tools import SPECS, ToolLimits
from codemill.rl.env import EnvContext, EnvSettings, Episode, EpisodeLimits, Reset, StepInfo, StepResult
from codemill.stage_config import runtime_only

END_OF_TURN = "<|im_end|>"  # ChatML's, as Qwen and Hermes chat templates write it


class RepoEnvConfig(EnvSettings):
    """``repo``: an agent fixes a repository task through tools (read, search, edit, run the tests, bash) turn by
    turn; the reward is the grader's verdict on its changes (codemill.rl.envs.repo). The tasks are the
    `repo_tasks` artifact (config `repo_tasks`), not the problem set."""

    kind: Literal["repo"] = "repo"
    max_turns: int = Field(8, ge=1, le=100, description="Policy turns per episode; an episode that used them all "
                           "without submitting ends on the limit (no loss by default).")
    max_tool_calls: int = Field(32, ge=1, description="Tool calls per episode (a limit, like max_turns).")
    max_total_tokens: int | None = Field(None, gt=0, description="Prompt, sampled and tool-output tokens of an "
                                         "episode; empty = the engine's context. A turn after which the next one "
                                         "would not fit is graded, ending on the limit.")
    episode_wall_s: float = Field(600.0, gt=0, description="Wall clock of an episode from its first turn (a limit).")
    command_s: float = Field(30.0, gt=0, description="Wall clock of one bash or apply_patch call.")
    tests_s: float = Field(120.0, gt=0, description="Wall clock of one run_tests call, and of the grading run.")
    output_chars: int = Field(4000, ge=200, description="Characters of one tool result (cut in the middle).")
    tools_prompt: Literal["full", "brief"] = Field("full", description="full: the tools as JSON schemas (what "
                                                   "chat templates of tool-calling models render); brief: one line "
                                                   "per tool, for models with small contexts.")
    workers: int | None = runtime_only(default=None, ge=1, description="Episodes stepped at once; empty = usable "
                                       "cores.")

    def check_rl(self, rl: RLConfig) -> None:
        """A repository agent's turn ends at the chat format's end of turn (HumanEval's stops would cut a turn in
        the middle of its tool calls), and its tasks have no reference solutions to warm-start on."""
        if END_OF_TURN not in rl.rollout.stop:
            raise ValueError(f"rl.env repo: rl.rollout.stop must hold {END_OF_TURN!r} (where an assistant turn "
                             f"ends), got {rl.rollout.stop}; e.g. stop: [{END_OF_TURN!r}]")
        if rl.warm_start.max_steps > 0:
            raise ValueError("rl.env repo: the warm start fine-tunes on reference solutions, which repository tasks "
                             "do not have; set rl.warm_start.max_steps: 0")

if TYPE_CHECKING:
    from codemill.models.engines import Completion
    from codemill.rl.config import RLConfig

START_OF_TURN = "<|im_start|>"
SYSTEM = ("You are fixing an issue in a Python repository, your working directory. Read and search its code, edit "
          "it, run its tests, and call submit when the issue is fixed. Your changes are graded by tests you may not "
          "see; changes to test files and test configuration are not graded.")
LIMIT_CUTS = {MAX_TURNS: "max_turns", MAX_CALLS: "max_tool_calls", WALL: "wall_time"}


@dataclass(frozen=True)
class RepoProblem:
    """A repository task as the rollout loop sees it: its id, its problem statement, and the task set it is in
    (where its snapshot and execution environment come from)."""

    problem_id: str
    prompt: str
    task: RepoTask
    root: str

    @classmethod
    def of(cls, task: RepoTask, root: Path) -> RepoProblem:
        return cls(task.instance_id, task.problem_statement, task, str(root))


def brief_tools() -> str:
    """The tools in one line each, with the call format: for a model whose context a JSON schema would fill."""
    lines = []
    for spec in SPECS:
        props, required = spec["parameters"]["properties"], spec["parameters"].get("required", [])
        args = ", ".join(a if a in required else f"{a}?" for a in props)
        lines.append(f"- {spec['name']}({args}): {spec['description']}")
    return ("Tools:\n" + "\n".join(lines) + '\nCall one with <tool_call>\n{"name": ..., "arguments": {...}}\n'
            "</tool_call>")


def messages(task: RepoProblem, tools_prompt: str) -> list[dict[str, str]]:
    tools = describe_tools(SPECS) if tools_prompt == "full" else brief_tools()
    return [{"role": "system", "content": f"{SYSTEM}\n\n{tools}"}, {"role": "user", "content": task.prompt}]


def render_chatml(msgs: Sequence[dict[str, str]]) -> str:
    """Messages in ChatML with the assistant's turn opened (a tokenizer without a chat template)."""
    return "".join(f"{START_OF_TURN}{m['role']}\n{m['content']}{END_OF_TURN}\n" for m in msgs) + \
        f"{START_OF_TURN}assistant\n"


def observation_text(turn_text: str, results: str) -> str:
    """The tool results as the user's next message, closing the assistant's turn first unless it closed itself.
    A turn ends at the first ``<|im_end|>`` (the stop); with a tokenizer that has no ChatML special tokens, the
    token that completed it may carry a few characters more, which stay (they are what the policy sampled)."""
    close = "\n" if END_OF_TURN in turn_text else f"{END_OF_TURN}\n"
    return f"{close}{START_OF_TURN}user\n{results}{END_OF_TURN}\n{START_OF_TURN}assistant\n"


def first_observation(tokenizer: Any, task: RepoProblem, tools_prompt: str) -> list[int]:
    """The prompt's token ids: the tokenizer's own chat template when it has one, ChatML otherwise."""
    msgs = messages(task, tools_prompt)
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) \
        if getattr(tokenizer, "chat_template", None) else render_chatml(msgs)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # as observations are tokenised


def outcome_of(grade: Grade) -> str:
    """The rollouts table's outcome: ``passed`` for a resolved task (as the code environments say for a
    passing solution), the grade's status otherwise."""
    return "passed" if grade.resolved else grade.status


class RepoEnv:
    kind: ClassVar[str] = "repo"
    settings: ClassVar[type[EnvSettings]] = RepoEnvConfig
    task_stage: ClassVar[str] = "repo_tasks"

    def __init__(self, config: RepoEnvConfig, ctx: EnvContext) -> None:
        from codemill.cpus import usable_cpus

        self.config, self.ctx = config, ctx
        # The rollout loop's own limits: turns and tokens. The wall clock is the agent's (checked between its calls,
        # so a workspace is never left behind by a cut the environment did not make).
        self.limits = EpisodeLimits(max_turns=config.max_turns, max_total_tokens=config.max_total_tokens)
        self.budget = min(ctx.max_context, config.max_total_tokens or ctx.max_context)
        self.agent_limits = AgentLimits(max_turns=config.max_turns, max_tool_calls=config.max_tool_calls,
                                        wall_s=config.episode_wall_s)
        self.tool_limits = ToolLimits(output_chars=config.output_chars, command_s=config.command_s,
                                      tests_s=config.tests_s)
        self.sandbox = repo_sandbox(config.tests_s)
        self.workers = config.workers or usable_cpus()
        self.scratch = Path(tempfile.mkdtemp(prefix="codemill-repo-env-"))
        self._sets: dict[str, TaskSet] = {}
        self._live: dict[int, RepoEpisode] = {}
        self._lock = threading.Lock()

    @staticmethod
    def read_tasks(folder: Path, split: str) -> list[RepoProblem]:
        """The ``split`` tasks of a ``repo_tasks`` artifact folder."""
        return [RepoProblem.of(t, folder) for t in TaskSet(folder).tasks(split)]

    def reset(self, task: RepoProblem, seed: int) -> Reset:
        return Reset(first_observation(self.ctx.tokenizer, task, self.config.tools_prompt))

    def step(self, episodes: Sequence[Episode], actions: Sequence[Completion],
             last: Sequence[bool]) -> list[StepResult]:
        with ThreadPoolExecutor(min(self.workers, len(episodes)) or 1, thread_name_prefix="codemill-repo") as pool:
            return list(pool.map(self._step, episodes, actions, last))

    def _episode(self, e: Episode) -> RepoEpisode:
        with self._lock:
            live = self._live.get(id(e))
        if live is not None:
            return live
        problem = e.task
        if not isinstance(problem, RepoProblem):
            raise TypeError(f"the repo environment runs repository tasks, got {type(problem).__name__}")
        with self._lock:
            taskset = self._sets.get(problem.root) or self._sets.setdefault(problem.root,
                                                                            TaskSet(Path(problem.root)))
        snapshot = taskset.snapshot(problem.task)
        live = RepoEpisode(problem.task, snapshot, taskset.env(problem.task, snapshot), self.sandbox,
                           tool_limits=self.tool_limits, limits=self.agent_limits, scratch=self.scratch)
        with self._lock:
            self._live[id(e)] = live
        return live

    def _step(self, e: Episode, action: Completion, final: bool) -> StepResult:
        agent = self._episode(e)
        t0 = time.monotonic()
        results = agent.act(action.text)
        acted_s = time.monotonic() - t0
        cut = LIMIT_CUTS.get(agent.stats.finish, "")
        if not agent.done and final:
            cut = "max_turns"
        if not agent.done and not cut:
            text = observation_text(self.ctx.tokenizer.decode(action.completion_ids, skip_special_tokens=False),
                                    results)
            ids = list(self.ctx.tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(e.context) + len(ids) + self.ctx.max_new_tokens <= self.budget:
                info = StepInfo("running", duration_s=acted_s, suspicious=self._kind(agent.stats.suspicious),
                                stats=self._stats(agent, None))
                return StepResult(ids, 0.0, False, info, text)
            cut = "max_tokens"  # no room for another turn: graded now, ending on the limit
        return self._end(e, agent, cut, acted_s)

    def _end(self, e: Episode, agent: RepoEpisode, cut: str, acted_s: float) -> StepResult:
        with self._lock:
            self._live.pop(id(e), None)
        try:
            grade = agent.grade(partial=self.ctx.reward == "partial")
        finally:
            agent.close()
        reward = grade.reward if not cut else 0.0
        info = StepInfo(outcome_of(grade), grade.resolved, grade.reward, self._kind(grade.suspicious),
                        "; ".join(grade.reasons[:3]), acted_s + grade.duration_s, stats=self._stats(agent, grade, cut))
        return StepResult([], reward, True, info, cut=cut)

    @staticmethod
    def _kind(suspicious: Sequence[str]) -> str | None:
        """The first suspicion's kind (its text before the colon, or before `` in <path>``): the rollouts table
        counts episodes by it."""
        return suspicious[0].split(":", 1)[0].split(" in ", 1)[0].strip() if suspicious else None

    @staticmethod
    def _stats(agent: RepoEpisode, grade: Grade | None, cut: str = "") -> dict[str, Any]:
        s = agent.stats
        out: dict[str, Any] = {"tool_calls": dict(s.tool_calls), "tool_errors": dict(s.tool_errors),
                               "tool_s": round(s.tool_s, 4), "agent_turns": s.turns}
        if grade is not None:
            out |= {"finish": cut or s.finish,  # an episode ends graded on submit or on a limit (cut)
                    "status": grade.status, "grade_s": round(grade.duration_s, 4), "suspicious": grade.suspicious,
                    "dropped": sorted(grade.dropped), "controls": grade.controls}
        return out

    def close(self) -> None:
        """Remove every workspace still open (a collection that failed midway)."""
        with self._lock:
            live, self._live = list(self._live.values()), {}
        for agent in live:
            agent.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


ENVIRONMENT = RepoEnv
