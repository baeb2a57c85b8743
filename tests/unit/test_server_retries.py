"""Stage tasks retry when a server did not answer, never on bad input; a dead tracking server is named at once."""

from __future__ import annotations

import pytest
import requests
from mlflow.exceptions import MlflowException
from prefect.states import Failed

from codemill.lineage import Lineage
from codemill.lineage.check import TrackingServerUnavailable
from codemill.tasks.common import retry_on_server_error
from tests.conftest import free_port


def _chained() -> BaseException:
    try:
        try:
            raise requests.ConnectionError("connection refused")
        except requests.ConnectionError as cause:
            raise RuntimeError("log_batch failed") from cause
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize(("exc", "retry"), [
    (ValueError("no such source"), False),
    (MlflowException("RESOURCE_DOES_NOT_EXIST: run abc"), False),
    (MlflowException("API request to http://h/api failed: Max retries exceeded with url"), True),
    (TrackingServerUnavailable("MLflow tracking server http://h is unreachable"), True),
    (_chained(), True),
])
def test_retries_only_server_errors(exc, retry):
    assert retry_on_server_error(None, None, Failed(data=exc)) is retry


def test_dead_tracking_server_is_named_at_once():
    uri = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TrackingServerUnavailable, match=f"MLflow tracking server {uri} is unreachable"):
        Lineage(uri, "x")
