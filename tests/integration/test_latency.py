"""The latency suite on a tiny HF model: what is timed, that the timed loop decodes what the engine decodes,
and that a rerun on the same machine is a cache hit. No timing thresholds: only that the numbers are sane."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from codemill.store import ArtifactRef, ArtifactStore
from tests.integration.helpers import small_pipeline_config
from tests.tiny_policy import make_policy

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]
PROMPTS, NEW_TOKENS, WARMUP = 4, 8, 2


def _config(corpus: Path, tmp: Path):
    cfg = small_pipeline_config(corpus, tmp)
    cfg.evaluate.suites = ["latency"]
    cfg.evaluate.completion.max_files = 12
    cfg.evaluate.latency.prompts = PROMPTS
    cfg.evaluate.latency.max_new_tokens = NEW_TOKENS
    cfg.evaluate.latency.warmup_prompts = WARMUP
    cfg.gate.enabled = False
    return cfg


class CountingProbe:
    """The transformers probe, counting its calls (the model is real)."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0

    def measure(self, prompt_ids, new_tokens):
        self.calls += 1
        return self.inner.measure(prompt_ids, new_tokens)

    def info(self):
        return self.inner.info()


def test_latency_suite_times_the_tokens_generate_would_decode_and_caches_per_machine(small_corpus, tmp_path):
    import torch

    from codemill.evals import latency as lat
    from codemill.evals import suites
    from codemill.evals.suites.base import load_eval_model
    from codemill.flows.evaluate import evaluate
    from codemill.flows.pipeline import pipeline
    from codemill.models.engines import RolloutParams

    cfg = _config(small_corpus, tmp_path)
    hf = make_policy(tmp_path / "policy")
    ingested = pipeline(config=cfg, until="ingest")
    corpus = ArtifactRef.model_validate(ingested["stages"]["ingest"]["ref"]).uri
    out = evaluate(model=str(hf), config=cfg, corpus=corpus)

    stage = out["stages"]["eval:latency"]
    assert stage["status"] == "ran"
    store = ArtifactStore(cfg.store_root)
    ref = ArtifactRef.model_validate(stage["ref"])
    manifest = store.read_manifest(ref)
    rows = pl.read_parquet(store.local_path(ref) / suites.rows_file("latency"))
    stats = manifest.stats

    # exactly the timed prompts, each with exactly max_new_tokens timed tokens (warm-up not among them)
    assert rows.height == PROMPTS == stats["prompts"] and rows["item_id"].n_unique() == PROMPTS
    assert rows["new_tokens"].to_list() == [NEW_TOKENS] * PROMPTS
    assert all(len(ids) == NEW_TOKENS for ids in rows["output_ids"].to_list())
    assert (rows["ttft_ms"] > 0).all() and (rows["per_token_mean_ms"] > 0).all()
    assert (rows["prompt_tokens"] <= cfg.evaluate.completion.context_len - NEW_TOKENS).all()
    s = out["scores"]
    assert s["latency_ttft_p95_ms"] >= s["latency_ttft_p50_ms"] > 0
    assert s["latency_per_token_p95_ms"] >= s["latency_per_token_p50_ms"] > 0 and s["latency_tokens_per_s"] > 0
    # what it ran on is recorded, and the machine is what the digest hashed
    assert stats["engine"] == "transformers" and stats["engine_version"] and stats["torch"] == torch.__version__
    lc = cfg.evaluate.latency
    assert stats["device"] == "cpu" and stats["dtype"] == "float32" and stats["threads"] == lc.threads == 1
    assert stats["batch_size"] == 1
    assert manifest.config["machine"] == stats["machine"] == lat.machine_identity(lc.label, lc.threads)
    assert stage["summary"]["device"] == "cpu"

    # the timed loop decodes greedily what the evaluation engine decodes (no stop: the same number of tokens)
    m = load_eval_model(hf)
    items = {it.item_id: it for it in _items(cfg, store.local_path(ArtifactRef.model_validate(
        ingested["stages"]["ingest"]["ref"])))}
    prompts = [items[i].prefix for i in rows["item_id"].to_list()]
    with m.engine(1, cfg.evaluate.completion.context_len) as engine:
        done = engine.generate(prompts, 1, RolloutParams(temperature=0, max_new_tokens=NEW_TOKENS), [0] * len(prompts))
    eos = m.tokenizer.eos_token_id
    for ids, cs in zip(rows["output_ids"].to_list(), done, strict=True):
        upto_eos = ids[: ids.index(eos) + 1] if eos in ids else ids  # the engine stops at EOS; the probe does not
        assert upto_eos == cs[0].completion_ids

    # warm-up runs happen but are not timed
    counting = CountingProbe(lat.HFLatencyProbe(m.model, m.device))
    ids = [m.tokenizer(p, add_special_tokens=False)["input_ids"][-100:] for p in prompts]
    timed = lat.measure_prompts(counting, ids, NEW_TOKENS, WARMUP)
    assert counting.calls == PROMPTS + WARMUP and len(timed) == PROMPTS
    assert all(len(t.token_ids) == NEW_TOKENS and len(t.step_ns) == NEW_TOKENS - 1 for t in timed)

    # the same machine again: a cache hit, the same artifact
    again = evaluate(model=str(hf), config=cfg, corpus=corpus)
    assert again["stages"]["eval:latency"]["status"] != "ran"
    assert again["stages"]["eval:latency"]["ref"]["digest"] == ref.digest


def _items(cfg, corpus_dir: Path):
    from codemill.data.corpus import split_key
    from codemill.evals import completion as comp
    from codemill.evals.suites.base import load_val_files

    val = load_val_files(corpus_dir, cfg.evaluate.completion.max_files)
    files = [(f"{r}/{p}", split_key(r, p, "repository"), c)
             for r, p, c in zip(val["repo"], val["path"], val["content"], strict=True)]
    return comp.make_items(files, cfg.evaluate.seed)
