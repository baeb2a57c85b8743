"""The problems section: executable problem sources, verification limits, and HumanEval+ test augmentation."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from codemill.data.config import DecontaminationConfig
from codemill.stage_config import StageConfig, runtime_only

ProblemSourceKind = Literal["jsonl", "parquet", "mined", "synthetic"]


class ProblemSourceConfig(StageConfig):
    """One source of executable problems: a HumanEval-format file or folder (JSONL, .jsonl.gz or Parquet; local,
    glob or fsspec URL such as s3://bucket/problems.jsonl), doctests mined from the ingested corpus, or the
    synthetic family shipped with codemill."""

    kind: ProblemSourceKind = Field("synthetic", description="jsonl | parquet | mined | synthetic.")
    path: str | None = Field(None, description="jsonl/parquet: a file, a folder, a glob or an fsspec URL with "
                                               "fields task_id, prompt, entry_point, test, canonical_solution "
                                               "(optional), split_unit (optional; default task_id).")
    name: str | None = Field(None, description="Label of the source in the counts and the `source` column; "
                                               "default: the file name, 'mined' or 'synthetic'.")
    seed: int = Field(0, description="synthetic: seed of the generator.")
    count: int = Field(64, ge=1, description="synthetic: how many problems to generate.")
    split_by: Literal["template", "problem"] = Field(
        "template", description="synthetic: the split unit. template holds whole templates out (a new kind of "
        "task); problem holds instances out (the same kinds with constants and inputs never trained on).")
    family: Literal["templates", "steps"] = Field(
        "templates", description="synthetic: templates is one-line functions with a constant baked in (add_7 "
        "returns x + 7); steps is f(x) applying 2-3 named steps, one line each (add one; double), split by "
        "sequence whatever split_by says: a val problem is a new composition of the steps train has.")
    storage_options: dict[str, Any] = runtime_only(
        default_factory=dict, description="fsspec options for URLs (e.g. S3 endpoint_url, key, secret); "
                                          "prefer environment credentials.")

    def digest_config(self) -> dict[str, Any]:
        """The default family (templates) adds nothing, so problem sets built before it was an option keep their
        digests."""
        out = super().digest_config()
        if self.family == "templates":
            del out["family"]
        return out


class AugmentConfig(StageConfig):
    """HumanEval+-style test augmentation (EvalPlus): new inputs by type-aware mutation of the literal inputs in
    each problem's tests, expected outputs from the reference solution in the sandbox, then reduction to the
    inputs that kill mutants of the reference which the original tests miss (``codemill.problems.plus``)."""

    seed: int = Field(0, description="Seed of the input mutation and of the mutant choice.")
    max_problems: int | None = Field(None, ge=1, description="First N problems of the file; empty = all. The "
                                     "evaluation's augment step takes evaluate.humaneval.max_problems, so it "
                                     "builds exactly the problems the suite judges.")
    max_inputs: int = Field(64, ge=1, le=1000, description="New inputs kept per problem before reduction.")
    rounds: int = Field(3, ge=1, le=20, description="Mutation rounds: each mutates the seeds and the inputs kept "
                                                    "so far, then runs the reference on its candidates at once.")
    input_time_s: float = Field(1.0, gt=0, description="Time budget of the reference on one input: an input it "
                                                       "exceeds (or raises on) is rejected as out of the domain.")
    max_literal_chars: int = Field(1000, ge=16, description="Longest input or expected output, as Python source.")
    max_mutants: int = Field(24, ge=0, le=500, description="Mutants of the reference per problem (reduction's "
                                                           "yardstick).")
    mutant_time_factor: float = Field(10.0, gt=1, description="A mutant's budget per input: this many times the "
                                                              "reference's time on it ...")
    mutant_min_time_s: float = Field(0.1, gt=0, description="... and at least this long.")
    mutant_wall_s: float = Field(3.0, gt=0, description="Wall-clock limit of judging one mutant (a looping "
                                                        "mutant costs this much).")
    reduce: bool = Field(True, description="Keep only the inputs greedy set cover picks (false: all kept inputs).")
    atol: float = Field(1e-6, ge=0, description="Absolute tolerance of float outputs (relative: 1e-7).")
    wall_s: float = Field(10.0, gt=0, description="Wall-clock limit of one judged program (the check that the "
                                                  "reference passes its augmented tests).")
    cpu_s: int = Field(10, gt=0, description="CPU-time limit of one sandboxed program.")
    memory_mb: int = Field(1024, gt=64, description="Address-space limit of one sandboxed program.")
    workers: int | None = runtime_only(default=None, description="Parallel sandboxes; empty = CPU count.")
    shipped: bool = runtime_only(default=True, description="The evaluation's augment step takes the copy the "
                                 "package ships when its digest is this step's (the tiny preset's is), instead of "
                                 "building it; false builds it in the sandbox.")


class ProblemsConfig(StageConfig):
    """The executable problem set: read -> check -> verify references in the sandbox -> dedup -> decontaminate
    -> split."""

    sources: list[ProblemSourceConfig] = Field(default_factory=lambda: [ProblemSourceConfig()],
                                               description="Problem sources.")
    decontamination: DecontaminationConfig = Field(
        default_factory=DecontaminationConfig, description="Drop problems whose prompt or reference holds this "
                                                           "share of an eval text's n-grams (HumanEval by default).")
    val_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="Share of split units that go to val.")
    split_salt: str = Field("codemill-split-v1", description="Salt of the split hash (the corpus's by default, so "
                                                             "a repository lands where the corpus put it).")
    wall_s: float = Field(10.0, gt=0, description="Wall-clock limit of one reference run in the sandbox.")
    cpu_s: int = Field(10, gt=0, description="CPU-time limit of one reference run.")
    memory_mb: int = Field(1024, gt=64, description="Address-space limit of one reference run.")
    workers: int | None = runtime_only(default=None, description="Parallel sandboxes; empty = CPU count.")
    augment: AugmentConfig | None = Field(
        None, description="Strengthen the tests of every verified problem that has a reference (EvalPlus-style "
        "augmentation, after verify; RL rewards and evaluation then judge with them); empty = off.")

    def digest_config(self) -> dict[str, Any]:
        """Without augmentation the digest is what it was before the option existed."""
        out = super().digest_config()
        if self.augment is None:
            out.pop("augment")
        return out
