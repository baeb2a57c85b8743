"""Is the MLflow tracking store there, checked over plain HTTP (or the file system) without importing MLflow:
a dead server or an unwritable SQLite folder is found in well under a second. Credentials are checked by
``lineage.access.check_credentials``, through MLflow's own client (its token, TLS and basic-auth settings)."""

from __future__ import annotations

import urllib.parse
import urllib.request
from pathlib import Path

from codemill.errors import UserFacingError


class TrackingServerUnavailable(UserFacingError, ConnectionError):
    """The MLflow tracking server does not answer; raised at once instead of after MLflow's long retries."""

    def __init__(self, message: str) -> None:
        super().__init__(message, hint="start the server (mlflow server ...) or point mlflow_tracking_uri / "
                                       "MLFLOW_TRACKING_URI at one that runs")


def is_http(tracking_uri: str) -> bool:
    return tracking_uri.startswith(("http://", "https://"))


def check_tracking_server(tracking_uri: str, timeout: float = 10) -> None:
    """Fail fast, naming the URI, when an HTTP tracking server is down (file/sqlite URIs need no check)."""
    if not is_http(tracking_uri):
        return
    try:
        with urllib.request.urlopen(f"{tracking_uri.rstrip('/')}/health", timeout=timeout):
            return
    except OSError as e:
        raise TrackingServerUnavailable(f"MLflow tracking server {tracking_uri} is unreachable: {e}") from e


MLFLOW_NAMED_TARGETS = ("databricks", "databricks-uc", "uc")  # tracking URIs without a scheme that are not paths


def sqlite_file(tracking_uri: str) -> str | None:
    """The database file of a ``sqlite:///path`` URI; None for an in-memory database."""
    path = tracking_uri.removeprefix("sqlite:///")
    return None if path in ("", ":memory:") else path


def absolute_tracking_uri(tracking_uri: str) -> str:
    """The same tracking store named so that it means one place from any working directory: a relative
    ``sqlite:///mlflow.db`` or file store made absolute; servers and absolute paths unchanged."""
    parsed = urllib.parse.urlparse(tracking_uri)
    if parsed.scheme == "sqlite":
        path = sqlite_file(tracking_uri)
        if path is None or path.startswith("/"):
            return tracking_uri
        return f"sqlite:///{Path(path).absolute()}"
    if parsed.scheme == "" and tracking_uri not in MLFLOW_NAMED_TARGETS:
        return str(Path(tracking_uri).absolute())
    return tracking_uri


def check_local_tracking_store(tracking_uri: str) -> None:
    """A ``sqlite:///path`` or ``file:`` store: its folder must exist or be creatable, and be writable."""
    parsed = urllib.parse.urlparse(tracking_uri)
    if parsed.scheme == "sqlite":
        path = sqlite_file(tracking_uri)
        if path is None:
            return
        folder = Path(path).parent
    elif parsed.scheme in ("", "file"):
        folder = Path(parsed.path or tracking_uri)
    else:
        return
    from codemill.store import writable_problem

    problem = writable_problem(folder)
    if problem:
        raise UserFacingError(f"MLflow tracking store {tracking_uri}: {problem}",
                              hint="point mlflow_tracking_uri at a writable location")
