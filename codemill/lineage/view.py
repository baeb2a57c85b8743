"""Browse the lineage chain (eval scores -> model -> training run -> tokens -> corpus -> sources) and compare two
models on the same eval items. Pure functions over ``MlflowClient`` + ``ArtifactStore``; rendering is separate.

A node is ``{"kind", "title", "attrs", "children"}``: the same structure renders as a rich Tree and as JSON.
The store's manifests are the chain (each names its inputs' digests); MLflow adds runs, metrics and models.
"""

from __future__ import annotations

from typing import Any

from codemill.lineage import tags as T
from codemill.lineage.read import LineageError, LineageReader
from codemill.store import MANIFEST, ArtifactStore, Manifest

Node = dict[str, Any]


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


def resolve(reader: LineageReader, store: ArtifactStore, ident: str) -> tuple[str, str]:
    """('model', model_id) or ('artifact', digest) for a LoggedModel id, an MLflow run id, or a digest."""
    ident = ident.strip()
    if ident.startswith("m-"):
        return "model", reader.model(ident).model_id
    run = reader.run(ident) if len(ident) == 32 else None
    if run is not None:
        tags = run.data.tags
        if T.MODEL_ID in tags:  # pipeline/evaluate parent, train and evaluate stage runs
            return "model", tags[T.MODEL_ID]
        if T.OUTPUT_DIGEST in tags:
            return "artifact", tags[T.OUTPUT_DIGEST]
        raise LineageError(f"MLflow run {ident} is no codemill run (no codemill.model_id / output_digest tag)")
    m = resolve_artifact(store, ident)
    if m.stage in ("train", "policy"):  # weights: the LoggedModel, with its scores
        model_id = reader.model_of_digest(m.digest)
        return ("model", model_id) if model_id else ("artifact", m.digest)
    if m.stage == "evaluate" and m.stats.get("model_id"):
        return "model", m.stats["model_id"]
    return "artifact", m.digest


# --- building the tree --------------------------------------------------------------------------------------
REPO_TASKS = "repo_tasks"


def manifest_of(store: ArtifactStore, digest: str) -> Manifest | None:
    found = [m for m in find_artifacts(store, digest) if m.digest == digest]
    return found[0] if found else None


def _sources(m: Manifest, run) -> list[Node]:
    """The ingest's sources: from the manifest (root, repo, kind, fingerprint, commit), else the run's tags."""
    keys = T.SOURCE_KEYS
    rows = m.stats.get("source_fingerprints") or []
    if not rows and run is not None:
        tags = run.data.tags
        i = 0
        while T.source(i, "root") in tags:
            rows.append({k: tags.get(T.source(i, k)) for k in keys})
            i += 1
    return [node("source", str(s.get("root")), {k: s.get(k) for k in keys if s.get(k) is not None}) for s in rows]


def artifact_tree(reader: LineageReader, store: ArtifactStore, digest: str, experiment_ids: list[str],
                  seen: set[str] | None = None, role: str | None = None) -> Node:
    """One artifact with its producing run, then its inputs, recursively (each artifact expanded once)."""
    seen = set() if seen is None else seen
    m = manifest_of(store, digest)
    if m is None:
        return _outside_the_store(reader, digest, role)
    run = reader.stage_run(experiment_ids, m.stage, digest)
    attrs = {"stage": m.stage, "name": m.name, "digest": m.digest, "uri": m.uri, "code_version": m.code_version,
             "run_id": run.info.run_id if run else None}
    title = f"{role or m.stage} {m.stage}:{m.name}-{m.digest[:12]}"
    if digest in seen:
        return node(role or m.stage, f"{title} (shown above)", attrs)
    seen.add(digest)
    if m.stage == "ingest":
        children = _sources(m, run)
    elif m.stage == REPO_TASKS:
        children = _repo_sources(store, m)
    else:
        problem_sources = {s.get("fingerprint"): s for s in m.stats.get("source_fingerprints") or []} \
            if m.stage == "problems" else {}
        children = [_problem_source(problem_sources[d]) if name.startswith("source.") and d in problem_sources
                    else artifact_tree(reader, store, d, experiment_ids, seen, role=name)
                    for name, d in m.inputs.items()]
        if m.stage == "problems":  # generated sources have no file to fingerprint: their config is the source
            children += [node("source", f"synthetic seed={src.get('seed')} count={src.get('count')}", src)
                         for src in m.config.get("sources", []) if src.get("kind") == "synthetic"]
    return node(role or m.stage, title, attrs, children)


def _repo_sources(store: ArtifactStore, m: Manifest) -> list[Node]:
    """A task set's sources down to the commits its tasks start from: each synthesis repository at its resolved
    commit, each imported file with the repositories and base commits its rows name."""
    from codemill.repos.task import read_tasks

    tasks_file = store.local_path(store.ref(m.stage, m.name, m.digest)) / "tasks.parquet"
    imported = sorted({(t.repo, t.base_commit) for t in read_tasks(tasks_file) if t.source == "import"}) \
        if tasks_file.is_file() else []
    out = []
    for name, digest in m.inputs.items():
        uri = m.input_uris.get(name, "")
        if name.endswith(".import"):
            commits = [node("repository", f"{repo}@{commit}", {"repo": repo, "commit": commit})
                       for repo, commit in imported]
            out.append(node("source", f"tasks file {uri} (sha256 {digest[:12]})",
                            {"uri": uri, "fingerprint": digest}, commits))
        else:
            repo = name.split(".", 2)[-1]
            out.append(node("repository", f"{repo}@{digest} ({uri})", {"repo": repo, "commit": digest, "uri": uri}))
    return out


def _problem_source(s: dict[str, Any]) -> Node:
    return node("source", str(s.get("root")), {k: s.get(k) for k in ("name", "kind", "root", "fingerprint")})


