"""The evaluate section: the settings every evaluation shares, plus one sub-section per registered suite
(``evaluate.<suite>``), built from the suite registry so that adding a suite edits no config module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from codemill.evals.suites import REGISTRY
from codemill.models.config import VLLMOptions
from codemill.registry import names_literal, section_per_plugin
from codemill.stage_config import StageConfig

if TYPE_CHECKING:
    SuiteName = str
else:
    SuiteName = names_literal(list(REGISTRY))
SUITES: tuple[str, ...] = tuple(REGISTRY)
# What an evaluation runs unless told: every suite but those that need data the defaults do not have.
DEFAULT_SUITES: tuple[str, ...] = tuple(name for name, s in REGISTRY.items() if s.default)


class EvalSettings(StageConfig):
    """What every evaluation shares: which suites run, the bootstrap, the seed and the engine."""

    suites: list[SuiteName] = Field(list(DEFAULT_SUITES), description="Suites to run.")
    bootstrap_samples: int = Field(1000, ge=100, description="Bootstrap resamples for the CIs.")
    confidence: float = Field(0.95, gt=0, lt=1, description="Level of the bootstrap confidence intervals "
                                                            "(0.95 = 95%).")
    seed: int = Field(0, description="Seed of the completion items' target lines, the generation sampling and "
                                     "the bootstrap resamples.")
    engine: Literal["hf", "vllm"] = Field("hf", description="The engine the generating suites (completion, "
                                          "humaneval, humaneval_infilling) sample with: hf (transformers, built "
                                          "in) or vllm (the vllm extra, in its own environment: scripts/vllm-env).")
    vllm: VLLMOptions = Field(default_factory=VLLMOptions, description="vLLM's settings (engine: vllm).")

    def digest_config(self) -> dict[str, Any]:
        """The default engine (hf) adds nothing, so evaluations made before the engine was a setting keep their
        digests."""
        out = super().digest_config()
        if self.engine == "hf":
            del out["engine"], out["vllm"]
        return out


_DOC = """Evaluation: the shared settings and ``<suite>``, one section per registered suite."""
if TYPE_CHECKING:
    class EvalConfig(EvalSettings):
        def __getattr__(self, name: str) -> Any: ...  # ``evaluate.<suite>``: that suite's section
else:
    EvalConfig = section_per_plugin("EvalConfig", EvalSettings, {n: s.settings for n, s in REGISTRY.items()},
                                    _DOC)
