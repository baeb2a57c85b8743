"""Browse the lineage chain (eval scores -> model -> training run -> tokens -> corpus -> sources) and compare two
models on the same eval items. Pure functions over ``MlflowClient`` + ``ArtifactStore``; rendering is separate.

A node is ``{"kind", "title", "attrs", "children"}``: the same structure renders as a rich Tree and as JSON.
The store's manifests are the chain (each names its inputs' digests); MLflow adds runs, metrics and models.
"""

from __future__ import annotations

from typing import Any

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from codemill.lineage import TAG_DIGEST, TAG_OUTPUT_DIGEST, TAG_STAGE
from codemill.store import MANIFEST, ArtifactStore, Manifest

Node = dict[str, Any]


class LineageError(LookupError):
    """An id that names nothing, or several things."""


def node(kind: str, title: str, attrs: dict[str, Any] | None = None, children: list[Node] | None = None) -> Node:
    return {"kind": kind, "title": title, "attrs": attrs or {}, "children": children or []}


# --- resolving an id ----------------------------------------------------------------------------------------
def find_artifacts(store: ArtifactStore, digest_prefix: str) -> list[Manifest]:
    """Committed artifacts of any stage whose digest starts with the prefix (directories carry 12 hex chars)."""
    prefix = digest_prefix.lower()
    pattern = f"{store.root}/*/*-{prefix[:12]}*/{MANIFEST}"
    found = []
    for path in store.fs.glob(pattern):
        with store.fs.open(path, "r") as fh:
            m = Manifest.model_validate_json(fh.read())
        if m.digest.startswith(prefix):
            found.append(m)
    return found


def resolve_artifact(store: ArtifactStore, digest_prefix: str) -> Manifest:
    if len(digest_prefix) < 6 or any(c not in "0123456789abcdef" for c in digest_prefix.lower()):
        raise LineageError(f"{digest_prefix!r} is not a model id, a run id, or a digest prefix (>= 6 hex chars)")
    found = find_artifacts(store, digest_prefix)
    if not found:
        raise LineageError(f"no artifact with digest {digest_prefix!r} in the store {store.root_url}")
    if len({m.digest for m in found}) > 1:
        names = ", ".join(f"{m.stage}:{m.name}-{m.digest[:16]}" for m in found)
        raise LineageError(f"digest prefix {digest_prefix!r} is ambiguous: {names}")
    return found[0]


def _model_of_digest(client: MlflowClient, digest: str) -> str | None:
    exps = [e.experiment_id for e in client.search_experiments()]
    found = client.search_logged_models(exps, filter_string=f"tags.`{TAG_DIGEST}` = '{digest}'", max_results=1)
    return found[0].model_id if found else None


def _get_run(client: MlflowClient, run_id: str):
    try:
        return client.get_run(run_id)
    except MlflowException:
        return None


def _get_model(client: MlflowClient, model_id: str):
    try:
        return client.get_logged_model(model_id)
    except MlflowException as e:
        raise LineageError(f"no LoggedModel {model_id!r} on {client.tracking_uri}") from e


def resolve(client: MlflowClient, store: ArtifactStore, ident: str) -> tuple[str, str]:
    """('model', model_id) or ('artifact', digest) for a LoggedModel id, an MLflow run id, or a digest."""
    ident = ident.strip()
    if ident.startswith("m-"):
        return "model", _get_model(client, ident).model_id
    run = _get_run(client, ident) if len(ident) == 32 else None
    if run is not None:
        tags = run.data.tags
        if "codemill.model_id" in tags:  # pipeline/evaluate parent, train and evaluate stage runs
            return "model", tags["codemill.model_id"]
        if TAG_OUTPUT_DIGEST in tags:
            return "artifact", tags[TAG_OUTPUT_DIGEST]
        raise LineageError(f"MLflow run {ident} is no codemill run (no codemill.model_id / output_digest tag)")
    m = resolve_artifact(store, ident)
    if m.stage == "train":
        model_id = _model_of_digest(client, m.digest)
        return ("model", model_id) if model_id else ("artifact", m.digest)
    if m.stage == "evaluate" and m.stats.get("model_id"):
        return "model", m.stats["model_id"]
    return "artifact", m.digest


# --- building the tree --------------------------------------------------------------------------------------
def _stage_run(client: MlflowClient, experiment_ids: list[str], stage: str, digest: str):
    runs = client.search_runs(experiment_ids, filter_string=f"tags.`{TAG_OUTPUT_DIGEST}` = '{digest}' and "
                                                            f"tags.`{TAG_STAGE}` = '{stage}'",
                              max_results=1, order_by=["attributes.start_time ASC"])
    return runs[0] if runs else None


def _manifest(store: ArtifactStore, digest: str) -> Manifest | None:
    found = [m for m in find_artifacts(store, digest) if m.digest == digest]
    return found[0] if found else None


