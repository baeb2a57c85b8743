"""A small flow over the data stages only (ingest -> tokenizer -> tokenize): the scale-out and concurrency
tests need the real stage tasks under a real flow, not training. ``python -m tests.integration.stage_flows
CONFIG.json`` runs it in its own process and prints the stage refs as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prefect import flow

from codemill.config import PipelineConfig
from codemill.flows.plan import plan_pipeline
from codemill.flows.run import open_run
from codemill.tasks.ingest import fingerprint_sources_task


@flow(name="data-stages", persist_result=True)
def data_stages(config: PipelineConfig) -> dict[str, dict]:
    with open_run(config, "data-stages", tag=False) as run:
        results = run.execute(plan_pipeline(config, fingerprint_sources_task(config.ingest), run.store, "tokenize"))
        run.finish(results)
    return {key: result.ref.model_dump() for key, result in results.items()}


if __name__ == "__main__":
    cfg = PipelineConfig.model_validate_json(Path(sys.argv[1]).read_text())
    print("RESULT " + json.dumps(data_stages(cfg)))
