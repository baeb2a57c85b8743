"""Environment kinds, one module each, registered here by ``kind``.

``ENVIRONMENTS`` maps a kind to its class; each class names its config (``settings``, declared in its
module), and ``codemill.rl.config.EnvConfig`` is the discriminated union of those configs on ``kind``, so the
YAML and the Prefect form show the chosen environment's fields only. Adding a kind is its module (which ends in
``ENVIRONMENT = <its class>``) plus its name in ``KIND_MODULES`` below. An environment's tasks come from the
stage its class names in ``task_stage`` (``problems`` when it names none) and are read by its
``read_tasks(folder, split)``; one that holds resources (workspaces) releases them in ``close()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codemill.registry import plugins
from codemill.rl.env import EnvContext, Environment, Task

if TYPE_CHECKING:
    from codemill.models.engines import RolloutEngine
    from codemill.sandbox.judge_pool import JudgePool

KIND_MODULES = ("code_exec", "code_feedback", "repo", "concise")  # each module's ENVIRONMENT is registered
ENVIRONMENTS: dict[str, Any] = {env.kind: env for env in plugins(__name__, KIND_MODULES, "ENVIRONMENT")}
DEFAULT_ENV = "code_exec"  # single-turn code execution: what rl.env is unless set
PROBLEMS_STAGE = "problems"
PROBLEMS_FILE = "problems.parquet"


def _class(config: Any) -> Any:
    kind = getattr(config, "kind", DEFAULT_ENV)
    try:
        return ENVIRONMENTS[kind]
    except KeyError:
        raise ValueError(f"unknown environment kind {kind!r} (known: {sorted(ENVIRONMENTS)})") from None


def task_stage(config: Any) -> str:
    """The stage whose artifact holds the tasks of the environment ``config`` names (None: ``code_exec``)."""
    return str(getattr(_class(config), "task_stage", PROBLEMS_STAGE))


def read_tasks(config: Any, folder: Path, split: str) -> list[Task]:
    """The ``split`` tasks of ``folder`` (an artifact of ``task_stage(config)``) as the environment runs them."""
    reader = getattr(_class(config), "read_tasks", None)
    if reader is not None:
        return list(reader(folder, split))
    from codemill.problems.sets import read_problem_set

    return list(read_problem_set(folder / PROBLEMS_FILE, split))


def build_env(config: Any, ctx: EnvContext) -> Environment:
    """The environment ``config.kind`` names."""
    env: Environment = _class(config)(config, ctx)
    return env


@contextmanager
def opened(env: Environment) -> Iterator[Environment]:
    """``env``, closed on the way out when it holds resources."""
    try:
        yield env
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()


def env_for(config: Any, engine: RolloutEngine, pool: JudgePool, max_new_tokens: int, *, reward: str = "binary",
            reward_retries: int = 2) -> Environment:
    """The environment ``config`` names (None: ``code_exec``) for episodes sampled by ``engine`` (its tokenizer
    and context) and judged by ``pool``."""
    ctx = EnvContext(pool, engine.tokenizer, engine.max_context, max_new_tokens, reward, reward_retries)
    return build_env(config if config is not None else ENVIRONMENTS[DEFAULT_ENV].settings(), ctx)
