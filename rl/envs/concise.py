"""``concise``: ``code_exec``'s verdict minus a penalty per sampled token.

A policy rewarded on the verdict alone has no reason to stop early, and GRPO's token-mean loss lets long
completions dilute their per-token credit; a small length cost (the overlong-reward shaping of DAPO and the length
penalties of Kimi k1.5 work the same way) makes the shortest passing answer the best one. The penalty counts the
tokens the policy sampled (``completion_ids``, the stop token included), so the cost is paid on exactly what
is trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from codemill.problems.problem import ExecProblem
from codemill.rl.env import EnvContext, EnvSettings, Episode, EpisodeLimits, Reset, StepResult
from codemill.rl.envs.code_exec import problem_of, prompt_observation, reward_of, verdicts

if TYPE_CHECKING:
    from codemill.models.engines import Completion


class ConciseConfig(EnvSettings):
    """``concise``: one completion, judged against the problem's tests, minus ``penalty`` per sampled token."""

    kind: Literal["concise"] = "concise"
    penalty: float = Field(0.001, ge=0, description="Reward lost per sampled token (0 = code_exec).")

    @property
    def max_turns(self) -> int:
        return 1


class ConciseEnv:
    kind: ClassVar[str] = "concise"
    settings: ClassVar[type[EnvSettings]] = ConciseConfig

    def __init__(self, config: ConciseConfig, ctx: EnvContext) -> None:
        self.config, self.ctx = config, ctx
        self.limits = EpisodeLimits(max_turns=1)

    def reset(self, task: ExecProblem, seed: int) -> Reset:
        return Reset(prompt_observation(self.ctx, task))

    def step(self, episodes: Sequence[Episode], actions: Sequence[Completion],
             last: Sequence[bool]) -> list[StepResult]:
        infos = verdicts(self.ctx, [problem_of(e) for e in episodes], [a.text for a in actions])
        return [StepResult([], reward_of(self.ctx, info) - self.config.penalty * len(action.completion_ids), True,
                           info)
                for info, action in zip(infos, actions, strict=True)]


ENVIRONMENT = ConciseEnv
