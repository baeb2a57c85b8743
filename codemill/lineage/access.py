"""Who may talk to the tracking server: codemill's two identities, the client every MLflow call goes through
(a 401 or 403 raises ``TrackingAccessDenied`` naming the server, the user and the operation, never a silent
'not found'), the preflight credential check and the admin's provisioning of identities."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from mlflow import MlflowClient

from codemill.errors import UserFacingError
from codemill.lineage.check import check_tracking_server, sqlite_file

# A server run with MLflow's basic-auth app (deployments/mlflow/) answers 401 to a client without valid
# credentials and 403 to an identity without the permission. Clients authenticate with MLflow's standard
# MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD; codemill never puts them in a config (configs are logged).
PIPELINE_USER, READER_USER = "pipeline", "reader"
IDENTITY_GRANTS = {PIPELINE_USER: "EDIT", READER_USER: "READ"}  # on every experiment and registered model


class TrackingAccessDenied(UserFacingError, PermissionError):
    """The tracking server refused the credentials (HTTP 401) or this identity's right to an operation (403)."""

    def __init__(self, message: str, status: int, operation: str, user: str | None) -> None:
        super().__init__(message, hint=("check MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" if status == 401
                                        else f"ask the server's admin to grant {user!r} EDIT on this experiment"))
        self.status, self.operation, self.user = status, operation, user


def tracking_user() -> str | None:
    return os.environ.get("MLFLOW_TRACKING_USERNAME") or None


def http_status(exc: BaseException) -> int | None:
    """The HTTP status behind an MLflow client error (REST calls) or a requests error (artifact uploads)."""
    from mlflow.exceptions import MlflowException

    if isinstance(exc, MlflowException):
        return exc.get_http_status_code()
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def access_error(tracking_uri: str, exc: BaseException, operation: str) -> TrackingAccessDenied | None:
    """A 401/403 from the server as an error naming the server, the user and the operation; None otherwise."""
    status, user = http_status(exc), tracking_user()
    if status == 401:
        who = (f"the credentials of user {user!r} (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD)" if user
               else "an anonymous client (set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)")
        return TrackingAccessDenied(f"MLflow tracking server {tracking_uri} refused {who}: HTTP 401 "
                                    f"not authenticated ({operation})", 401, operation, user)
    if status == 403:
        return TrackingAccessDenied(f"MLflow tracking server {tracking_uri} denied user {user!r} permission to "
                                    f"{operation}: HTTP 403 permission denied", 403, operation, user)
    return None


class _GuardedClient:
    """An MlflowClient whose 401/403 failures raise TrackingAccessDenied (never swallowed as 'not found')."""

    def __init__(self, client: MlflowClient, tracking_uri: str) -> None:
        self._client, self._uri = client, tracking_uri

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except Exception as e:
                denied = access_error(self._uri, e, name)
                if denied is None:
                    raise
                raise denied from e
        return call


def guarded_client(tracking_uri: str) -> MlflowClient:
    """The client every codemill MLflow call goes through (lineage writes and the lineage reader)."""
    with database_ready(tracking_uri):
        client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)  # makes a SQLite file's tables
    return cast(MlflowClient, _GuardedClient(client, tracking_uri))


_ready: set[str] = set()  # the SQLite tracking URIs whose tables this process has seen made
_ready_lock = threading.Lock()


@contextlib.contextmanager
def database_ready(tracking_uri: str) -> Iterator[None]:
    """Around a process's first client of a SQLite tracking database, which creates MLflow's tables when they
    are missing: two runs started together on a new file would both create them (``duplicate column name``),
    so the first does it under an ``flock`` beside the file and the others wait and find them made. Once per
    process and URI; servers and other databases make their own tables."""
    path = sqlite_file(tracking_uri) if tracking_uri.startswith("sqlite:///") else None
    if path is None or tracking_uri in _ready:
        yield
        return
    with _ready_lock:
        db = Path(path).absolute()
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(db.parent / f".{db.name}.init.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:  # a read-only folder: no tables can be made there, and MLflow's own error says so
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
            _ready.add(tracking_uri)
        finally:
            os.close(fd)  # closing the descriptor releases the lock


def check_credentials(tracking_uri: str) -> None:
    """Preflight, before any stage runs: one authenticated read, so a wrong or missing password fails the flow
    at start with TrackingAccessDenied naming the server (a server without auth simply answers)."""
    if tracking_uri.startswith(("http://", "https://")):
        guarded_client(tracking_uri).search_experiments(max_results=1)


def provision_identities(tracking_uri: str, passwords: dict[str, str], experiments: list[str],
                         registered_models: list[str]) -> list[str]:
    """Create or update codemill's identities on a basic-auth server; run with an admin's MLFLOW_TRACKING_*.

    ``passwords``: username -> password for ``pipeline`` (EDIT on every experiment and registered model: runs,
    LoggedModels, versions, the alias) and ``reader`` (READ on all of them). Existing users get the password
    given (this is how passwords rotate) and lose admin rights. The experiments and registered models named are
    created by the admin first, so no other identity can create them and own them. Returns what was done."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
    from mlflow.server import get_app_client

    check_tracking_server(tracking_uri)
    auth = get_app_client("basic-auth", tracking_uri=tracking_uri)
    client = guarded_client(tracking_uri)
    done: list[str] = []
    for user, password in passwords.items():
        level = IDENTITY_GRANTS[user]
        try:
            existing = auth.get_user(user)
        except MlflowException:
            existing = None
        if existing is None:
            auth.create_user(user, password)
            done.append(f"created user {user}")
        else:
            auth.update_user_password(user, password)
            if existing.is_admin:
                auth.update_user_admin(user, False)
            done.append(f"set the password of {user}")
        for resource_type in ("experiment", "registered_model"):
            try:
                auth.grant_user_permission(user, resource_type, "*", level)
            except MlflowException as e:
                if e.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                    raise
                auth.revoke_user_permission(user, resource_type, "*")  # the level given here is the one that holds
                auth.grant_user_permission(user, resource_type, "*", level)
            done.append(f"{user}: {level} on every {resource_type}")
    for name in experiments:
        if client.get_experiment_by_name(name) is None:
            client.create_experiment(name)
            done.append(f"created experiment {name}")
    for name in registered_models:
        with contextlib.suppress(MlflowException):  # exists already
            client.create_registered_model(name)
            done.append(f"created registered model {name}")
    return done
