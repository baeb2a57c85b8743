"""Environment kinds, one module each, registered here by ``kind``.

``ENVIRONMENTS`` maps a kind to its class; ``codemill.config.EnvConfig`` is the discriminated union of their
configs on ``kind``, so the YAML and the Prefect form show the chosen environment's fields only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from codemill.config import CodeExecConfig
from codemill.rl.env import EnvContext, Environment
from codemill.rl.envs.code_exec import CodeExecEnv
from codemill.rl.envs.code_feedback import CodeFeedbackEnv

if TYPE_CHECKING:
    from codemill.models.engines import RolloutEngine
    from codemill.sandbox.judge_pool import JudgePool

ENVIRONMENTS: dict[str, Any] = {
    CodeExecEnv.kind: CodeExecEnv,
    CodeFeedbackEnv.kind: CodeFeedbackEnv,
}


def build_env(config: Any, ctx: EnvContext) -> Environment:
    """The environment ``config.kind`` names."""
    try:
        cls = ENVIRONMENTS[config.kind]
    except KeyError:
        raise ValueError(f"unknown environment kind {config.kind!r} (known: {sorted(ENVIRONMENTS)})") from None
    env: Environment = cls(config, ctx)
    return env


def env_for(config: Any, engine: RolloutEngine, pool: JudgePool, max_new_tokens: int, *, reward: str = "binary",
            reward_retries: int = 2) -> Environment:
    """The environment ``config`` names (None: ``code_exec``) for episodes sampled by ``engine`` (its tokenizer
    and context) and judged by ``pool``."""
    ctx = EnvContext(pool, engine.tokenizer, engine.max_context, max_new_tokens, reward, reward_retries)
    return build_env(config if config is not None else CodeExecConfig(), ctx)
