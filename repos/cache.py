"""Built once per repository and shared read-only by every episode: snapshots and execution environments.

Both live in a local folder (overlayfs needs a local lower layer), content-addressed, and are made in a
temporary folder renamed into place last, so a killed build leaves nothing that looks finished:

- ``snapshots/<tree hash>/``: a task's files at its base commit, as a repository of one squashed commit
  (``git.squash_into_repo``). The tree hash addresses it, so two tasks at the same files share one.
- ``envs/<digest>/``: a virtual environment whose site-packages links the installed distributions the tests
  need (pytest and its requirements, plus a repository's own), with a ``.pth`` that puts the repository's
  source roots on the path. No download: a requirement that is not installed here is an error that says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from codemill.errors import UserFacingError
from codemill.hashing import digest_of
from codemill.repos import git
from codemill.repos.workspace import MOUNT_POINT

TEST_REQUIREMENTS = ("pytest",)
PLUGIN = "_codemill_report"  # report_plugin.py, as the environments hold it
ENV_LAYOUT = "links-v1"  # what an environment holds and how: a change rebuilds every environment
SOURCE_ROOTS = ("src", "lib", "")  # folders under the tree whose packages tests import


class EnvError(UserFacingError, RuntimeError):
    """An execution environment that cannot be built here (a requirement that is not installed)."""


def default_root() -> Path:
    return Path(os.environ.get("CODEMILL_REPO_CACHE") or Path.home() / ".cache" / "codemill" / "repos")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


class RepoCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or default_root())
        # What a warm lookup would otherwise recompute per episode (git subprocesses, the installed dists):
        # a full commit hash always names the same tree, and this process's installed packages do not change.
        self._trees: dict[tuple[str, str], str] = {}
        self._envs: dict[tuple[str, tuple[str, ...]], Path] = {}

    # --- snapshots ------------------------------------------------------------------------------------
    def snapshot(self, repo: str | Path, commit: str) -> Path:
        """The snapshot of ``repo`` at ``commit`` (built on first use)."""
        key = (str(repo), commit)
        tree = self._trees.get(key) or git.tree_of(repo, commit)
        if len(commit) == 40 and all(c in "0123456789abcdef" for c in commit):
            self._trees[key] = tree

        def build(tmp: Path) -> None:
            git.export_tree(repo, commit, tmp)
            git.squash_into_repo(tmp, f"snapshot {tree[:12]}")
            _open_to_sandbox_uids(tmp)
            git.git(tmp, "update-index", "-q", "--refresh", check=False)

        return _built_once(self.root / "snapshots" / tree, build)

    # --- execution environments -----------------------------------------------------------------------
    def env(self, snapshot: Path, requirements: Sequence[str] = ()) -> Path:
        """The environment for a repository's tests (its snapshot gives the source roots)."""
        key = (str(snapshot), tuple(requirements))
        if key in self._envs and self._envs[key].is_dir():
            return self._envs[key]
        self._envs[key] = self._env(snapshot, requirements)
        return self._envs[key]

    def _env(self, snapshot: Path, requirements: Sequence[str]) -> Path:
        dists = distribution_closure([*TEST_REQUIREMENTS, *requirements])
        roots = [r for r in SOURCE_ROOTS if (snapshot / r).is_dir()]
        # The environment links the installed packages where they are: two interpreters' environments with the
        # same versions (a CI venv and a developer's) must not share one, whose links only one of them can follow.
        digest = digest_of({"layout": ENV_LAYOUT, "python": sys.version,
                            "executable": os.path.realpath(sys.executable),
                            "dists": sorted((d, v, str(path)) for d, (v, path) in dists.items()), "roots": roots})
        final = self.root / "envs" / digest[:16]
        return _built_once(final, lambda tmp: _build_env(tmp, final, dists, roots))


def _built_once(final: Path, build: Callable[[Path], None]) -> Path:
    """``final``, built by ``build`` into a temporary folder renamed into place last (under a lock, so two
    processes build it once, and a killed build leaves nothing that looks finished)."""
    if final.is_dir():
        return final
    with _locked(final):
        if final.is_dir():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name[:12]}-", dir=final.parent))
        try:
            build(tmp)
            tmp.chmod(0o755)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def python_of(env: Path) -> str:
    return str(env / "bin" / "python")


def _open_to_sandbox_uids(tree: Path) -> None:
    """Files readable and writable through the overlay by whichever uid the sandbox runs as (the lower layer is
    never written: overlayfs copies a file up before the first write)."""
    for dirpath, _dirnames, filenames in os.walk(tree):
        os.chmod(dirpath, 0o777)
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                mode = os.stat(p).st_mode
                os.chmod(p, 0o777 if mode & 0o111 else 0o666)


def distribution_closure(requirements: Sequence[str]) -> dict[str, tuple[str, Path]]:
    """``{name: (version, dist-info path)}`` of the installed distributions ``requirements`` need (markers
    evaluated for this interpreter, extras not followed)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, tuple[str, Path]] = {}
    queue = list(requirements)
    while queue:
        req = Requirement(queue.pop())
        name = canonicalize_name(req.name)
        if name in found:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise EnvError(f"the tests need {req.name}, which is not installed in this environment "
                           f"({sys.prefix}); codemill installs nothing at run time",
                           hint=f"pip install {req.name}") from None
        found[name] = (dist.version, _dist_info(dist))
        for sub in dist.requires or []:
            r = Requirement(sub)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                queue.append(str(r))
    return found


def _dist_info(dist) -> Path:
    return Path(str(dist._path))  # the .dist-info folder (importlib.metadata.PathDistribution)


def _top_level(dist_info: Path) -> list[str]:
    """The top-level names a distribution installed into site-packages (from its RECORD)."""
    record = dist_info / "RECORD"
    names = {dist_info.name}
    if record.is_file():
        for line in record.read_text().splitlines():
            first = line.split(",", 1)[0].split("/", 1)[0]
            if first and first not in ("..", "__pycache__") and not first.endswith(".pth"):
                names.add(first)
    return sorted(names)


def _build_env(tmp: Path, final: Path, dists: dict[str, tuple[str, Path]], roots: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True, capture_output=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(tmp), "platbase": str(tmp)}))
    site.mkdir(parents=True, exist_ok=True)
    for _, (_, info) in sorted(dists.items()):
        for name in _top_level(info):
            src = info.parent / name
            if src.exists() and not (site / name).exists():
                (site / name).symlink_to(src)
    shutil.copyfile(Path(__file__).with_name("report_plugin.py"), site / f"{PLUGIN}.py")
    lines = [f"{MOUNT_POINT}/{r}".rstrip("/") for r in roots]
    (site / "_codemill_repository.pth").write_text("\n".join(lines) + "\n")
    # venv wrote absolute paths of the temporary name into its scripts and config: point them at the final one
    cfg = tmp / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace(str(tmp), str(final)))
