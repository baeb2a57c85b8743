"""A small flow over the data stages only (ingest -> tokenizer -> tokenize): the scale-out and concurrency
tests need the real stage tasks under a real flow, not training. ``python -m tests.integration.stage_flows
CONFIG.json`` runs it in its own process and prints the stage refs as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prefect import flow
from prefect.runtime import flow_run

from codemill.config import PipelineConfig
from codemill.flows.common import open_flow_run, run_stage_task
from codemill.tasks.ingest import fingerprint_sources_task, ingest_task, plan_ingest
from codemill.tasks.tokenize import plan_tokenize, plan_tokenizer, tokenize_task, tokenizer_task


@flow(name="data-stages", persist_result=True)
def data_stages(config: PipelineConfig) -> dict[str, dict]:
    store, ctx, lineage = open_flow_run(config, flow_run.name or "data-stages", flow_run.id, None)
    sources = fingerprint_sources_task(config.ingest)
    corpus = run_stage_task(ingest_task, store, ref=plan_ingest(store, config.ingest, sources), ctx=ctx,
                            cfg=config.ingest, sources=sources)
    tokenizer = run_stage_task(tokenizer_task, store, ref=plan_tokenizer(store, config.tokenize, corpus.ref),
                               ctx=ctx, cfg=config.tokenize, corpus=corpus.ref)
    tokens = run_stage_task(tokenize_task, store, ref=plan_tokenize(store, config.tokenize, corpus.ref,
                                                                    tokenizer.ref),
                            ctx=ctx, cfg=config.tokenize, corpus=corpus.ref, tokenizer=tokenizer.ref)
    lineage.end_run(ctx.parent_run_id)
    return {"ingest": corpus.ref.model_dump(), "tokenizer": tokenizer.ref.model_dump(),
            "tokenize": tokens.ref.model_dump()}


if __name__ == "__main__":
    cfg = PipelineConfig.model_validate_json(Path(sys.argv[1]).read_text())
    print("RESULT " + json.dumps(data_stages(cfg)))
