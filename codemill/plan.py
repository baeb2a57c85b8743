"""A stage is a plan before it is a run.

A ``StagePlan`` holds exactly what identifies a stage's output: the stage, the artifact name, the stage's code
version, the config that is hashed and the refs of its inputs. The digest, the manifest's ``config``/``inputs``
and the MLflow record all come from this one value, so a manifest states exactly what was hashed and two
places can no longer disagree (Marin's executor steps have the same shape: name + versioned config + input
paths -> output path).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from codemill.hashing import sha256_file, stage_digest
from codemill.store import ArtifactRef, Manifest


class StagePlan(BaseModel):
    """What a stage will produce, computed before anything runs. Hashing it gives the artifact's digest."""

    model_config = ConfigDict(frozen=True)

    stage: str
    name: str
    code_version: str
    config: dict[str, Any] = Field(default_factory=dict, description="exactly the config that is hashed")
    inputs: dict[str, ArtifactRef] = Field(default_factory=dict, description="input name -> the input's ref")

    @property
    def input_digests(self) -> dict[str, str]:
        return {k: v.digest for k, v in self.inputs.items()}

    @property
    def digest(self) -> str:
        return stage_digest(self.stage, self.code_version, self.config, self.input_digests)

    def input(self, name: str) -> ArtifactRef:
        """One input's ref; a stage asking for an input its plan lacks is a bug, so say which."""
        try:
            return self.inputs[name]
        except KeyError:
            raise KeyError(f"{self.stage} plan has no input {name!r} (inputs: {sorted(self.inputs)})") from None


def manifest_digest(manifest: Manifest) -> str:
    """The digest a manifest's own ``config``/``inputs`` hash to: equal to its ``digest`` for every artifact
    written from a plan, which is how a test (or a user) checks that a manifest says what was hashed."""
    return stage_digest(manifest.stage, manifest.code_version, manifest.config, manifest.inputs)


def external_input(kind: str, name: str, digest: str, uri: str) -> ArtifactRef:
    """An input that is not a store artifact (a source folder, a file, a hub model): its content digest and
    where it lives, in the same shape as an artifact ref so a plan treats every input alike."""
    return ArtifactRef(stage=kind, name=name, digest=digest, uri=uri)


def file_input(name: str, path: str) -> ArtifactRef:
    return external_input("file", name, sha256_file(path), str(path))


Phase = Literal["ingest", "tokenize", "train", "evaluate"]
PHASES: tuple[str, ...] = ("ingest", "tokenize", "train", "evaluate")  # what a run's ``until`` may stop after


def check_until(until: str) -> None:
    """``until`` names a phase (here, not in the flows' plan module: the CLI checks it before importing Prefect)."""
    if until not in PHASES:
        raise ValueError(f"until must be one of {', '.join(PHASES)}, not {until!r}")
