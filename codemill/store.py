"""The content-addressed artifact store (local path or any fsspec URL).

Layout: ``<root>/<stage>/<name>-<digest[:12]>/`` holding payload files and ``manifest.json``. The manifest is
written last: a directory without one is incomplete and never read. Payloads are built in a local staging
directory; on a local store the finished directory is renamed into place (atomic), on a remote store the
payload is uploaded first and the manifest last.

Concurrent runs on one store: an artifact's path is its digest, so two runs producing the same artifact
produce the same thing and only one copy must win. Locally the rename into place runs under an exclusive
``fcntl.flock`` on a per-artifact lock file (so one writer cannot delete a directory another has just
committed); remotely, where no lock exists, commits are write-once: a committed manifest is never replaced
or deleted, the first manifest wins and a later writer of the same digest counts it as success.

Staging left by a killed run: a writer holds an ``flock`` on its staging directory for as long as it lives
(the kernel drops it when the process dies, however it dies), so a staging directory whose lock can be taken
is stale. Opening a writer sweeps its stage's stale staging, and the writer's sidecar files named
``<staging name>.*`` (the train task's ``.spec.json``), under a per-stage lock that also covers the creation
of a new staging directory, so a concurrent run's live staging is never taken for stale.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from pydantic import BaseModel, Field

from codemill import __version__
from codemill.hashing import sha256_file
from codemill.store_claim import Claim, ClaimOwner, is_s3, local_claim, s3_claim

if TYPE_CHECKING:
    from codemill.plan import StagePlan

MANIFEST = "manifest.json"


class ArtifactRef(BaseModel):
    """What tasks pass around: where an artifact lives and what it is. Never the data itself."""

    stage: str
    name: str
    digest: str
    uri: str

    @property
    def short(self) -> str:
        return self.digest[:12]


class FileEntry(BaseModel):
    path: str
    bytes: int
    sha256: str


class Manifest(BaseModel):
    stage: str
    name: str
    digest: str
    uri: str
    code_version: str
    codemill_version: str = __version__
    config: dict[str, Any] = Field(default_factory=dict)
    inputs: dict[str, str] = Field(default_factory=dict, description="input name -> artifact digest")
    input_uris: dict[str, str] = Field(default_factory=dict)
    stats: dict[str, Any] = Field(default_factory=dict)
    files: list[FileEntry] = Field(default_factory=list)
    created_at: float = Field(default_factory=time.time)


class IncompleteArtifactError(RuntimeError):
    pass


def nearest_existing(path: str | Path) -> Path:
    """``path`` (absolute) or its nearest ancestor that exists: where a folder not made yet would be made."""
    found = Path(path).absolute()
    while not found.exists():
        found = found.parent
    return found


def writable_problem(folder: str | Path) -> str | None:
    """Why files cannot be created under ``folder`` (which need not exist yet), or None when they can.

    Tried for real, with a temporary file in the nearest folder that exists (deleted at once): permission
    bits do not tell root the truth, nor a read-only mount, a full disk or a path through a regular file."""
    path = Path(folder).absolute()
    probe = nearest_existing(path)
    if not probe.is_dir():
        return f"{probe} is a file, not a folder, so {path} cannot be created"
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".codemill-writable-"):
            pass
    except OSError as e:
        return f"cannot write in {probe}: {e.strerror or e}"
    return None


def store_problem(root: str, timeout_s: float = 15.0) -> str | None:
    """Why the store at ``root`` cannot be used, or None: a local one must be writable; a remote one must
    answer for the store's own prefix (credentials scoped to it suffice) within ``timeout_s``. A prefix that
    does not exist yet is fine (the run creates it); a bucket that does not exist is not."""
    import threading

    try:
        fs, path = fsspec.core.url_to_fs(root)
    except (ImportError, ValueError) as e:
        return f"store {root}: {e}"
    if isinstance(fs, LocalFileSystem):
        problem = writable_problem(path)
        return f"store {root}: {problem}" if problem else None
    outcome: list[str | None] = []

    def ask() -> None:  # on a daemon thread: a client stuck in its retries cannot hold up the exit
        try:
            fs.ls(path)
            outcome.append(None)
        except FileNotFoundError:
            bucket = path.strip("/").split("/", 1)[0]
            try:
                fs.ls(bucket)
                outcome.append(None)
            except FileNotFoundError:
                outcome.append(f"store {root}: bucket {bucket!r} does not exist")
            except Exception:  # noqa: BLE001 - the prefix answered as missing; a bucket-wide refusal is fine
                outcome.append(None)
        except Exception as e:  # noqa: BLE001 - any client error (credentials, DNS, refused) is the answer
            first = str(e).splitlines()[0] if str(e) else ""
            outcome.append(f"store {root} is not reachable: {type(e).__name__}: {first}")

    worker = threading.Thread(target=ask, daemon=True, name="store-check")
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        return f"store {root} did not answer within {timeout_s:.0f} s"
    return outcome[0]


class ArtifactStore:
    def __init__(self, root: str, cache_dir: str | Path = ".codemill/work/cache") -> None:
        self.root_url = root
        self.fs, path = fsspec.core.url_to_fs(root)
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self.root = os.path.abspath(path) if self.is_local else path.rstrip("/")
        self.cache_dir = Path(cache_dir).absolute()

    # --- addressing -------------------------------------------------------------------------------------
    @property
    def root_uri(self) -> str:
        """The root as the artifacts' URIs start with it."""
        return self._uri(self.root)

    def _path(self, stage: str, name: str, digest: str) -> str:
        return f"{self.root}/{stage}/{name}-{digest[:12]}"

    def _uri(self, path: str) -> str:
        if self.is_local:
            return path
        return self.fs.unstrip_protocol(path)

    def ref(self, stage: str, name: str, digest: str) -> ArtifactRef:
        return ArtifactRef(stage=stage, name=name, digest=digest, uri=self._uri(self._path(stage, name, digest)))

    def _fs_path(self, ref: ArtifactRef) -> str:
        return self._path(ref.stage, ref.name, ref.digest)

    # --- reading ----------------------------------------------------------------------------------------
    def is_committed(self, ref: ArtifactRef) -> bool:
        return self.fs.exists(f"{self._fs_path(ref)}/{MANIFEST}")

    def read_manifest(self, ref: ArtifactRef) -> Manifest:
        path = f"{self._fs_path(ref)}/{MANIFEST}"
        try:
            with self.fs.open(path, "r") as fh:
                manifest = Manifest.model_validate_json(fh.read())
        except FileNotFoundError as exc:
            raise IncompleteArtifactError(f"{ref.uri} has no manifest: it is incomplete or missing") from exc
        if manifest.digest != ref.digest:
            raise IncompleteArtifactError(f"{path}: manifest digest {manifest.digest} != {ref.digest}")
        return manifest

    def local_path(self, ref: ArtifactRef) -> Path:
        """A local directory with the committed payload (downloaded once for remote stores)."""
        if not self.is_committed(ref):
            raise IncompleteArtifactError(f"{ref.uri} is not committed")
        if self.is_local:
            return Path(self._fs_path(ref))
        target = self.cache_dir / ref.stage / f"{ref.name}-{ref.short}"
        if (target / MANIFEST).exists():
            return target
        staging = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        staging.mkdir(parents=True)
        try:
            self.fs.get(f"{self._fs_path(ref)}/", str(staging) + "/", recursive=True)
            _commit_local_dir(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def open_file(self, ref: ArtifactRef, relpath: str, mode: str = "rb"):
        """Open one file of a committed artifact (without downloading the rest of it)."""
        if not self.is_committed(ref):
            raise IncompleteArtifactError(f"{ref.uri} is not committed")
        return self.fs.open(f"{self._fs_path(ref)}/{relpath}", mode)

    def list(self, stage: str) -> list[ArtifactRef]:
        out = []
        for man in self.fs.glob(f"{self.root}/{stage}/*/{MANIFEST}"):
            with self.fs.open(man, "r") as fh:
                m = Manifest.model_validate_json(fh.read())
            out.append(self.ref(m.stage, m.name, m.digest))
        return out

    # --- claims ---------------------------------------------------------------------------------------------
    def claim_path(self, stage: str, key: str) -> str:
        """Where the claim on ``key`` lives: a hidden file in the stage's folder, beside its artifacts."""
        return f"{self.root}/{stage}/.{key}.claim"

    @contextmanager
    def claim(self, stage: str, key: str, run: str, wait_s: float,
              on_wait: Callable[[ClaimOwner], None] = lambda owner: None) -> Iterator[Claim]:
        """Hold the claim on ``key`` of ``stage`` for the block (``store_claim``): a run that finds it held waits,
        at most ``wait_s``, until its holder releases it or dies. ``run`` names this run in the owner record."""
        path, label = self.claim_path(stage, key), f"{stage}/{key}"
        if self.is_local:
            with local_claim(Path(path), label, run, wait_s, on_wait) as held:
                yield held
        elif is_s3(self.fs):
            with s3_claim(self.fs, path, label, run, wait_s, on_wait) as held:
                yield held
        else:  # no conditional write on this filesystem: no claim, the commit stays write-once
            yield Claim(label)

    def claim_artifact(self, ref: ArtifactRef, run: str, wait_s: float,
                       on_wait: Callable[[ClaimOwner], None] = lambda owner: None) -> AbstractContextManager[Claim]:
        """The claim on building ``ref``: one run builds it, the others wait and reuse it."""
        return self.claim(ref.stage, f"{ref.name}-{ref.short}", run, wait_s, on_wait)

    # --- writing ----------------------------------------------------------------------------------------
    def ref_for(self, plan: StagePlan) -> ArtifactRef:
        """Where a plan's artifact lives in this store."""
        return self.ref(plan.stage, plan.name, plan.digest)

    @contextmanager
    def writer(self, plan: StagePlan) -> Iterator[ArtifactWriter]:
        """Yield a staging directory for ``plan``'s artifact; commit on clean exit, discard on error. Never a
        half-written artifact."""
        ref = self.ref_for(plan)
        if self.is_local:
            staging, held = open_staging(Path(self.root) / ref.stage, ".staging-", f"{ref.name}-{ref.short}-")
        else:
            staging, held = open_staging(self.cache_dir, "staging-", f"{ref.name}-{ref.short}-")
        w = ArtifactWriter(plan, ref, staging)
        try:
            yield w
            if w.manifest is None:
                raise RuntimeError(f"writer for {ref.uri} exited without finish(); nothing committed")
            self._commit(ref, staging, w.manifest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            os.close(held)  # after the rename or removal: a sweeper never sees this directory unlocked

    def _commit(self, ref: ArtifactRef, staging: Path, manifest: Manifest) -> None:
        payload = manifest.model_dump_json(indent=2)
        if self.is_local:
            (staging / MANIFEST).write_text(payload)
            _commit_local_dir(staging, Path(self._fs_path(ref)))
            return
        dest = self._fs_path(ref)
        if self.is_committed(ref):  # write-once: another run committed this digest first
            return
        # A directory without a manifest is an interrupted upload or another run's upload in progress: never
        # delete it (that would remove the other run's files); put_file overwrites the same paths.
        for entry in manifest.files:
            self.fs.put_file(str(staging / entry.path), f"{dest}/{entry.path}")
        self.fs.invalidate_cache(dest)
        if self.is_committed(ref):  # committed meanwhile: keep the first manifest
            return
        with self.fs.open(f"{dest}/{MANIFEST}", "w") as fh:
            fh.write(payload)


@contextmanager
def artifact_lock(target: Path) -> Iterator[None]:
    """Exclusive lock on one artifact path across threads and processes (``flock`` on a hidden lock file next
    to it; the lock file stays, it is never read as an artifact)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target.parent / f".{target.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def open_staging(parent: Path, prefix: str, name: str) -> tuple[Path, int]:
    """A new staging directory ``<parent>/<prefix><name><random>`` and the descriptor holding its lock; first,
    the stale staging (and sidecars) of dead writers under ``parent`` are removed."""
    parent.mkdir(parents=True, exist_ok=True)
    with artifact_lock(parent):  # .<parent>.lock, beside it: no sweep runs between the mkdtemp and the flock
        sweep_stale_staging(parent, prefix)
        staging = Path(tempfile.mkdtemp(prefix=f"{prefix}{name}", dir=parent))
        fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new and unseen: cannot be held by anyone else
    return staging, fd


def sweep_stale_staging(parent: Path, prefix: str) -> list[Path]:
    """Remove staging directories under ``parent`` whose writer is gone (their lock can be taken), and the
    files named ``<staging name>.*`` whose staging directory is gone or stale. Returns what was removed."""
    entries = sorted(parent.glob(f"{prefix}*"))
    dirs = [p for p in entries if p.is_dir()]
    files = [p for p in entries if p not in dirs]
    removed = [d for d in dirs if _remove_if_unlocked(d)]
    live = [d.name for d in dirs if d not in removed]
    for f in files:
        if not any(f.name.startswith(f"{n}.") for n in live):
            f.unlink(missing_ok=True)
            removed.append(f)
    return removed


def _remove_if_unlocked(staging: Path) -> bool:
    try:
        fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # renamed into place or removed meanwhile: nothing to sweep
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False  # a live writer holds it
    try:  # held by us now; remove it only if the name still is this directory
        if os.stat(staging).st_ino == os.fstat(fd).st_ino:
            shutil.rmtree(staging, ignore_errors=True)
            return True
        return False
    except OSError:
        return False
    finally:
        os.close(fd)


def _commit_local_dir(staging: Path, target: Path) -> None:
    """Rename a finished directory into place. If another writer won the race, keep theirs (same digest)."""
    with artifact_lock(target):
        if (target / MANIFEST).exists():
            return
        if target.exists():  # an incomplete directory (no manifest) is garbage from a crash
            shutil.rmtree(target)
        os.rename(staging, target)


class ArtifactWriter:
    """A staging directory for one plan's artifact; ``finish`` writes the manifest from the plan, so the
    manifest's config and inputs are exactly what the digest hashed."""

    def __init__(self, plan: StagePlan, ref: ArtifactRef, staging: Path) -> None:
        self.plan = plan
        self.ref = ref
        self.dir = staging
        self.manifest: Manifest | None = None

    def path(self, relpath: str) -> Path:
        p = self.dir / relpath
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def finish(self, stats: dict[str, Any] | None = None) -> Manifest:
        files = []
        for p in sorted(self.dir.rglob("*")):
            if p.is_file() and p.name != MANIFEST:
                files.append(FileEntry(path=p.relative_to(self.dir).as_posix(), bytes=p.stat().st_size,
                                       sha256=sha256_file(p)))
        plan = self.plan
        self.manifest = Manifest(
            stage=self.ref.stage, name=self.ref.name, digest=self.ref.digest, uri=self.ref.uri,
            code_version=plan.code_version, config=plan.config, inputs=plan.input_digests,
            input_uris={k: v.uri for k, v in plan.inputs.items()}, stats=stats or {}, files=files,
        )
        return self.manifest
