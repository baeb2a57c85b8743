"""Shared by the pipeline and evaluate flows: run the configured suites, then gate against the champion."""

from __future__ import annotations

from typing import Any

from codemill.config import PipelineConfig
from codemill.flows.common import run_stage_task
from codemill.lineage import Registry
from codemill.store import ArtifactRef, ArtifactStore
from codemill.tasks.common import RunContext, StageResult
from codemill.tasks.evaluate import evaluate_suite_task, plan_suite, suite_dataset
from codemill.tasks.gate import gate_task
from codemill.tasks.models import ResolvedModel, resolve_model


def evaluate_model(ctx: RunContext, store: ArtifactStore, config: PipelineConfig, model: ResolvedModel,
                   corpus: ArtifactRef | None, samples_file: str | None = None) -> dict[str, StageResult]:
    out = {}
    for suite in config.evaluate.suites:
        data = suite_dataset(suite, corpus)
        ref = plan_suite(store, suite, config.evaluate, model.ref, data, samples_file if suite == "humaneval"
                         else None)
        out[suite] = run_stage_task(evaluate_suite_task, store, ref=ref, ctx=ctx, suite=suite,
                                    cfg=config.evaluate, model=model, corpus=corpus,
                                    samples_file=samples_file if suite == "humaneval" else None)
    return out


def gate_against_champion(ctx: RunContext, store: ArtifactStore, config: PipelineConfig, model: ResolvedModel,
                          corpus: ArtifactRef | None, evals: dict[str, StageResult]) -> dict[str, Any] | None:
    if not config.gate.enabled:
        return None
    name = config.gate.registered_model or config.name
    champion = Registry(ctx.lineage(), name, config.gate.alias).champion()
    champion_evals = None
    if champion and champion.get("codemill.model_id") != model.model_id:
        champ_model = resolve_model(ctx, champion["codemill.model_id"])
        champion_evals = evaluate_model(ctx, store, config, champ_model, corpus)
    return gate_task(ctx=ctx, cfg=config.gate, registered_model=name, candidate=model, candidate_evals=evals,
                     champion=champion, champion_evals=champion_evals)


def scores_of(evals: dict[str, StageResult]) -> dict[str, float]:
    out: dict[str, float] = {}
    for result in evals.values():
        out |= {k: v for k, v in result.summary.items() if isinstance(v, float)}
    return out
