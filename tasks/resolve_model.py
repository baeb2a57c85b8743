"""Resolving "a model" for evaluation: a store train artifact, a LoggedModel id, or a local HF folder."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from codemill.errors import UserFacingError
from codemill.hashing import combine_digests, sha256_file
from codemill.lineage import tags as T
from codemill.store import MANIFEST, ArtifactRef, Manifest
from codemill.tasks.common import RunContext, StageResult


class ModelNotFound(UserFacingError, FileNotFoundError):
    """A model named on the command line or in a deployment run that is nowhere to be found."""


class ResolvedModel(BaseModel):
    ref: ArtifactRef  # digest identifies the weights; uri says where they came from
    hf_dir: str
    model_id: str


def folder_digest(path: Path) -> str:
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return combine_digests([(p.relative_to(path).as_posix(), sha256_file(p)) for p in files])


def from_train_artifact(ctx: RunContext, ref: ArtifactRef, model_id: str) -> ResolvedModel:
    return ResolvedModel(ref=ref, hf_dir=str(ctx.store().local_path(ref) / "hf"), model_id=model_id)


def trained_model(ctx: RunContext, result: StageResult) -> ResolvedModel:
    """The model a train stage just committed (its LoggedModel is logged by the stage's record)."""
    if not result.model_id:
        raise ValueError(f"train stage result for {result.ref.uri} carries no LoggedModel id")
    return from_train_artifact(ctx, result.ref, result.model_id)


def resolve_model(ctx: RunContext, spec: str) -> ResolvedModel:
    """``m-...`` = a LoggedModel; a folder with manifest.json = a store train artifact; else an HF folder."""
    lineage = ctx.lineage()
    store = ctx.store()
    if spec.startswith("m-") and not Path(spec).exists():
        model_tags = lineage.logged_model_tags(spec)
        digest, uri = model_tags.get(T.DIGEST), model_tags.get(T.OUTPUT_URI)
        if digest and uri:
            ref = ArtifactRef(stage="train", name=Path(uri).name.rsplit("-", 1)[0], digest=digest, uri=uri)
            same_store = store.ref(ref.stage, ref.name, ref.digest)
            if store.is_committed(same_store):
                return from_train_artifact(ctx, same_store, spec)
        dst = Path(ctx.work_dir).absolute() / "cache" / "models" / spec
        if not (dst / "config.json").exists():
            dst.mkdir(parents=True, exist_ok=True)
            lineage.download_model(spec, dst)
        digest = digest or folder_digest(dst)
        return ResolvedModel(ref=ArtifactRef(stage="train", name="model", digest=digest, uri=f"models:/{spec}"),
                             hf_dir=str(dst), model_id=spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelNotFound(f"model not found: {spec} (a LoggedModel id, a store artifact or an HF folder)",
                            hint="pass a LoggedModel id (m-...), a store train or policy artifact folder, or a "
                                 "Hugging Face model folder")
    if (path / MANIFEST).exists():
        m = Manifest.model_validate_json((path / MANIFEST).read_text())
        ref = store.ref(m.stage, m.name, m.digest)
        model_id = lineage.find_model(m.digest) or lineage.log_external_model(ref, path / "hf")
        return ResolvedModel(ref=ref, hf_dir=str(path / "hf"), model_id=model_id)
    if not (path / "config.json").exists():
        raise ValueError(f"{path} is not a Hugging Face model folder (no config.json)")
    digest = folder_digest(path)
    ref = ArtifactRef(stage="external", name=path.name, digest=digest, uri=str(path.resolve()))
    model_id = lineage.find_model(digest) or lineage.log_external_model(ref, path)
    return ResolvedModel(ref=ref, hf_dir=str(path.resolve()), model_id=model_id)
