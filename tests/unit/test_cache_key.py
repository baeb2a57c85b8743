"""The Prefect cache key of a stage names its store and tracking store absolutely: the default relative
``.codemill/store`` and ``sqlite:///mlflow.db`` in two working folders must not share cached results (a hit
would hand one folder's MLflow run ids to the other's database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from codemill.lineage.check import absolute_tracking_uri
from codemill.plan import StagePlan
from codemill.tasks.common import RunContext, artifact_cache_key

PLAN = StagePlan(stage="ingest", name="corpus", code_version="v1", config={"a": 1})
DEFAULTS = RunContext(store_root=".codemill/store", work_dir=".codemill/work", tracking_uri="sqlite:///mlflow.db",
                      experiment="e")


def key_in(folder: Path, monkeypatch: pytest.MonkeyPatch, ctx: RunContext = DEFAULTS) -> str:
    monkeypatch.chdir(folder)
    return artifact_cache_key(None, {"plan": PLAN, "ctx": ctx})  # type: ignore[arg-type]


def test_two_working_folders_have_two_keys(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = key_in(tmp_path / "a", monkeypatch), key_in(tmp_path / "b", monkeypatch)
    assert a != b
    assert str(tmp_path / "a" / ".codemill" / "store") in a and f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}" in a


def test_absolute_locations_give_one_key_anywhere(tmp_path, monkeypatch):
    ctx = DEFAULTS.model_copy(update={"store_root": str(tmp_path / "store"),
                                      "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert key_in(tmp_path / "a", monkeypatch, ctx) == key_in(tmp_path / "b", monkeypatch, ctx)


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "sqlite:////abs/mlflow.db", "sqlite:///:memory:",
                                 "databricks", "postgresql://u@h/db"])
def test_servers_and_absolute_uris_are_unchanged(uri):
    assert absolute_tracking_uri(uri) == uri


def test_relative_file_store_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_tracking_uri("mlruns") == str(tmp_path / "mlruns")
