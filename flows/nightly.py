"""The ``nightly`` flow: re-ingest (unchanged chunks are reused), tokenize, fine-tune from the current
champion (or from ``train.init_from`` / scratch on the first night), evaluate, gate, promote.

Fine-tuning from the champion reuses its tokenizer (the pipeline takes the base model's tokenizer whenever
``train.init_from`` is set), so token ids stay compatible night after night.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from codemill.config import PipelineConfig
from codemill.flows.hooks import record_failure_on_mlflow, run_name_from
from codemill.flows.pipeline import run_pipeline
from codemill.lineage import Registry
from codemill.lineage import tags as T
from codemill.tasks.common import RunContext
from codemill.tasks.resolve_model import resolve_model


def champion_start(config: PipelineConfig) -> str | None:
    """The champion's HF folder (local), or None when there is no champion yet."""
    ctx = RunContext(store_root=config.store_root, work_dir=config.work_dir,
                     tracking_uri=config.mlflow_tracking_uri, experiment=config.name)
    champion = Registry(ctx.lineage(), config.gate.registered_model or config.name, config.gate.alias).champion()
    if not champion or T.MODEL_ID not in champion:
        return None
    return resolve_model(ctx, champion[T.MODEL_ID]).hf_dir


def _run_name() -> str:
    return run_name_from("nightly", flow_run.parameters)


@flow(name="nightly", flow_run_name=_run_name, persist_result=True, log_prints=True,
      on_failure=[record_failure_on_mlflow], on_crashed=[record_failure_on_mlflow])
def nightly(config: PipelineConfig = PipelineConfig(), from_champion: bool = True) -> dict[str, Any]:  # noqa: B008
    """Nightly retrain. ``from_champion``: start from the promoted champion's weights when there is one."""
    logger = get_run_logger()
    start = champion_start(config) if from_champion else None
    if start:
        logger.info("fine-tuning from the champion at %s", start)
        config = config.model_copy(update={"train": config.train.model_copy(update={"init_from": start})})
    else:
        logger.info("no champion yet: starting from %s", config.train.init_from or "scratch")
    return run_pipeline(config, "evaluate", "nightly")