def _outside_the_store(reader: LineageReader, digest: str, role: str | None) -> Node:
    """An input that is no store artifact: weights known to MLflow (an HF folder RL or an evaluation started
    from), else just its digest."""
    model_id = reader.model_of_digest(digest)
    if model_id is not None:
        tags = reader.model(model_id).tags
        where = tags.get(T.EXTERNAL_PATH) or tags.get(T.OUTPUT_URI)
        return node(role or "model", f"{role or 'model'} {model_id} (weights outside the store: {where})",
                    {"model_id": model_id, "digest": digest, "uri": where})
    return node(role or "artifact", f"{role or 'artifact'} {digest[:12]} (not in the store)", {"digest": digest})


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


def model_tree(reader: LineageReader, store: ArtifactStore, model_id: str) -> Node:
    model = reader.model(model_id)
    exps = [model.experiment_id]
    digest = model.tags.get(T.DIGEST)
    attrs = {"model_id": model.model_id, "name": model.name, "digest": digest, "status": str(model.status),
             "uri": model.tags.get(T.OUTPUT_URI), "source_run_id": model.source_run_id,
             "experiment_id": model.experiment_id, "registered": reader.aliases_of(model.model_id)}
    scores = node("evals", "eval scores", {}, _metric_nodes(model))
    checkpoint = artifact_tree(reader, store, digest, exps, role="checkpoint") if digest else \
        node("checkpoint", "checkpoint (no codemill.digest tag)")
    if model.source_run_id:
        run = reader.run(model.source_run_id)
        train = node("training_run", f"training run {model.source_run_id}",
                     {"run_id": model.source_run_id, "status": run.info.status if run else None,
                      "metrics": dict(run.data.metrics) if run else {}}, checkpoint["children"])
        checkpoint["children"] = [train]
    return node("model", f"model {model.model_id} ({model.name})", attrs, [scores, checkpoint])


def lineage_tree(reader: LineageReader, store: ArtifactStore, ident: str) -> Node:
    kind, value = resolve(reader, store, ident)
    if kind == "model":
        return model_tree(reader, store, value)
    return artifact_tree(reader, store, value, reader.experiment_ids())


HEX_DIGEST = 64  # a sha256: shown as its first 12 hex, as the store's folder names carry it (a prefix resolves)


def _shown(key: str, value: Any, store_root: str) -> str:
    """An attribute's value as the tree shows it: sha256 digests shortened, store URIs under the store root."""
    from codemill.layout import DIGEST_CHARS, relative_to

    text = str(value)
    if len(text) == HEX_DIGEST and all(c in "0123456789abcdef" for c in text):
        return text[:DIGEST_CHARS]
    return relative_to(text, store_root) if key == "uri" else text


def _scores_label(metrics: list[Node], width: int) -> str:
    """The eval scores as one table (metric, value, 95% CI) under a heading per eval run: the run that logged
    them and the dataset; the CI column is left out where it does not fit ``width``."""
    from codemill.layout import Column, ci, first_fitting, num, table

    groups: dict[str, list[dict[str, Any]]] = {}
    for m in metrics:
        a = m["attrs"]
        on = f" on {a['dataset_name']}@{_shown('digest', a.get('dataset_digest'), '')}" if a.get("dataset_name") \
            else ""
        groups.setdefault(f"run {a.get('run_id')}{on}", []).append(a)
    heads = [(head, len(rows)) for head, rows in groups.items()]
    attrs = [a for rows in groups.values() for a in rows]

    def form(with_ci: bool) -> list[str]:
        cols = [Column("metric"), Column("value", ">"), *([Column("95% CI")] if with_ci else [])]
        body = table(cols, [[a["key"], num(a["value"]),
                             *([ci(a["ci_low"], a["ci_high"]) if "ci_low" in a else ""] if with_ci else [])]
                            for a in attrs], indent="  ")
        lines, at = ["eval scores", body[0]], 1
        for head, n in heads:
            lines += [head, *body[at:at + n]]
            at += n
        return lines

    return "\n".join(first_fitting([lambda: form(True), lambda: form(False)], width))


def render(tree: Node, width: int = 80, store_root: str = ""):
    """A rich Tree of the node structure (attrs shown under each title) whose lines fit ``width``: digests as
    12 hex, store URIs under ``store_root`` (printed once above the tree), each eval run's metrics under it
    (with 95% CIs); a label longer than its room wraps at a space, never inside a word."""
    from rich.console import Group
    from rich.text import Text
    from rich.tree import Tree

    from codemill.layout import wrap

    guide = 4  # the cells each level of a rich Tree indents by

    def label(text: str, depth: int, bold: bool = False) -> Text:
        return Text("\n".join(wrap(text, max(width - guide * depth, 20))), style="bold" if bold else "")

    def add(parent, n: Node, depth: int) -> None:
        branch = parent.add(label(n["title"], depth, bold=True))
        if not n["title"].endswith("(shown above)"):
            fill(branch, n, depth + 1)

    def fill(branch, n: Node, depth: int) -> None:
        for k, v in n["attrs"].items():
            if v not in (None, "", [], {}) and k not in ("metrics", "stage", "name", "model_id"):
                branch.add(label(f"{k}: {_shown(k, v, store_root)}", depth))
        for child in n["children"]:
            if child["kind"] == "evals" and child["children"]:
                branch.add(Text(_scores_label(child["children"], width - guide * depth)))
            else:
                add(branch, child, depth)

    root = Tree(label(tree["title"], 0, bold=True))
    fill(root, tree, 1)
    head = [Text("\n".join(wrap(f"store: {store_root}", width)))] if store_root else []
    return Group(*head, root)
