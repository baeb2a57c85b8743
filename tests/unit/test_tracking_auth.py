"""How codemill reports a tracking server's refusals: 401/403 (REST calls or artifact uploads) become
TrackingAccessDenied naming the server, the user and the operation; every other error passes through unchanged."""

from __future__ import annotations

import pytest
import requests
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import PERMISSION_DENIED, RESOURCE_DOES_NOT_EXIST, UNAUTHENTICATED
from prefect.states import Failed

from codemill.lineage.access import TrackingAccessDenied, _GuardedClient, access_error
from codemill.tasks.common import retry_on_server_error

URI = "http://mlflow:5000"


def _mlflow_error(code: int) -> MlflowException:
    return MlflowException("API request failed", error_code=code)


def _http_error(status: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"{status} error", response=response)


def test_refusals_name_server_user_and_operation(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "reader")
    denied = access_error(URI, _mlflow_error(PERMISSION_DENIED), "set_registered_model_alias")
    assert str(denied) == ("MLflow tracking server http://mlflow:5000 denied user 'reader' permission to "
                           "set_registered_model_alias: HTTP 403 permission denied")
    upload = access_error(URI, _http_error(403), "log_dict")
    assert (upload.status, upload.operation, upload.user) == (403, "log_dict", "reader")
    wrong = access_error(URI, _mlflow_error(UNAUTHENTICATED), "search_experiments")
    assert str(wrong).startswith("MLflow tracking server http://mlflow:5000 refused the credentials of user 'reader'")
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    anonymous = access_error(URI, _http_error(401), "create_run")
    assert "refused an anonymous client (set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)" in str(anonymous)
    assert access_error(URI, _mlflow_error(RESOURCE_DOES_NOT_EXIST), "get_run") is None
    assert access_error(URI, ValueError("bad"), "get_run") is None


class _FakeClient:
    tracking_uri = URI

    def create_run(self, experiment_id: str):
        raise _mlflow_error(PERMISSION_DENIED)

    def get_run(self, run_id: str):
        raise _mlflow_error(RESOURCE_DOES_NOT_EXIST)


def test_guarded_client_translates_refusals_only():
    client = _GuardedClient(_FakeClient(), URI)  # type: ignore[arg-type]
    assert client.tracking_uri == URI
    with pytest.raises(TrackingAccessDenied) as denied:
        client.create_run("1")
    assert denied.value.operation == "create_run" and isinstance(denied.value.__cause__, MlflowException)
    with pytest.raises(MlflowException, match="API request failed"):  # a missing run stays a lookup failure
        client.get_run("r")


def test_a_refusal_is_not_retried():
    """A wrong password or a missing permission does not fix itself: the stage fails at once."""
    denied = access_error(URI, _mlflow_error(UNAUTHENTICATED), "log_batch")
    assert retry_on_server_error(None, None, Failed(data=denied)) is False
