"""The environment protocol: how a task and a seed become an episode the policy acts in, turn by turn.

An environment answers ``reset(task, seed)`` with the first observation as token ids (the prompt, tokenised by
the environment's own rules) and answers each model turn through ``step`` with an observation (the environment's
tokens, appended to the episode as they are: the conversation is never re-rendered and re-tokenised), a reward
(per turn; the trajectory's reward is their sum, so an environment with one final reward gives 0 on earlier
turns), done, and ``StepInfo`` (outcome, suspicious, timings). A single-turn environment is the case of one step.

``step`` takes a batch of episodes (the vector-environment shape, as in gymnasium's ``VectorEnv``): the sandbox
judges a batch concurrently on its pool of servers, where one episode at a time would leave it idle. The
rollout loop (``codemill.rl.rollout``) owns the limits every environment shares (``EpisodeLimits``: max turns,
max total tokens, wall time): it tells ``step`` which turns are the last allowed (``last``), and cuts an
episode whose next context would not fit or whose wall time ran out (finish reasons ``max_tokens`` and
``wall_time``; such trajectories get no loss by default, as truncated completions).

A new environment is one module in ``codemill.rl.envs`` with its config (a pydantic model whose ``kind`` is a
``Literal``) and one registration line there (``docs/rl.md#adding-an-environment``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from codemill.stage_config import StageConfig

if TYPE_CHECKING:
    from codemill.models.engines import Completion
    from codemill.rl.config import RLConfig
    from codemill.sandbox.judge_pool import JudgePool

# Why an episode ended on a limit, beyond the engine's own finish reasons of its last turn (stop, eos, length):
# the rollout loop's (max_tokens, wall_time) and an environment's own (an agent that used every turn or tool call
# without finishing). Such an episode's reward is 0 and it gets no loss by default.
CUT_REASONS = ("max_tokens", "wall_time", "max_turns", "max_tool_calls")


class Task(Protocol):
    """What the rollout loop needs of a task: an id (rewards and groups are keyed by it) and the text it poses."""

    @property
    def problem_id(self) -> str: ...

    @property
    def prompt(self) -> str: ...


@dataclass(frozen=True)
class EpisodeLimits:
    """What one episode may use. ``max_total_tokens`` counts prompt, sampled and observed tokens (None: the
    engine's context); ``wall_s`` runs from reset (None: no limit)."""

    max_turns: int = 1
    max_total_tokens: int | None = None
    wall_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")


@dataclass(frozen=True)
class StepInfo:
    """What a step says about the episode besides its reward: the sandbox's outcome of the solution it judged
    (``passed``, ``partial``: the fraction of separate test cases passed), why it deserves a look
    (``suspicious``), the sandbox time and how many judgings were repeated after the host got no verdict."""

    outcome: str
    passed: bool = False
    partial: float = 0.0
    suspicious: str | None = None
    error: str = ""
    duration_s: float = 0.0
    rejudged: int = 0
    stats: dict[str, Any] = field(default_factory=dict)  # the environment's own numbers of the episode so far


@dataclass(frozen=True)
class StepResult:
    observation_ids: list[int]  # appended to the episode with loss mask 0; empty when done
    reward: float
    done: bool
    info: StepInfo
    observation_text: str = ""  # what the observation tokens decode to, for reading trajectories
    cut: str = ""  # with done: the limit (one of CUT_REASONS) that ended the episode, when one did


@dataclass(frozen=True)
class Reset:
    """The first observation of a group's episodes and the environment's per-episode state (each of the group's
    k episodes gets its own copy)."""

    observation_ids: list[int]
    state: dict[str, Any] = field(default_factory=dict)


@dataclass
class EnvContext:
    """What an environment gets from the run: the judge pool (None where nothing is judged in it: repository
    episodes are graded in their own sandbox), the policy's tokenizer, the engine's context and the rollout's
    per-turn token budget and reward kind."""

    pool: JudgePool | None
    tokenizer: Any
    max_context: int
    max_new_tokens: int
    reward: str = "binary"  # binary | partial
    reward_retries: int = 2


class Environment(Protocol):
    """An environment kind (``kind``), built from its config and the run's ``EnvContext``."""

    kind: ClassVar[str]
    limits: EpisodeLimits

    def reset(self, task: Any, seed: int) -> Reset: ...

    def step(self, episodes: Sequence[Episode], actions: Sequence[Completion],
             last: Sequence[bool]) -> list[StepResult]: ...


@dataclass
class Episode:
    """One sample's episode as it runs: the prompt, then every token after it as sampled (loss mask 1, with its
    sampling log-prob) or observed (mask 0, log-prob 0.0), where each turn's sampled tokens start, and what the
    environment said. ``state`` is the environment's own."""

    task: Task
    group: int
    sample: int
    seed: int
    prompt_ids: list[int]
    state: dict[str, Any]
    started: float
    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_starts: list[int] = field(default_factory=list)
    turn_finish_reasons: list[str] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    last_action: Completion | None = None
    info: StepInfo | None = None
    done: bool = False
    finish_reason: str = ""
    sandbox_s: float = 0.0

    @classmethod
    def start(cls, task: Task, group: int, sample: int, seed: int, reset: Reset,
              started: float) -> Episode:
        return cls(task, group, sample, seed, list(reset.observation_ids), copy.deepcopy(reset.state), started)

    @property
    def turns(self) -> int:
        return len(self.turn_starts)

    @property
    def context(self) -> list[int]:
        """The tokens the next turn is sampled after: exactly the ones sampled and observed so far."""
        return self.prompt_ids + self.tokens

    def act(self, action: Completion) -> None:
        """The policy's turn, as the engine sampled it (the tokens it trains on)."""
        if len(action.completion_ids) != len(action.logprobs):
            raise ValueError(f"{len(action.completion_ids)} sampled tokens but {len(action.logprobs)} log-probs")
        self.turn_starts.append(len(self.tokens))
        self.turn_finish_reasons.append(action.finish_reason)
        self.tokens += action.completion_ids
        self.loss_mask += [1] * len(action.completion_ids)
        self.logprobs += action.logprobs
        self.last_action = action

    def observe(self, result: StepResult) -> None:
        """The environment's answer: its tokens (mask 0), the turn's reward, and the end when it says so."""
        self.turn_rewards.append(float(result.reward))
        self.info = result.info
        self.sandbox_s += result.info.duration_s
        if result.done:
            if result.cut:
                self.cut(result.cut)
                return
            self.done = True
            self.finish_reason = self.last_action.finish_reason if self.last_action else "stop"
            return
        self.tokens += result.observation_ids
        self.loss_mask += [0] * len(result.observation_ids)
        self.logprobs += [0.0] * len(result.observation_ids)

    def cut(self, reason: str) -> None:
        """End the episode on a shared limit (``CUT_REASONS``): its last turn was not graded as final."""
        if reason not in CUT_REASONS:
            raise ValueError(f"unknown cut reason {reason!r}")
        self.done = True
        self.finish_reason = reason

    @property
    def reward(self) -> float:
        return float(sum(self.turn_rewards)) if self.finish_reason not in CUT_REASONS else 0.0


class EnvSettings(StageConfig):
    """The base of an environment kind's config (its module declares it beside the environment, with a
    ``kind: Literal[...]`` field the rl section's union is discriminated on)."""

    def check_rl(self, rl: RLConfig) -> None:
        """Raise ValueError when the rl section cannot run this environment (any can, unless the kind says)."""


class EnvConfigView(Protocol):
    """What code outside an environment's module reads of its config."""

    @property
    def kind(self) -> str: ...

    @property
    def max_turns(self) -> int: ...

    def check_rl(self, rl: RLConfig) -> None: ...

    def digest_config(self) -> dict[str, Any]: ...