def _sources(m: Manifest, run) -> list[Node]:
    """The ingest's sources: from the manifest (root, repo, kind, fingerprint, commit), else the run's tags."""
    keys = ("root", "repo", "kind", "fingerprint", "commit")
    rows = m.stats.get("source_fingerprints") or []
    if not rows and run is not None:
        tags = run.data.tags
        i = 0
        while f"codemill.source.{i}.root" in tags:
            rows.append({k: tags.get(f"codemill.source.{i}.{k}") for k in keys})
            i += 1
    return [node("source", str(s.get("root")), {k: s.get(k) for k in keys if s.get(k) is not None}) for s in rows]


def artifact_tree(client: MlflowClient, store: ArtifactStore, digest: str, experiment_ids: list[str],
                  seen: set[str] | None = None, role: str | None = None) -> Node:
    """One artifact with its producing run, then its inputs, recursively (each artifact expanded once)."""
    seen = set() if seen is None else seen
    m = _manifest(store, digest)
    if m is None:
        return node(role or "artifact", f"{role or 'artifact'} {digest[:12]} (not in the store)", {"digest": digest})
    run = _stage_run(client, experiment_ids, m.stage, digest)
    attrs = {"stage": m.stage, "name": m.name, "digest": m.digest, "uri": m.uri, "code_version": m.code_version,
             "run_id": run.info.run_id if run else None}
    title = f"{role or m.stage} {m.stage}:{m.name}-{m.digest[:12]}"
    if digest in seen:
        return node(role or m.stage, f"{title} (shown above)", attrs)
    seen.add(digest)
    if m.stage == "ingest":
        children = _sources(m, run)
    else:
        children = [artifact_tree(client, store, d, experiment_ids, seen, role=name) for name, d in m.inputs.items()]
    return node(role or m.stage, title, attrs, children)


def _metric_nodes(model) -> list[Node]:
    """One node per metric of the model (its CI bounds, logged as <key>_ci_low/_ci_high, folded in)."""
    by_key = {(x.key, x.run_id): x for x in model.metrics or []}
    out = []
    for (key, run_id), x in sorted(by_key.items()):
        if "_ci_" in key:
            continue
        attrs = {"key": key, "value": x.value, "step": x.step, "dataset_name": x.dataset_name,
                 "dataset_digest": x.dataset_digest, "run_id": run_id}
        ci = ""
        low, high = by_key.get((f"{key}_ci_low", run_id)), by_key.get((f"{key}_ci_high", run_id))
        if low is not None and high is not None:
            attrs["ci_low"], attrs["ci_high"] = low.value, high.value
            ci = f" [{attrs['ci_low']:.4f}, {attrs['ci_high']:.4f}]"
        out.append(node("metric", f"{key} = {x.value:.4f}{ci} on {x.dataset_name}@{x.dataset_digest} (run {run_id})",
                        attrs))
    return out


def _champion_of(client: MlflowClient, model_id: str) -> list[str]:
    """'name@alias v<version>' for every registry alias whose version is this model."""
    out = []
    try:
        for rm in client.search_registered_models():
            for alias, version in (rm.aliases or {}).items():
                mv = client.get_model_version(rm.name, version)
                if (mv.tags or {}).get("codemill.model_id") == model_id or mv.model_id == model_id:
                    out.append(f"{rm.name}@{alias} v{version}")
    except MlflowException:
        return out
    return out


def model_tree(client: MlflowClient, store: ArtifactStore, model_id: str) -> Node:
    model = _get_model(client, model_id)
    exps = [model.experiment_id]
    digest = model.tags.get(TAG_DIGEST)
    attrs = {"model_id": model.model_id, "name": model.name, "digest": digest, "status": str(model.status),
             "uri": model.tags.get("codemill.output_uri"), "source_run_id": model.source_run_id,
             "experiment_id": model.experiment_id, "registered": _champion_of(client, model.model_id)}
    scores = node("evals", "eval scores", {}, _metric_nodes(model))
    checkpoint = artifact_tree(client, store, digest, exps, role="checkpoint") if digest else \
        node("checkpoint", "checkpoint (no codemill.digest tag)")
    if model.source_run_id:
        run = _get_run(client, model.source_run_id)
        train = node("training_run", f"training run {model.source_run_id}",
                     {"run_id": model.source_run_id, "status": run.info.status if run else None,
                      "metrics": dict(run.data.metrics) if run else {}}, checkpoint["children"])
        checkpoint["children"] = [train]
    return node("model", f"model {model.model_id} ({model.name})", attrs, [scores, checkpoint])


