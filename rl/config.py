"""The rl section: rollouts, the update rule and the environment, each chosen by name from its registry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from codemill.models.config import FinetuneConfig, VLLMOptions
from codemill.registry import tagged_union
from codemill.rl.algorithms import ALGORITHMS, DEFAULT_ALGORITHM, AlgorithmSettings
from codemill.rl.env import EnvConfigView
from codemill.rl.envs import DEFAULT_ENV, ENVIRONMENTS
from codemill.stage_config import StageConfig, runtime_only


class RolloutConfig(StageConfig):
    """How an RL iteration samples: k completions per problem (a group), each judged in the sandbox."""

    problems_per_iteration: int = Field(32, ge=1, description="Train problems per iteration, drawn without "
                                        "replacement from a seeded shuffle (an epoch ends before any repeats).")
    samples_per_problem: int = Field(8, ge=2, description="Group size k: completions per problem.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (the update uses the same one).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus (top-p) sampling cutoff; 1 = the full "
                                                      "distribution.")
    max_new_tokens: int = Field(64, gt=0, description="Longer completions are cut ('length'; see overlong_mask).")
    stop: list[str] = Field(["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"],
                            description="Stop sequences (HumanEval's): the text is cut before the first one.")
    context_len: int = Field(512, ge=16, description="Prompt tokens kept (left-truncated) plus new tokens.")
    batch_problems: int = Field(8, ge=1, description="Problems per generation batch; each batch has its own seed, "
                                "so results do not depend on how batches are spread over workers.")
    reward: Literal["binary", "partial"] = Field("binary", description="binary: 1 when every test passes; "
                                                 "partial: the fraction of separate test cases passed.")
    wall_s: float = Field(10.0, gt=0, description="Wall-clock limit of one sample in the sandbox.")
    cpu_s: int = Field(10, gt=0, description="Seconds of CPU per sample (RLIMIT_CPU).")
    memory_mb: int = Field(1024, gt=64, description="Address space per sample, in MiB (RLIMIT_AS).")
    workers: int | None = runtime_only(default=None, description="Parallel sandboxes; empty = CPU count.")
    overlap: bool = runtime_only(default=True, description="Judge batch i while batch i+1 is generated.")
    threads: int | None = runtime_only(default=None, ge=1, description="Batches generated at once on CPU (hf "
                                       "engine, with overlap; Ray workers take one each), each on its own thread "
                                       "with one torch thread; the rollouts are the same for any count. empty = "
                                       "one per usable core (docs/benchmarks.md#rl-timing).")
    engine: Literal["hf", "vllm"] = Field("hf", description="The rollout engine: hf (transformers, built in) or "
                                          "vllm (the vllm extra, in its own environment: scripts/vllm-env).")
    vllm: VLLMOptions = Field(default_factory=VLLMOptions, description="vLLM's settings (engine: vllm).")

    def digest_config(self) -> dict[str, Any]:
        """The default engine (hf) adds nothing, so rollouts sampled before the engine was a setting keep their
        digests; vllm adds itself and its output-affecting options (its samples are not HFEngine's)."""
        out = super().digest_config()
        if self.engine == "hf":
            del out["engine"], out["vllm"]
        return out


if TYPE_CHECKING:
    EnvConfig = EnvConfigView
else:  # one member per registered environment kind
    EnvConfig = tagged_union([env.settings for env in ENVIRONMENTS.values()], "kind")


if TYPE_CHECKING:
    AlgorithmConfig = AlgorithmSettings
else:  # one member per registered update rule
    AlgorithmConfig = tagged_union([a.settings for a in ALGORITHMS.values()], "name")


def algorithm_names() -> list[str]:
    """The names ``rl.algorithm`` accepts."""
    return list(ALGORITHMS)


def algorithm_fields(name: str) -> list[str]:
    """The fields of the rule ``name``'s config."""
    return list(ALGORITHMS[name].settings.model_fields)


class RLConfig(StageConfig):
    """RL for code: iterations of rollout -> sandboxed reward -> update (`codemill rl`)."""

    algorithm: AlgorithmConfig = Field(default_factory=ALGORITHMS[DEFAULT_ALGORITHM].settings, description="The "
                                       "update rule, by name, with its "
                                       "settings: grpo, or rft (rejection sampling: fine-tune on the passing "
                                       "samples) (docs/rl.md#updates).")
    iterations: int = Field(4, ge=1, description="Rollout/update iterations.")
    seed: int = Field(0, description="Seed of the problem order, the sampling and the updates.")
    env: EnvConfig = Field(default_factory=ENVIRONMENTS[DEFAULT_ENV].settings, description="The environment "
                           "episodes run in, by kind (docs/rl.md#environments).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    warm_start: FinetuneConfig = Field(default_factory=lambda: FinetuneConfig(max_steps=0), description=(
        "Before iteration 0: fine-tune on the train problems' reference solutions (0 steps = off)."))
    warm_start_share: float = Field(1.0, gt=0, le=1, description=(
        "Share of the train problems (a seeded choice) whose references the warm start sees. Below 1, RL also "
        "samples problems the policy was never shown solved: groups there have mixed rewards, where problems "
        "the warm start taught are mostly all-pass groups that dynamic sampling drops."))
    heldout_samples: int = Field(8, ge=1, description="Samples per val problem for the held-out pass rate of "
                                 "the starting and the final policy (paired, per problem).")

    @model_validator(mode="after")
    def _single_turn_rules(self) -> RLConfig:
        """A rule without a loss mask (rejection sampling fine-tunes on whole documents) would train on the
        environment's tokens of a multi-turn episode."""
        if not self.algorithm.multi_turn and self.env.max_turns > 1:
            raise ValueError(f"algorithm {self.algorithm.name} needs a single-turn environment; rl.env "
                             f"({self.env.kind}) allows {self.env.max_turns} turns: use grpo")
        return self

    @model_validator(mode="after")
    def _plugins_accept_the_run(self) -> RLConfig:
        """The chosen environment and update rule check the rest of the section (e.g. where a turn ends)."""
        self.env.check_rl(self)
        self.algorithm.check_rl(self)
        return self
