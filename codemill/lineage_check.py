"""Is the MLflow tracking store usable, checked over plain HTTP (or the file system) without importing MLflow:
the preflight asks before a run starts, in well under a second, with the credentials the run will use."""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from codemill.errors import UserFacingError


class TrackingServerUnavailable(UserFacingError, ConnectionError):
    """The MLflow tracking server does not answer; raised at once instead of after MLflow's long retries."""

    def __init__(self, message: str) -> None:
        super().__init__(message, hint="start the server (mlflow server ...) or point mlflow_tracking_uri / "
                                       "MLFLOW_TRACKING_URI at one that runs")


class TrackingCredentialsRefused(UserFacingError, PermissionError):
    """The server answered 401/403 to the credentials in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD."""


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


def check_tracking_credentials(tracking_uri: str, timeout: float = 10) -> None:
    """One authenticated read (search one experiment) as the run will make it: a basic-auth server answers
    401 to wrong or missing credentials and 403 to an identity that may not read."""
    if not is_http(tracking_uri):
        return
    request = urllib.request.Request(f"{tracking_uri.rstrip('/')}/api/2.0/mlflow/experiments/search?max_results=1")
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user:
        token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            if e.code == 403:
                what = f"denied read access to user {user!r}"
            elif user:
                what = f"refused the credentials of user {user!r}"
            else:
                what = "requires credentials and none were given (MLFLOW_TRACKING_USERNAME is not set)"
            raise TrackingCredentialsRefused(
                f"MLflow tracking server {tracking_uri} {what} (HTTP {e.code})",
                hint="set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to an identity of that server "
                     "(codemill mlflow-identities creates them)") from e
        raise TrackingServerUnavailable(f"MLflow tracking server {tracking_uri} answered HTTP {e.code}: "
                                        f"{_error_message(e)}") from e
    except OSError as e:
        raise TrackingServerUnavailable(f"MLflow tracking server {tracking_uri} is unreachable: {e}") from e


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(e.read() or b"{}").get("message", e.reason))[:200]
    except (ValueError, OSError):
        return str(e.reason)


def check_local_tracking_store(tracking_uri: str) -> None:
    """A ``sqlite:///path`` or ``file:`` store: its folder must exist or be creatable, and be writable."""
    parsed = urllib.parse.urlparse(tracking_uri)
    if parsed.scheme == "sqlite":
        path = tracking_uri.removeprefix("sqlite:///")
        if path in ("", ":memory:"):
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
