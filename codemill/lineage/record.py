"""All MLflow writes of the pipeline, the trainer's rank-0 logging included.

The chain, as the MLflow UI and ``MlflowClient`` see it:
eval metric (model_id, dataset digest) -> LoggedModel (source_run_id = train run, tag codemill.digest)
-> train run input dataset "tokens" (digest = token artifact digest, source = its URI)
-> tokenize run (tag codemill.output_digest = that digest) -> input dataset "corpus" (corpus digest)
-> ingest run (codemill.output_digest = corpus digest) -> tags codemill.source.N.{root,fingerprint}.

Every call names its run or model explicitly (no fluent active-run state): tasks run in threads, and
mlflow's fluent state after log_model is known to be stale (mlflow#21839).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
from mlflow import MlflowClient
from mlflow.entities import DatasetInput, InputTag, LoggedModelInput, LoggedModelOutput, Metric, RunStatus
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

from codemill.lineage import tags as T
from codemill.lineage.access import check_credentials, guarded_client
from codemill.lineage.check import check_tracking_server
from codemill.store import ArtifactRef, Manifest

if TYPE_CHECKING:
    from codemill.plan import StagePlan

MAX_TAG = 5000
SYSTEM_METRICS_INTERVAL_S = 5
MLFLOW_DIGEST_CHARS = 32  # MLflow caps dataset digests at 36 chars; 32 hex = 128 bits of the sha256


def mlflow_digest(digest: str) -> str:
    """The store digest as MLflow can hold it (a prefix); the full one is in the dataset's tags/run tags."""
    return digest[:MLFLOW_DIGEST_CHARS]


DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")  # MLflow's SQLAlchemy store (``scheme[+driver]://``)


def preload_store(tracking_uri: str) -> None:
    """Import the MLflow store module a database ``tracking_uri`` needs (a second: SQLAlchemy and MLflow's models),
    which MLflow otherwise imports at the first client. The CLI calls this while Prefect's temporary server boots,
    time it spends waiting anyway."""
    if tracking_uri.split(":", 1)[0].split("+", 1)[0] in DATABASE_SCHEMES:
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401


