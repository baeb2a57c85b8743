"""``code_exec``: one HumanEval-format problem, one completion, the sandboxed judge's verdict.

The first observation is the problem's prompt, encoded as the engines encode text prompts (``encode_prompt``: no
special tokens, left-truncated to leave the turn's new tokens). The one step judges the completion's text in the
judge pool (``codemill.problems.rewards.score``; a sample the host got no verdict for is judged again) and ends the
episode: reward 1 when every test passes (``binary``), or the fraction of separate test cases passed
(``partial``, ``rl.rollout.reward``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Literal

from codemill.problems.problem import ExecProblem
from codemill.rl.env import EnvContext, EnvSettings, Episode, EpisodeLimits, Reset, StepInfo, StepResult


class CodeExecConfig(EnvSettings):
    """``code_exec``: one completion per episode, judged against the problem's tests (codemill.rl.envs)."""

    kind: Literal["code_exec"] = "code_exec"

    @property
    def max_turns(self) -> int:
        return 1


if TYPE_CHECKING:
    from codemill.models.engines import Completion


def prompt_observation(ctx: EnvContext, task: ExecProblem) -> list[int]:
    from codemill.models.engines import encode_prompt

    return encode_prompt(ctx.tokenizer, task.prompt, ctx.max_context, ctx.max_new_tokens)


def verdicts(ctx: EnvContext, tasks: Sequence[ExecProblem], texts: Sequence[str]) -> list[StepInfo]:
    """The judge pool's verdicts on ``texts`` as completions of ``tasks``, in order."""
    from codemill.rl.rollout import judge_counted

    if ctx.pool is None:
        raise ValueError("the code environments judge in a judge pool, and this run has none")
    rewards, rejudged = judge_counted(tasks, texts, ctx.pool, ctx.reward_retries)
    return [StepInfo(r.outcome, r.passed, r.partial, r.suspicious, r.error, r.duration_s, n)
            for r, n in zip(rewards, rejudged, strict=True)]


def problem_of(episode: Episode) -> ExecProblem:
    """The episode's problem; the code environments run HumanEval-format problems only."""
    if not isinstance(episode.task, ExecProblem):
        raise TypeError(f"the code environments run executable problems, got {type(episode.task).__name__}")
    return episode.task


def reward_of(ctx: EnvContext, info: StepInfo) -> float:
    return info.partial if ctx.reward == "partial" else float(info.passed)


class CodeExecEnv:
    kind: ClassVar[str] = "code_exec"
    settings: ClassVar[type[EnvSettings]] = CodeExecConfig

    def __init__(self, config: EnvSettings, ctx: EnvContext) -> None:
        self.config, self.ctx = config, ctx
        self.limits = EpisodeLimits(max_turns=1)

    def reset(self, task: ExecProblem, seed: int) -> Reset:
        return Reset(prompt_observation(self.ctx, task))

    def step(self, episodes: Sequence[Episode], actions: Sequence[Completion],
             last: Sequence[bool]) -> list[StepResult]:
        infos = verdicts(self.ctx, [problem_of(e) for e in episodes], [a.text for a in actions])
        return [StepResult([], self.reward(info, action), True, info)
                for info, action in zip(infos, actions, strict=True)]

    def reward(self, info: StepInfo, action: Completion) -> float:
        """The episode's reward from the judge's verdict on ``action`` (a kind built on this one adds its terms)."""
        return reward_of(self.ctx, info)


ENVIRONMENT = CodeExecEnv
