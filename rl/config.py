"""The rl section: rollouts, the update rule and the environment, each chosen by name from its registry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, get_args

from pydantic import Field, model_validator

from codemill.models.config import FinetuneConfig, VLLMOptions
from codemill.registry import tagged_union
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


class GRPOConfig(StageConfig):
    """The GRPO policy update of one RL iteration (``codemill.rl.update``; formulas in ``rl/algorithms/grpo.py``).

    Defaults follow DAPO as verl runs it (clip-higher 0.2/0.28, no KL, token-mean, dynamic sampling, overlong
    masking); ``norm_adv_by_std=False`` with ``loss_agg="seq-mean-token-sum-norm"`` is Dr. GRPO.
    """

    name: Literal["grpo"] = "grpo"
    multi_turn: ClassVar[bool] = True  # trains through the loss mask: episodes with environment tokens are fine

    clip_low: float = Field(0.2, ge=0, lt=1, description="Ratio clipped below at 1 - clip_low.")
    clip_high: float = Field(0.28, ge=0, description="Ratio clipped above at 1 + clip_high (DAPO clip-higher).")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL to the frozen reference (0 = off).")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight (0 = off).")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = Field(
        "token-mean", description="Loss aggregation over the tokens of a step; seq-mean-token-sum-norm divides "
                                  "each completion's token sum by max_new_tokens (Dr. GRPO).")
    norm_adv_by_std: bool = Field(True, description="Divide advantages by the group's reward std (False: "
                                                    "Dr. GRPO).")
    dynamic_sampling: bool = Field(True, description="Drop groups whose rewards are all equal (DAPO).")
    overlong_mask: bool = Field(True, description="Truncated completions (finish_reason length) get no loss.")
    temperature: float = Field(1.0, gt=0, description="The rollout's sampling temperature (log-probs are "
                                                      "log_softmax(logits / temperature)).")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate (constant after warmup).")
    warmup_steps: int = Field(0, ge=0, description="Linear lr warmup within the update.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay of the weight matrices (norms and "
                                                       "biases are not decayed).")
    beta1: float = Field(0.9, gt=0, lt=1, description="AdamW first-moment (momentum) decay rate.")
    beta2: float = Field(0.999, gt=0, lt=1, description="AdamW second-moment decay rate.")
    grad_clip: float = Field(1.0, gt=0, description="Clip the global gradient L2 norm to this before each "
                                                    "optimizer step.")
    epochs: int = Field(1, gt=0, description="Passes over the kept samples.")
    micro_batch_size: int = Field(4, gt=0, description="Samples per rank per micro-step.")
    grad_accum: int = Field(1, gt=0, description="Micro-steps per optimizer step (samples per step = ranks x "
                                                 "micro_batch_size x grad_accum).")
    seed: int = Field(1234, description="Seeds the sample order.")
    parallelism: Literal["ddp", "fsdp"] = Field("ddp", description="DDP, or FSDP2 (fully_shard per block).")
    nproc_per_node: int = Field(2, ge=1, description="torchrun processes per node.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available.")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Autocast / FSDP param dtype (GPU).")
    checkpoint_every: int = runtime_only(default=4, gt=0, description="Steps between resumable checkpoints.")
    keep_checkpoints: int = runtime_only(default=1, ge=1, description="Committed checkpoints kept.")
    timeout_s: int = runtime_only(default=3600, gt=0, description="Kill the torchrun job after this long.")
    workers: Literal["run", "update"] = runtime_only(
        default="run", description="run: one torchrun group serves every update of the RL run and keeps the policy "
        "and its optimizer in memory between them; update: torchrun started for each update. Same results.")

    def check_rl(self, rl: RLConfig) -> None:
        """The update's log-probs must use the temperature the samples were drawn at (the ratio starts at 1)."""
        if self.temperature != rl.rollout.temperature:
            raise ValueError(f"algorithm.temperature ({self.temperature}) must equal rollout.temperature "
                             f"({rl.rollout.temperature}): the update scores tokens at the sampling temperature")


class RFTConfig(FinetuneConfig):
    """Rejection sampling: each iteration fine-tunes on its distinct passing samples (``codemill.rl.algorithms.rft``,
    the pipeline's trainer). Single-turn environments only: the documents have no loss mask."""

    name: Literal["rft"] = "rft"
    multi_turn: ClassVar[bool] = False  # whole documents, no loss mask
    epochs: float | None = Field(2.0, gt=0, description="Passes over the packed rows of the passing samples "
                                 "(rounded up, at most max_steps): the data grows and shrinks with the pass rate, "
                                 "and a fixed step count would overfit a few passing samples.")
    lr: float = Field(3e-4, gt=0, description="Peak learning rate (cosine decay to train.min_lr_ratio of it; the "
                                              "other AdamW settings are train's).")

    def check_rl(self, rl: RLConfig) -> None:
        """Any environment with one turn (the single-turn rule above is checked for every rule)."""


if TYPE_CHECKING:
    EnvConfig = EnvConfigView
else:  # one member per registered environment kind
    EnvConfig = tagged_union([env.settings for env in ENVIRONMENTS.values()], "kind")


AlgorithmConfig = Annotated[GRPOConfig | RFTConfig, Field(discriminator="name")]


def algorithm_names() -> list[str]:
    """The names ``rl.algorithm`` accepts, from the union itself."""
    return [m.model_fields["name"].default for m in get_args(get_args(AlgorithmConfig)[0])]


def algorithm_fields(name: str) -> list[str]:
    """The fields of the rule ``name``'s config."""
    return next(list(m.model_fields) for m in get_args(get_args(AlgorithmConfig)[0])
                if m.model_fields["name"].default == name)


class RLConfig(StageConfig):
    """RL for code: iterations of rollout -> sandboxed reward -> update (`codemill rl`)."""

    algorithm: AlgorithmConfig = Field(default_factory=GRPOConfig, description="The update rule, by name, with its "
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
