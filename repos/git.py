"""Git, as the snapshots and task synthesis use it: commits that must exist locally, trees read from them, and
squashed single-commit snapshots an agent cannot read a fix from.

Nothing is fetched: a commit that is not in the local repository is an error that says so.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from codemill.errors import UserFacingError

SNAPSHOT_BRANCH = "main"
# git run inside the sandbox, as a uid that does not own the tree, refuses the repository unless told it is safe.
GIT_SAFE = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
IDENTITY = {"GIT_AUTHOR_NAME": "codemill", "GIT_AUTHOR_EMAIL": "codemill@localhost",
            "GIT_COMMITTER_NAME": "codemill", "GIT_COMMITTER_EMAIL": "codemill@localhost",
            "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}


class RepoError(UserFacingError, RuntimeError):
    """A repository or commit a task names that is not usable here (one line: which, where, why)."""


def git(repo: str | Path, *args: str, input: bytes | None = None, check: bool = True,
        env: dict[str, str] | None = None) -> str:
    """``git -C repo args``: its stdout; a failure raises RepoError with git's last line. Runs with a fixed
    identity and dates and without the user's config, so the same inputs give the same commits."""
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C", **IDENTITY, **(env or {})}
    proc = subprocess.run(["git", "-C", str(repo), *args], input=input, capture_output=True, env=full)
    if check and proc.returncode != 0:
        said = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
        raise RepoError(f"git {' '.join(args[:3])} in {repo}: {said[-1] if said else f'exit {proc.returncode}'}")
    return proc.stdout.decode(errors="replace")


def resolve_commit(repo: str | Path, commit: str) -> str:
    """The full hash of ``commit`` in the local repository ``repo`` (a work tree or a bare repository)."""
    if not Path(repo).exists():
        raise RepoError(f"repository {repo} does not exist")
    try:
        git(repo, "rev-parse", "--git-dir")
    except RepoError as e:
        raise RepoError(f"{repo} is not a git repository") from e
    out = git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", check=False).strip()
    if not out:
        raise RepoError(f"commit {commit} is not in {repo}; codemill fetches nothing at run time: fetch it into "
                        "that repository first (git fetch origin <commit>)")
    return out


def tree_of(repo: str | Path, commit: str) -> str:
    """The tree hash of ``commit``: what a snapshot is addressed by (the same files give the same snapshot)."""
    return git(repo, "rev-parse", f"{resolve_commit(repo, commit)}^{{tree}}").strip()


def export_tree(repo: str | Path, commit: str, dest: Path) -> None:
    """The files of ``commit`` written under ``dest`` (no history, no ``.git``)."""
    import io
    import tarfile

    data = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", resolve_commit(repo, commit)],
                          capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")


def squash_into_repo(tree: Path, message: str = "snapshot") -> str:
    """Make ``tree`` a repository of exactly one commit holding its files: one branch, no reflog, no hooks, no
    remotes, no other objects. Returns the commit. An agent working in it finds no history to read a fix from."""
    git(tree, "init", "-q", "-b", SNAPSHOT_BRANCH)
    git(tree, "config", "core.fileMode", "false")  # the sandbox uid may see other modes than git stored
    git(tree, "config", "core.logAllRefUpdates", "false")
    git(tree, "add", "-A", "-f")
    git(tree, "commit", "-q", "--no-verify", "-m", message)
    for folder in ("logs", "hooks"):
        _remove(tree / ".git" / folder)
    (tree / ".git" / "description").unlink(missing_ok=True)
    return git(tree, "rev-parse", "HEAD").strip()


def history_leaks(tree: Path) -> list[str]:
    """What in ``tree``'s repository could show the agent anything beyond its one commit: other refs, a reflog,
    more commits, or objects that commit does not reach. Empty for a sound snapshot."""
    leaks = []
    refs = git(tree, "for-each-ref", "--format=%(refname)").split()
    if refs != [f"refs/heads/{SNAPSHOT_BRANCH}"]:
        leaks.append(f"refs: {refs}")
    if (tree / ".git" / "logs").exists():
        leaks.append("a reflog")
    if (tree / ".git" / "packed-refs").exists():
        leaks.append("packed refs")
    commits = git(tree, "rev-list", "--all").split()
    if len(commits) != 1:
        leaks.append(f"{len(commits)} commits")
    reachable = set(git(tree, "rev-list", "--all", "--objects").split("\n"))
    reachable = {line.split(" ", 1)[0] for line in reachable if line}
    stored = set(git(tree, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)").split())
    if stored - reachable:
        leaks.append(f"{len(stored - reachable)} unreachable objects")
    return leaks


def _remove(path: Path) -> None:
    import shutil

    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def commit_files(repo: str | Path, parent: str, changes: dict[str, bytes | None], message: str) -> str:
    """A new commit in ``repo`` (bare or not, its work tree untouched): ``parent``'s tree with ``changes``
    (new bytes, or None to delete). Kept reachable under ``refs/codemill/<commit>``."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="codemill-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", parent, env=env)
        modes = {}
        for line in git(repo, "ls-tree", "-r", parent).splitlines():
            meta, path = line.split("\t", 1)
            modes[path] = meta.split()[0]
        for path, data in sorted(changes.items()):
            if data is None:
                git(repo, "update-index", "--force-remove", "--", path, env=env)
                continue
            blob = git(repo, "hash-object", "-w", "--stdin", input=data).strip()
            git(repo, "update-index", "--add", "--cacheinfo", f"{modes.get(path, '100644')},{blob},{path}", env=env)
        tree = git(repo, "write-tree", env=env).strip()
    commit = git(repo, "commit-tree", tree, "-p", parent, "-m", message).strip()
    git(repo, "update-ref", f"refs/codemill/{commit}", commit)
    return commit


def repo_folder(repos: Path, name: str) -> Path:
    """Where a task's ``repo`` (``owner/name``) lives under ``repos``: ``owner/name``, ``owner__name`` or
    ``name`` (the first that exists; the first form when none does)."""
    candidates = [repos / name, repos / name.replace("/", "__"), repos / name.rsplit("/", 1)[-1]]
    return next((c for c in candidates if c.exists()), candidates[0])