class Lineage:
    def __init__(self, tracking_uri: str, experiment_name: str) -> None:
        self.tracking_uri = tracking_uri
        check_tracking_server(tracking_uri)
        check_credentials(tracking_uri)
        # MLflow's SQL registry store looks LoggedModels up through a default MlflowClient(), i.e. the global
        # tracking URI, so the process-wide URI must agree with the one this client writes to.
        mlflow.set_tracking_uri(tracking_uri)
        self.client = guarded_client(tracking_uri)
        exp = self.client.get_experiment_by_name(experiment_name)
        self.experiment_id = exp.experiment_id if exp else self._create_experiment(experiment_name)

    @classmethod
    def of_run(cls, run_id: str) -> Lineage:
        """A Lineage on one run's own experiment at this process's tracking URI (``MLFLOW_TRACKING_URI``): all a
        process handed only a run id has to go on (the trainer's rank 0)."""
        uri = mlflow.get_tracking_uri()
        client = MlflowClient(uri)
        experiment = client.get_experiment(client.get_run(run_id).info.experiment_id)
        return cls(uri, experiment.name)

    def _create_experiment(self, name: str) -> str:
        try:
            return self.client.create_experiment(name)
        except Exception:  # another process created it first
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    # --- runs -------------------------------------------------------------------------------------------
    def start_parent(self, name: str, flow_run_id: str | None, flow_run_url: str | None,
                     config: dict[str, Any]) -> str:
        tags = {MLFLOW_RUN_NAME: name, T.STAGE: "pipeline"}
        if flow_run_id:
            tags[T.FLOW_RUN] = flow_run_id
        if flow_run_url:
            tags[T.FLOW_RUN_URL] = flow_run_url
        run = self.client.create_run(self.experiment_id, tags=tags, run_name=name)
        self.client.log_dict(run.info.run_id, config, "pipeline_config.json")
        return run.info.run_id

    def end_run(self, run_id: str, failed: bool = False) -> None:
        status = RunStatus.to_string(RunStatus.FAILED if failed else RunStatus.FINISHED)
        self.client.set_terminated(run_id, status=status)

    @contextmanager
    def stage_run(self, parent_run_id: str | None, stage: str, digest: str,
                  system_metrics: bool = False) -> Iterator[str]:
        """A stage's child run; ``system_metrics``: MLflow samples CPU, memory (and GPU with pynvml) on it."""
        tags = {T.STAGE: stage, T.OUTPUT_DIGEST: digest, MLFLOW_RUN_NAME: stage}
        if parent_run_id:
            tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
        run_id = self.client.create_run(self.experiment_id, tags=tags, run_name=stage).info.run_id
        monitor = self._system_metrics(run_id) if system_metrics else None
        try:
            yield run_id
        except BaseException:
            self._stop(monitor)
            self.end_run(run_id, failed=True)
            raise
        self._stop(monitor)
        self.end_run(run_id)

    def _system_metrics(self, run_id: str) -> Any:
        """MLflow's system-metrics sampler on this run (``system/cpu_utilization_percentage``, memory, GPU);
        every SYSTEM_METRICS_INTERVAL_S seconds unless MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL says otherwise."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(run_id, sampling_interval=SYSTEM_METRICS_INTERVAL_S,
                                       tracking_uri=self.tracking_uri)
        monitor.start()
        return monitor

    @staticmethod
    def _stop(monitor: Any) -> None:
        if monitor is not None:
            monitor.finish()

    def tag(self, run_id: str, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(run_id, k, str(v)[:MAX_TAG])

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        for k, v in flatten(params).items():
            self.client.log_param(run_id, k, str(v)[:6000])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        import time

        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def log_json(self, run_id: str, obj: Any, artifact_file: str) -> None:
        self.client.log_dict(run_id, json.loads(json.dumps(obj, default=str)), artifact_file)

    def log_table(self, run_id: str, rows: list[dict[str, Any]], artifact_file: str) -> None:
        """A table the MLflow UI shows in its artifact view (and ``mlflow.load_table`` reads back)."""
        if rows:
            columns = {k: [r.get(k) for r in rows] for k in rows[0]}
            self.client.log_table(run_id, data=columns, artifact_file=artifact_file)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.client.log_text(run_id, text, artifact_file)

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def record_plan(self, run_id: str, plan: StagePlan, manifest: Manifest, ref: ArtifactRef) -> None:
        """What every stage run records, all from its plan: the hashed config as params, each input's digest
        as a tag, where the artifact lives, and the manifest itself."""
        self.log_params(run_id, {plan.stage: plan.config})
        self.tag(run_id, {T.OUTPUT_URI: ref.uri, **{T.input_digest(k): v.digest for k, v in plan.inputs.items()}})
        self.log_json(run_id, manifest.model_dump(mode="json"), "manifest.json")

    def find_stage_run(self, stage: str, digest: str) -> str | None:
        """The first finished run of this experiment that produced the artifact, if this server has one."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{T.OUTPUT_DIGEST}` = '{digest}' and tags.`{T.STAGE}` = '{stage}'"
                          " and attributes.status = 'FINISHED'",
            max_results=1, order_by=["attributes.start_time ASC"])
        return runs[0].info.run_id if runs else None

    def run_tags(self, run_id: str) -> dict[str, str]:
        return dict(self.client.get_run(run_id).data.tags)

    def flow_runs(self, flow_run_id: str) -> list[str]:
        """The MLflow parent runs of one Prefect flow run."""
        runs = self.client.search_runs([self.experiment_id], filter_string=f"tags.`{T.FLOW_RUN}` = '{flow_run_id}'")
        return [r.info.run_id for r in runs]

    # --- datasets ------------------------------------------------------------------------------------
    @staticmethod
    def dataset(ref: ArtifactRef, name: str | None = None):
        """A metadata-only MLflow dataset whose digest is the store digest and whose source is the URI."""
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            source = resolve_dataset_source(ref.uri)
        # MLflow's hints mark MetaDataset abstract (``profile``); it is the documented metadata-only dataset.
        return MetaDataset(source=source, name=name or f"{ref.stage}:{ref.name}",  # type: ignore[abstract]
                           digest=mlflow_digest(ref.digest))

    def log_dataset_input(self, run_id: str, ref: ArtifactRef, context: str, name: str | None = None) -> None:
        entity = self.dataset(ref, name)._to_mlflow_entity()
        self.client.log_inputs(run_id, datasets=[
            DatasetInput(dataset=entity, tags=[InputTag(key="mlflow.data.context", value=context)])])

    # --- models -----------------------------------------------------------------------------------------
    def find_model(self, digest: str) -> str | None:
        found = self.client.search_logged_models(
            experiment_ids=[self.experiment_id], filter_string=f"tags.`{T.DIGEST}` = '{digest}'",
            max_results=1)
        return found[0].model_id if found else None

    def log_checkpoint(self, run_id: str, ref: ArtifactRef, hf_dir: Path, train_data: ArtifactRef,
                       step: int, params: dict[str, Any]) -> str:
        """The checkpoint as a LoggedModel carrying the HF-format model and tokenizer."""
        model = self.client.create_logged_model(
            self.experiment_id, name=f"{ref.name}-{ref.short}", source_run_id=run_id,
            tags={T.DIGEST: ref.digest, T.OUTPUT_URI: ref.uri, T.TRAIN_DATA_DIGEST: train_data.digest},
            params={k: str(v) for k, v in flatten(params).items()}, model_type="transformers-causal-lm")
        self.client.log_model_artifacts(model.model_id, str(hf_dir))
        self.client.finalize_logged_model(model.model_id, "READY")
        self.client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step)])
        return model.model_id

    def log_step_checkpoint(self, run_id: str, step: int, losses: dict[str, float | None], dataset_name: str,
                            dataset_digest: str | None) -> str:
        """A committed training checkpoint as a LoggedModel of the run, with its step and each loss given (on the
        training data, when its digest is known). No location: the step folders are resume scratch, pruned and
        deleted, while a LoggedModel is permanent."""
        model = self.client.create_logged_model(self.experiment_id, name=f"ckpt-step{step}", source_run_id=run_id,
                                                tags={T.CHECKPOINT_STEP: str(step)}, model_type="dcp-checkpoint")
        self.client.finalize_logged_model(model.model_id, "READY")
        self.client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step)])
        digest = mlflow_digest(dataset_digest) if dataset_digest else None
        dataset = dataset_name if digest else None
        for key, value in losses.items():
            if value is not None:
                self.client.log_metric(run_id, key, value, step=step, model_id=model.model_id, dataset_name=dataset,
                                       dataset_digest=digest)
        return model.model_id

    def log_external_model(self, ref: ArtifactRef, folder: Path) -> str:
        """A LoggedModel that points at weights living elsewhere (no copy): a folder or a store URI."""
        model = self.client.create_logged_model(
            self.experiment_id, name=f"{ref.name}-{ref.short}",
            tags={T.DIGEST: ref.digest, T.OUTPUT_URI: ref.uri, T.EXTERNAL_PATH: str(folder)},
            model_type="transformers-causal-lm")
        self.client.finalize_logged_model(model.model_id, "READY")
        return model.model_id

    def log_model_metric(self, run_id: str, key: str, value: float, step: int, model_id: str,
                         dataset: ArtifactRef, dataset_name: str) -> None:
        """A metric of one LoggedModel measured on one dataset (how the Models tab links them)."""
        self.client.log_metric(run_id, key, float(value), step=step, model_id=model_id,
                               dataset_name=dataset_name, dataset_digest=mlflow_digest(dataset.digest))

    def link_calibration(self, run_id: str, recipe_key: str, ref: ArtifactRef, registered_model: str,
                         model_ids: list[str], noise: dict[str, dict[str, Any]]) -> None:
        """A noise calibration in MLflow: its run carries the recipe key, the registered model and each metric's
        seed SD / item SE; the registered model and every seed's LoggedModel point at the artifact."""
        from mlflow.exceptions import MlflowException

        self.tag(run_id, {T.RECIPE_KEY: recipe_key, T.REGISTERED_MODEL: registered_model,
                          T.CALIBRATION_URI: ref.uri})
        self.log_metrics(run_id, {f"{k}_{name}": v[k] for name, v in noise.items()
                                  for k in ("seed_sd", "item_se", "n_seeds")})
        with contextlib.suppress(MlflowException):  # it exists already
            self.client.create_registered_model(registered_model)
        self.client.set_registered_model_tag(registered_model, T.calibration(recipe_key),
                                             json.dumps({"uri": ref.uri, "run_id": run_id,
                                                         "n_seeds": len(model_ids)}))
        for model_id in model_ids:
            self.client.set_logged_model_tags(model_id, {T.RECIPE_KEY: recipe_key, T.CALIBRATION_URI: ref.uri})

    def logged_model_tags(self, model_id: str) -> dict[str, str]:
        return dict(self.client.get_logged_model(model_id).tags)

    def download_model(self, model_id: str, dst: Path) -> None:
        """A LoggedModel's files (the HF folder) into ``dst``."""
        import mlflow.artifacts

        location = self.client.get_logged_model(model_id).artifact_location
        mlflow.artifacts.download_artifacts(artifact_uri=location, dst_path=str(dst), tracking_uri=self.tracking_uri)

    def log_eval(self, run_id: str, model_id: str, dataset_ref: ArtifactRef, metrics: dict[str, float],
                 dataset_name: str) -> None:
        """Eval metrics attached to the model and the dataset they were measured on."""
        self.client.log_inputs(run_id, models=[LoggedModelInput(model_id)])
        self.log_dataset_input(run_id, dataset_ref, "eval", name=dataset_name)
        for k, v in metrics.items():
            self.log_model_metric(run_id, k, v, 0, model_id, dataset_ref, dataset_name)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


class Registry:
    """The champion as an MLflow registered-model alias; its version tags say where the model lives."""

    def __init__(self, lineage: Lineage, name: str, alias: str = "champion") -> None:
        self.lineage, self.name, self.alias = lineage, name, alias
        self.client = lineage.client

    def champion(self) -> dict[str, str] | None:
        from mlflow.exceptions import MlflowException

        try:
            mv = self.client.get_model_version_by_alias(self.name, self.alias)
        except MlflowException:
            return None
        return {"version": str(mv.version), **(mv.tags or {})}

    def promote(self, model_id: str, tags: dict[str, str]) -> str:
        """Register the model as a new version and point the alias at it. Keeps model_id as a version tag
        because the registry does not link versions back to LoggedModels in every MLflow version."""
        from mlflow.exceptions import MlflowException

        with contextlib.suppress(MlflowException):  # it exists already
            self.client.create_registered_model(self.name)
        source = self.client.get_logged_model(model_id).artifact_location  # not models:/, which resolves
        mv = self.client.create_model_version(self.name, source=source, model_id=model_id,  # on the default URI
                                              tags={**tags, T.MODEL_ID: model_id})
        self.client.set_registered_model_alias(self.name, self.alias, mv.version)
        return str(mv.version)
