"""``codemill compare``: two models' evaluations paired item by item, judged by the gate: the same two steps
as the gate task (``gate.evidence.collect``, then ``gate.policy.decide``), with a as the candidate and b as the
reference. This module finds the evaluations through the lineage; the gate package is pure.

Evaluations pair when they scored one suite on the same data with the same hashed config (the manifest's
``config`` is exactly what the eval digest hashed, so two runs that differed only in which other suites ran
beside them still pair). The seed noise of b's recipe is found as the gate finds the champion's
(``gate.calibration.noise_source``: a calibration in the store, else a preset's shipped noise); otherwise the
comparison is uncalibrated, as in the gate."""

from __future__ import annotations

from typing import Any

import polars as pl

from codemill.evals import suites
from codemill.evals.stats import ItemScores
from codemill.gate.calibration import noise_source
from codemill.gate.evidence import GateMetric, collect
from codemill.gate.policy import decide
from codemill.lineage import tags as T
from codemill.lineage.read import LineageError, LineageReader
from codemill.lineage.view import manifest_of
from codemill.store import ArtifactStore, Manifest


def eval_artifacts(reader: LineageReader, store: ArtifactStore, model_id: str) -> dict[str, list[Manifest]]:
    """suite -> committed eval artifacts of this model (newest first), found through its evaluate runs."""
    model = reader.model(model_id)
    out: dict[str, list[Manifest]] = {}
    seen: set[str] = set()
    for run in reader.eval_runs(model.experiment_id, model_id):
        digest = run.data.tags.get(T.OUTPUT_DIGEST)
        m = manifest_of(store, digest) if digest and digest not in seen else None
        if m is not None:
            seen.add(digest)
            out.setdefault(m.name, []).append(m)
    return out


def paired(a: list[Manifest], b: list[Manifest]) -> tuple[Manifest, Manifest] | None:
    """The newest pair of evaluations of one suite with the same suite config and the same inputs besides the
    model (the data, and e.g. HumanEval's augmented tests or a samples file)."""
    def others(m: Manifest) -> dict[str, Any]:
        return {k: v for k, v in m.inputs.items() if k != "model"}

    for ma in a:
        for mb in b:
            if others(ma) == others(mb) and ma.config == mb.config:
                return ma, mb
    return None


def compare_models(reader: LineageReader, store: ArtifactStore, model_a: str, model_b: str,
                   alpha: float = 0.05) -> dict[str, Any]:
    """The gate's paired comparison (a = candidate, b = reference) on every metric both were evaluated on."""
    ea, eb = eval_artifacts(reader, store, model_a), eval_artifacts(reader, store, model_b)
    scores_a: dict[str, ItemScores] = {}
    scores_b: dict[str, ItemScores] = {}
    used: dict[str, dict[str, Any]] = {}
    eval_config: dict[str, Any] = {}  # as EvalConfig.digest_config() has it, from b's eval manifests
    side_by_side: dict[str, Any] = {}  # suite -> what it keeps of the pair (``Suite.side_by_side``)
    for suite in sorted(set(ea) & set(eb)):
        pair = paired(ea[suite], eb[suite])
        if pair is None:
            continue
        rows = [pl.read_parquet(store.local_path(store.ref(m.stage, m.name, m.digest)) / suites.rows_file(suite))
                for m in pair]
        scores_a |= suites.item_scores(suite, rows[0])
        scores_b |= suites.item_scores(suite, rows[1])
        used[suite] = {"a": pair[0].digest, "b": pair[1].digest, "data": pair[0].inputs.get("data")}
        eval_config |= {suite: pair[1].config.get("suite"), "seed": pair[1].config.get("seed")}
        show = suites.get(suite).side_by_side
        if show is not None:
            side_by_side[suite] = show(pair[0], pair[1])
    common = sorted(set(scores_a) & set(scores_b))
    if not common:
        raise LineageError(f"{model_a} and {model_b} have no evaluation of one suite on the same data and config "
                           f"(suites evaluated: a {sorted(ea)}, b {sorted(eb)})")
    noise = noise_source(store, reader.model(model_b).tags.get(T.DIGEST), eval_config, common)
    verdict = decide(collect([scores_a], scores_b, [GateMetric(name) for name in common], noise), alpha)
    return {"model_a": model_a, "model_b": model_b, "alpha": alpha, "verdict": verdict.verdict,
            "reason": verdict.reason, "calibrated": verdict.calibrated, "calibration": verdict.calibration,
            "evaluations": used, "metrics": verdict.as_dict()["metrics"],
            **side_by_side}


def render_comparison(result: dict[str, Any], width: int = 80):
    """Plain lines of ``width`` columns at most (a table of ten columns collapses to "comp…" in a log)."""
    from rich.text import Text

    from codemill.report import comparison_text

    return Text(comparison_text(result, width))
