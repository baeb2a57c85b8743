"""The eval suites as pure functions: a model in, per-item rows and aggregate scores out.

Every suite returns (rows, summary). Rows carry ``item_id`` and ``cluster`` (items that share a cluster are
not independent: files of one split unit, samples of one problem), which the CIs and the gate respect.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from codemill.config import EvalConfig
from codemill.data.corpus import read_split
from codemill.evals import completion as comp
from codemill.evals import humaneval as he
from codemill.evals.gate import ItemScores
from codemill.evals.problems import ExecProblem
from codemill.evals.sandbox import Limits
from codemill.evals.sandbox.judge_pool import JudgePool
from codemill.evals.stats import bootstrap_ratio_ci

if TYPE_CHECKING:  # torch and the model code load only when a model is evaluated, not on a no-change rerun
    import torch
    from transformers import PreTrainedTokenizerBase

SUITE_VERSIONS = {"bpb": "eval-bpb-v2", "completion": comp.COMPLETION_CODE_VERSION,
                  "humaneval": he.HUMANEVAL_CODE_VERSION}


@dataclass
class EvalModel:
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase  # a transformers fast tokenizer
    device: torch.device

    @property
    def bos_id(self) -> int:
        tok = self.tokenizer
        return tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id


def load_eval_model(hf_dir: Path, device: torch.device | None = None) -> EvalModel:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(str(hf_dir))
    model = model.to(device).eval()
    return EvalModel(model, tok, device)


def load_val_files(corpus_dir: Path, max_files: int | None) -> pl.DataFrame:
    val = read_split(corpus_dir, "val").sort(["repo", "path"])
    if val.height == 0:
        raise ValueError(f"{corpus_dir}: the val split is empty; raise ingest.val_fraction or add sources")
    return val.head(max_files) if max_files else val


def _ci(values: np.ndarray, weights: np.ndarray, clusters: np.ndarray, cfg: EvalConfig, name: str) -> dict:
    ci = bootstrap_ratio_ci(values, weights, clusters, samples=cfg.bootstrap_samples,
                                    confidence=cfg.confidence, seed=cfg.seed)
    return ci.as_dict(name)


# --- bpb ------------------------------------------------------------------------------------------------
def run_bpb(m: EvalModel, val: pl.DataFrame, clusters: list[str], cfg: EvalConfig) -> tuple[pl.DataFrame, dict]:
    from codemill.evals.bpb import bits_per_byte, file_nll, nats_to_bits

    texts = val["content"].to_list()
    ids = m.tokenizer(texts, add_special_tokens=False)["input_ids"]
    nll = file_nll(m.model, ids, bos_id=m.bos_id, pad_id=m.tokenizer.pad_token_id,
                   context_len=cfg.bpb.context_len, batch_size=cfg.bpb.batch_size, device=m.device)
    bits = np.array([nats_to_bits(x) for x in nll])
    n_bytes = val["bytes"].to_numpy().astype(np.float64)
    rows = pl.DataFrame({
        "item_id": [f"{r}/{p}" for r, p in zip(val["repo"], val["path"], strict=True)], "cluster": clusters,
        "bytes": val["bytes"], "tokens": [len(x) for x in ids], "nll_bits": bits,
        "bpb": [bits_per_byte(x, int(b)) for x, b in zip(nll, n_bytes, strict=True)]})
    summary = {**_ci(bits, n_bytes, np.array(clusters), cfg, "val_bpb"), "files": rows.height,
               "clusters": len(set(clusters)), "bytes": int(n_bytes.sum()), "tokens": int(rows["tokens"].sum())}
    return rows, summary


# --- completion -----------------------------------------------------------------------------------------
def run_completion(m: EvalModel, val: pl.DataFrame, clusters: list[str],
                   cfg: EvalConfig) -> tuple[pl.DataFrame, dict]:
    from codemill.evals.generate import SamplingParams, generate

    sc = cfg.completion
    files = [(f"{r}/{p}", c, t) for r, p, c, t in zip(val["repo"], val["path"], clusters, val["content"],
                                                      strict=True)][: sc.max_files or None]
    items = comp.make_items(files, cfg.seed)
    if not items:
        raise ValueError("no completion items: the val files have no lines to complete")
    preds = generate(m.model, m.tokenizer, [it.prefix for it in items],
                     SamplingParams(max_new_tokens=sc.max_new_tokens, stop=("\n",)), batch_size=sc.batch_size,
                     max_context=sc.context_len, device=m.device, seed=cfg.seed)
    em = np.array([comp.exact_match(p, it.target) for p, it in zip(preds, items, strict=True)])
    es = np.array([comp.edit_similarity(p, it.target) for p, it in zip(preds, items, strict=True)])
    rows = pl.DataFrame({"item_id": [it.item_id for it in items], "cluster": [it.cluster for it in items],
                         "target": [it.target for it in items], "prediction": [p.strip() for p in preds],
                         "exact_match": em, "edit_similarity": es})
    cl, ones = rows["cluster"].to_numpy(), np.ones(len(items))
    summary = {**_ci(em, ones, cl, cfg, "completion_exact_match"),
               **_ci(es, ones, cl, cfg, "completion_edit_similarity"), "items": len(items)}
    return rows, summary


# --- humaneval ------------------------------------------------------------------------------------------
def humaneval_pool(cfg: EvalConfig) -> JudgePool:
    """The judge pool of the suite; entering it probes the sandbox, so it fails closed before any model code runs."""
    h = cfg.humaneval
    return JudgePool(Limits(wall_s=h.wall_s, cpu_s=h.cpu_s, memory_bytes=h.memory_mb << 20), workers=h.workers,
                     unsafe=h.unsafe_no_sandbox)


def humaneval_samples(m: EvalModel, problems: dict[str, ExecProblem], cfg: EvalConfig) -> list[dict]:
    """Greedy (mode=greedy) and sampled (mode=sampled) completions, generation kept apart from execution."""
    from codemill.evals.generate import SamplingParams, generate

    h = cfg.humaneval
    out: list[dict] = []
    base = SamplingParams(max_new_tokens=h.max_new_tokens, stop=he.STOP_SEQUENCES)
    ids = list(problems)
    if h.greedy:
        texts = generate(m.model, m.tokenizer, [problems[t].prompt for t in ids], base, batch_size=h.batch_size,
                         max_context=h.context_len, device=m.device, seed=cfg.seed)
        out += [{"task_id": t, "completion": c, "mode": "greedy"} for t, c in zip(ids, texts, strict=True)]
    if h.n_samples:
        sampled = SamplingParams(max_new_tokens=h.max_new_tokens, temperature=h.temperature, top_p=h.top_p,
                                 stop=he.STOP_SEQUENCES)
        prompts = [problems[t].prompt for t in ids for _ in range(h.n_samples)]
        texts = generate(m.model, m.tokenizer, prompts, sampled, batch_size=h.batch_size,
                         max_context=h.context_len, device=m.device, seed=cfg.seed + 1)
        owners = [t for t in ids for _ in range(h.n_samples)]
        out += [{"task_id": t, "completion": c, "mode": "sampled"} for t, c in zip(owners, texts, strict=True)]
    return out


def score_humaneval(samples: list[dict], problems: dict[str, ExecProblem], cfg: EvalConfig,
                    pool: JudgePool) -> tuple[pl.DataFrame, dict]:
    """Execute samples (from generation or a samples file) and aggregate by problem."""
    h = cfg.humaneval
    rows_all: list[dict] = []
    summary: dict[str, Any] = {"problems": len(problems), "unsafe_no_sandbox": h.unsafe_no_sandbox,
                               "sandbox": pool.isolation}
    for mode in ("greedy", "sampled"):
        chosen = [s for s in samples if s.get("mode", "greedy") == mode]
        if not chosen:
            continue
        results = he.execute(problems, chosen, pool)
        rows_all += [{**r, "mode": mode, "item_id": r["task_id"], "cluster": r["task_id"]} for r in he.rows(results)]
        counts = he.per_problem(results)
        frac = np.array([c / n for n, c in counts.values()])
        if mode == "greedy":
            summary.update(_ci(frac, np.ones_like(frac), np.arange(frac.size), cfg, "humaneval_pass_at_1"))
        else:
            ks = [k for k in h.ks if k <= h.n_samples]
            scores = he.pass_at_k_scores(results, ks)
            summary.update({f"humaneval_sampled_pass_at_{k.removeprefix('pass@')}": v for k, v in scores.items()})
        summary[f"{mode}_outcomes"] = dict(Counter(r.outcome for r in results))
        summary[f"{mode}_suspicious"] = dict(Counter(r.suspicious for r in results if r.suspicious))
    return pl.DataFrame(rows_all), summary


def rows_file(suite: str) -> str:
    """Where an evaluate artifact keeps its per-item rows (relative to the artifact): the gate, the lineage
    comparison and the MLflow run all read this one file."""
    return f"rows/{suite}.parquet"


# --- the gate's view of the rows ------------------------------------------------------------------------
def item_scores(suite: str, rows: pl.DataFrame) -> dict[str, ItemScores]:
    ids, clusters = rows["item_id"].to_numpy(), rows["cluster"].to_numpy()
    ones = np.ones(rows.height)
    if suite == "bpb":
        return {"val_bpb": ItemScores(ids, rows["nll_bits"].to_numpy(), rows["bytes"].to_numpy().astype(float),
                                      clusters, higher_is_better=False)}
    if suite == "completion":
        return {"completion_exact_match": ItemScores(ids, rows["exact_match"].to_numpy(), ones, clusters, True,
                                                     binary=True),
                "completion_edit_similarity": ItemScores(ids, rows["edit_similarity"].to_numpy(), ones, clusters,
                                                         True)}
    if suite == "humaneval":
        greedy = rows.filter(pl.col("mode") == "greedy").sort("item_id")
        if greedy.height == 0:
            return {}
        passed = (greedy["outcome"] == "passed").cast(pl.Float64).to_numpy()
        return {"humaneval_pass_at_1": ItemScores(greedy["item_id"].to_numpy(), passed, np.ones(greedy.height),
                                               greedy["cluster"].to_numpy(), True, binary=True)}
    raise ValueError(f"unknown suite {suite!r}")
