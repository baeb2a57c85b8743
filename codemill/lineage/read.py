"""The read side of lineage: every query codemill makes of MLflow (runs, LoggedModels, registry aliases) to
browse the chain. Writes go through ``lineage.record``; the tag names both use are in ``lineage.tags``."""

from __future__ import annotations

from typing import Any

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from codemill.lineage import tags as T
from codemill.lineage.access import guarded_client


class LineageError(LookupError):
    """An id that names nothing, or several things."""


class LineageReader:
    """Read-only queries against one tracking server (and its registry)."""

    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self.client: MlflowClient = guarded_client(tracking_uri)  # 401/403 raise TrackingAccessDenied

    def experiment_ids(self) -> list[str]:
        return [e.experiment_id for e in self.client.search_experiments()]

    def model_of_digest(self, digest: str) -> str | None:
        """The LoggedModel whose weights are the store artifact with this digest, in any experiment."""
        found = self.client.search_logged_models(self.experiment_ids(), filter_string=f"tags.`{T.DIGEST}` = "
                                                                                     f"'{digest}'", max_results=1)
        return found[0].model_id if found else None

    def run(self, run_id: str) -> Any | None:
        try:
            return self.client.get_run(run_id)
        except MlflowException:
            return None

    def model(self, model_id: str) -> Any:
        try:
            return self.client.get_logged_model(model_id)
        except MlflowException as e:
            raise LineageError(f"no LoggedModel {model_id!r} on {self.tracking_uri}") from e

    def stage_run(self, experiment_ids: list[str], stage: str, digest: str) -> Any | None:
        """The first run that produced this artifact."""
        runs = self.client.search_runs(experiment_ids, filter_string=f"tags.`{T.OUTPUT_DIGEST}` = '{digest}' and "
                                                                     f"tags.`{T.STAGE}` = '{stage}'",
                                       max_results=1, order_by=["attributes.start_time ASC"])
        return runs[0] if runs else None

    def eval_runs(self, experiment_id: str, model_id: str) -> list[Any]:
        """The evaluate stage runs of one model, newest first."""
        return self.client.search_runs([experiment_id], filter_string=f"tags.`{T.MODEL_ID}` = '{model_id}' and "
                                                                      f"tags.`{T.STAGE}` = 'evaluate'",
                                       order_by=["attributes.start_time DESC"])

    def aliases_of(self, model_id: str) -> list[str]:
        """'name@alias v<version>' for every registry alias whose version is this model."""
        out = []
        try:
            for rm in self.client.search_registered_models():
                for alias, version in (rm.aliases or {}).items():
                    mv = self.client.get_model_version(rm.name, version)
                    if (mv.tags or {}).get(T.MODEL_ID) == model_id or mv.model_id == model_id:
                        out.append(f"{rm.name}@{alias} v{version}")
        except MlflowException:
            return out
        return out
