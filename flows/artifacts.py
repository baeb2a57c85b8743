"""Prefect UI artifacts of a pipeline run: eval report + gate verdict, ingest counts, links, loss curve.

The loss curve is logged to MLflow (train stage run and parent run) as well; the Prefect image artifact
points at MLflow's proxied artifact URL when the tracking server is HTTP, else carries the PNG inline.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from prefect.artifacts import (
    create_image_artifact,
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)

from codemill.lineage import Lineage
from codemill.report import eval_report_markdown, ingest_table, loss_curve_png, skipped_suites
from codemill.store import ArtifactRef, ArtifactStore
from codemill.tasks.common import StageResult

LOSS_PNG = "loss_curve.png"


def mlflow_ui_links(tracking_uri: str, experiment_id: str, run_id: str, model_id: str | None) -> dict[str, str]:
    """Deep links into the MLflow UI; a sqlite/file URI is browsed with ``mlflow ui`` on its default port."""
    base = tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    links = {"MLflow run": f"{base}/#/experiments/{experiment_id}/runs/{run_id}"}
    if model_id:
        links["MLflow model"] = f"{base}/#/experiments/{experiment_id}/models/{model_id}"
    return links


def loss_curve(store: ArtifactStore, model: ArtifactRef) -> bytes:
    """A train artifact's loss curve as PNG, drawn once and kept in the store's cache folder: every later run of
    the same model logs the same picture, and matplotlib's import and the drawing cost a second of each rerun."""
    cached = store.cache_dir / "loss-curves" / f"{model.name}-{model.short}.png"
    if cached.is_file():
        return cached.read_bytes()
    with store.open_file(model, "train_summary.json", "r") as fh:
        summary = json.load(fh)
    png = loss_curve_png(summary["losses"], summary.get("val_losses"), f"training loss ({model.short})")
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(f".{cached.name}.{os.getpid()}")
    partial.write_bytes(png)
    os.replace(partial, cached)  # whole or absent, whoever else draws it at the same time
    return png


def publish_loss_curve(store: ArtifactStore, lineage: Lineage, model: StageResult, parent_run_id: str) -> None:
    publish_png(lineage, loss_curve(store, model.ref), LOSS_PNG, "loss-curve",
                "training loss per step (val at checkpoints)", parent_run_id, model.run_id)


def publish_png(lineage: Lineage, png: bytes, file_name: str, key: str, description: str, parent_run_id: str,
                stage_run_id: str | None = None) -> None:
    """A PNG on the parent run (and a stage run) in MLflow, and as a Prefect image artifact that points at it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / file_name
        path.write_bytes(png)
        for run_id in {stage_run_id or parent_run_id, parent_run_id}:
            lineage.log_artifact(run_id, path)
    uri = lineage.tracking_uri
    url = (f"{uri.rstrip('/')}/get-artifact?path={file_name}&run_uuid={parent_run_id}"
           if uri.startswith(("http://", "https://")) else f"data:image/png;base64,{base64.b64encode(png).decode()}")
    create_image_artifact(image_url=url, key=key, description=description)


def publish_run_artifacts(store: ArtifactStore, lineage: Lineage, parent_run_id: str, title: str,
                          stages: dict[str, StageResult], scores: dict[str, float],
                          verdict: dict[str, Any] | None) -> None:
    """Everything the Prefect UI shows for one run; each piece only when its stage ran in this run's reach."""
    if "ingest" in stages:
        create_table_artifact(ingest_table(store.read_manifest(stages["ingest"].ref).stats), key="ingest-stats",
                              description="ingest: files kept, rejected by reason, redactions, decontamination")
    model = stages.get("train")
    links = mlflow_ui_links(lineage.tracking_uri, lineage.experiment_id, parent_run_id,
                            model.model_id if model else None)
    for text, url in links.items():
        create_link_artifact(url, link_text=text, key=text.lower().replace(" ", "-"), description=text)
    if model is not None:
        publish_loss_curve(store, lineage, model, parent_run_id)
    costs = {k: (v.status, v.cost) for k, v in stages.items()}
    create_markdown_artifact(eval_report_markdown(title, scores, verdict, links, costs,
                                                  skipped_suites(stages)), key="eval-report",
                             description=f"run report (scores, gate: {verdict['verdict'] if verdict else 'not run'}, "
                                         "cost per stage)")