def lineage_tree(client: MlflowClient, store: ArtifactStore, ident: str) -> Node:
    kind, value = resolve(client, store, ident)
    if kind == "model":
        return model_tree(client, store, value)
    return artifact_tree(client, store, value, [e.experiment_id for e in client.search_experiments()])


def render(tree: Node):
    """A rich Tree of the node structure (attrs shown under each title)."""
    from rich.tree import Tree

    def add(parent, n: Node) -> None:
        branch = parent.add(n["title"] if n["kind"] == "metric" else f"[bold]{n['title']}[/]")
        if n["kind"] != "metric" and not n["title"].endswith("(shown above)"):
            fill(branch, n)

    def fill(branch, n: Node) -> None:
        for k, v in n["attrs"].items():
            if v not in (None, "", [], {}) and k not in ("metrics", "stage", "name", "model_id"):
                branch.add(f"[dim]{k}[/]: {v}")
        for child in n["children"]:
            add(branch, child)

    root = Tree(f"[bold]{tree['title']}[/]")
    fill(root, tree)
    return root


# --- comparing two models -----------------------------------------------------------------------------------
def eval_artifacts(client: MlflowClient, store: ArtifactStore, model_id: str) -> dict[str, list[Manifest]]:
    """suite -> committed eval artifacts of this model (newest first), found through its evaluate runs."""
    model = _get_model(client, model_id)
    runs = client.search_runs([model.experiment_id], filter_string=f"tags.`codemill.model_id` = '{model_id}' and "
                                                                   f"tags.`{TAG_STAGE}` = 'evaluate'",
                              order_by=["attributes.start_time DESC"])
    out: dict[str, list[Manifest]] = {}
    seen: set[str] = set()
    for run in runs:
        digest = run.data.tags.get(TAG_OUTPUT_DIGEST)
        m = _manifest(store, digest) if digest and digest not in seen else None
        if m is not None:
            seen.add(digest)
            out.setdefault(m.name, []).append(m)
    return out


def _paired(a: list[Manifest], b: list[Manifest]) -> tuple[Manifest, Manifest] | None:
    """The newest pair of evaluations of one suite on the same data with the same suite config."""
    for ma in a:
        for mb in b:
            if ma.inputs.get("data") == mb.inputs.get("data") and ma.config == mb.config:
                return ma, mb
    return None


def compare_models(client: MlflowClient, store: ArtifactStore, model_a: str, model_b: str,
                   alpha: float = 0.05) -> dict[str, Any]:
    """The gate's paired comparison (a = candidate, b = reference) on every metric both were evaluated on."""
    import polars as pl

    from codemill.evals import suites
    from codemill.evals.gate import GateMetric, gate

    ea, eb = eval_artifacts(client, store, model_a), eval_artifacts(client, store, model_b)
    scores_a, scores_b, used = {}, {}, {}
    for suite in sorted(set(ea) & set(eb)):
        pair = _paired(ea[suite], eb[suite])
        if pair is None:
            continue
        rows = [pl.read_parquet(store.local_path(store.ref(m.stage, m.name, m.digest)) / suites.rows_file(suite))
                for m in pair]
        scores_a |= suites.item_scores(suite, rows[0])
        scores_b |= suites.item_scores(suite, rows[1])
        used[suite] = {"a": pair[0].digest, "b": pair[1].digest, "data": pair[0].inputs.get("data")}
    common = sorted(set(scores_a) & set(scores_b))
    if not common:
        raise LineageError(f"{model_a} and {model_b} have no evaluation of one suite on the same data and config "
                           f"(suites evaluated: a {sorted(ea)}, b {sorted(eb)})")
    verdict = gate(scores_a, scores_b, [GateMetric(name) for name in common], alpha)
    return {"model_a": model_a, "model_b": model_b, "alpha": alpha, "verdict": verdict.verdict,
            "reason": verdict.reason, "evaluations": used, "metrics": verdict.as_dict()["metrics"]}


def render_comparison(result: dict[str, Any]):
    from rich.table import Table

    table = Table(title=f"{result['model_a']} (a) vs {result['model_b']} (b), paired on the same items")
    for col in ("metric", "a", "b", "diff (+ = a better)", "95% CI", "SE", "p a worse", "p a better", "n items",
                "clusters"):
        table.add_column(col)
    for e in result["metrics"]:
        table.add_row(e["metric"], f"{e['candidate']:.4f}", f"{e['champion']:.4f}", f"{e['diff']:+.4f}",
                      f"[{e['ci_low']:+.4f}, {e['ci_high']:+.4f}]", f"{e['se']:.4f}", f"{e['p_regression']:.3g}",
                      f"{e['p_improvement']:.3g}", str(e["n_items"]), str(e["n_clusters"]))
    table.caption = (f"{result['verdict']}: {result['reason']} "
                     f"(alpha {result['alpha']}; the verdict uses Holm-corrected p)")
    return table
