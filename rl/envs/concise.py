"""``concise``: ``code_exec``'s verdict minus a penalty per sampled token.

A policy rewarded on the verdict alone has no reason to stop early, and GRPO's token-mean loss lets long
completions dilute their per-token credit; a small length cost (the overlong-reward shaping of DAPO and the length
penalties of Kimi k1.5 work the same way) makes the shortest passing answer the best one. The penalty counts the
tokens the policy sampled (``completion_ids``, the stop token included), so the cost is paid on exactly what
is trained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from codemill.rl.env import EnvSettings, StepInfo
from codemill.rl.envs.code_exec import CodeExecEnv

if TYPE_CHECKING:
    from codemill.models.engines import Completion


class ConciseConfig(EnvSettings):
    """``concise``: one completion, judged against the problem's tests, minus ``penalty`` per sampled token."""

    kind: Literal["concise"] = "concise"
    penalty: float = Field(0.001, ge=0, description="Reward lost per sampled token (0 = code_exec).")

    @property
    def max_turns(self) -> int:
        return 1


class ConciseEnv(CodeExecEnv):
    """``code_exec``'s episode; the reward pays ``penalty`` per sampled token."""

    kind: ClassVar[str] = "concise"
    settings: ClassVar[type[EnvSettings]] = ConciseConfig
    config: ConciseConfig

    def reward(self, info: StepInfo, action: Completion) -> float:
        return super().reward(info, action) - self.config.penalty * len(action.completion_ids)


ENVIRONMENT = ConciseEnv
