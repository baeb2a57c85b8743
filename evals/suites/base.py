"""What every eval suite shares: the suite record the registry holds, the inputs a run gets, the model loader.

A suite is pure logic: given a ``SuiteRun`` (its config, a lazily loaded model, the val split or its own
dataset, the artifacts of the steps it needs, a place for extra files) it returns per-item rows and a summary.
Rows carry ``item_id`` and ``cluster`` (items that share a cluster are not independent: files of one split unit,
samples of one problem), which the CIs and the gate respect. A suite also declares what the rest of the
pipeline needs to know of it, so that planning, the run summary, ``codemill compare`` and the gate loop over the
registry and never name a suite: the steps it needs before it (``needs``), its dataset, its metrics' unit,
direction and hold margin, and how it shows beyond its headline metric. Prefect, the store and MLflow stay in
``tasks/evaluate.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from codemill.data.corpus import read_split, split_key
from codemill.evals.stats import ItemScores, bootstrap_ratio_ci
from codemill.stage_config import StageConfig
from codemill.store import ArtifactRef, Manifest

if TYPE_CHECKING:
    from codemill.config import PipelineConfig  # composed of the sections built from this registry
    from codemill.evals.config import EvalConfig  # the section built from this registry

if TYPE_CHECKING:  # the model code loads when a model is evaluated (latency's plan imports torch for the machine)
    import torch
    from transformers import PreTrainedTokenizerBase

Rows = tuple[pl.DataFrame, dict[str, Any]]


@dataclass
class EvalModel:
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase  # a transformers fast tokenizer
    device: torch.device
    hf_dir: Path | None = None  # where the model was loaded from (a vLLM engine loads it from there)
    sampler: EvalConfig | None = None  # its ``engine`` and ``vllm``: what the generating suites sample with

    def engine(self, rows_per_forward: int, max_context: int) -> AbstractContextManager[Any]:
        """The sampling engine on this model, the one RL's rollouts use, for the ``with`` block: ``HFEngine`` on
        the loaded model, or with ``evaluate.engine: vllm`` the process's vLLM engine on the model's folder
        (started once, given each later model's weights, held for this block alone)."""
        from codemill.models.engines import HFEngine, using_live_vllm

        if self.sampler is not None and self.sampler.engine == "vllm":
            if self.hf_dir is None:
                raise ValueError("evaluate.engine vllm needs the model's folder, and this model has none")
            return using_live_vllm(self.hf_dir, self.sampler.vllm, max_context, self.device.type)
        return nullcontext(HFEngine.from_model(self.model, self.tokenizer, rows_per_forward=rows_per_forward,
                                               max_context=max_context))

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


@dataclass
class SuiteRun:
    """One suite's run on one model: what it may read and where it may write besides its rows."""

    cfg: EvalConfig
    hf_dir: Path
    path: Callable[[str], Path]  # a file in the artifact being written (its folders made): a suite's extra files
    corpus_dir: Path | None = None  # val suites: the corpus artifact
    split_unit: str = "repository"  # the corpus's split unit: val files of one unit share a cluster
    samples_file: str | None = None  # ``Suite.scores_samples``: score this samples JSONL instead of generating
    # The store artifacts among the plan's inputs besides the model, by input name: what the suite's ``needs``
    # built (and a val suite's corpus, as ``data``).
    inputs: dict[str, Path] = field(default_factory=dict)
    loader: Callable[[Path], EvalModel] = load_eval_model
    planned: dict[str, Any] = field(default_factory=dict)  # the plan's hashed config (``Suite.plan_config`` included)

    @cached_property
    def model(self) -> EvalModel:
        m = self.loader(self.hf_dir)
        m.hf_dir, m.sampler = self.hf_dir, self.cfg
        return m

    def val(self, max_files: int | None) -> tuple[pl.DataFrame, list[str]]:
        """The first ``max_files`` val files (sorted by path) and each one's cluster (its split unit)."""
        if self.corpus_dir is None:
            raise ValueError("this suite reads the val split but the run has no corpus")
        val = load_val_files(self.corpus_dir, max_files)
        return val, [split_key(r, p, self.split_unit) for r, p in zip(val["repo"], val["path"], strict=True)]


# The hold margin of a metric that declares none: an uncalibrated gate counts a smaller difference as none.
DEFAULT_HOLD_MARGIN = 0.05


@dataclass(frozen=True)
class Metric:
    """A metric a suite reports and what the gate, the run summary and ``codemill compare`` know of it: its
    direction, whether its items are 0/1 (exact tests for the gate), its unit, and its hold margin: with no seed
    noise for the champion's recipe the gate counts a smaller difference as none (the floor under the margin
    derived from the nearest shipped preset, ``codemill.gate.preset_noise.hold_margins``)."""

    name: str
    higher_is_better: bool = True
    binary: bool = False
    unit: str = ""  # what its values are in (``ms``), printed after each number; "" for scores, rates and bits
    reading: str = ""  # how to read a difference, printed after "+ = candidate better" (e.g. lower is faster)
    hold_margin: float = DEFAULT_HOLD_MARGIN
    # Its seed SD says which shipped preset is the noisiest: the hold margins of a champion whose training config
    # is unknown come from that preset (the conservative choice).
    noise_yardstick: bool = False


@dataclass(frozen=True)
class Need:
    """A step a suite reads, planned before it from the pipeline config: ``stage`` names the step's planner
    (``flows.plan`` registers one per stage a suite can need), ``config`` is the config that stage is planned
    with, and the artifact it makes is the suite's plan input ``input`` (``SuiteRun.inputs[input]`` in the run).
    Suites that need one stage with one config share its step."""

    stage: str
    config: StageConfig
    input: str


@dataclass(frozen=True)
class Suite:
    """One registered suite. ``metrics`` are those the gate can test (from ``item_scores``); ``logged`` are the
    summary-key prefixes recorded on the evaluation run (the metrics, plus e.g. sampled pass@k)."""

    name: str
    code_version: str
    run: Callable[[SuiteRun], Rows]
    item_scores: Callable[[pl.DataFrame], dict[str, ItemScores]]
    metrics: tuple[Metric, ...]
    logged: tuple[str, ...] = ()
    uses_sandbox: Callable[[EvalConfig], bool] = field(default=lambda cfg: False)
    # What the suite's digest covers besides its own section (``evaluate.<name>``), the eval seed and the
    # bootstrap settings: settings it reads from another section, or the machine a measurement belongs to.
    plan_config: Callable[[EvalConfig], dict[str, Any]] = field(default=lambda cfg: {})
    generates: bool = False  # samples from the model: through ``evaluate.engine``, which its digest then covers
    settings: type[StageConfig] = StageConfig  # its section of the evaluate config, ``evaluate.<name>``
    default: bool = True  # run when ``evaluate.suites`` is not set (False: it needs data the defaults lack)
    headline: str = ""  # the summary key a one-line report shows (default: the first metric)
    # What it reads. ``needs``: the steps planned before it (in registry order, ahead of every suite's own
    # step). ``dataset``: a fixed file it reads as its ``data`` input; None: the corpus, whose val split it
    # scores, unless a need fills ``data``. ``scores_samples``: it can score a samples file (``--samples``).
    needs: Callable[[PipelineConfig], tuple[Need, ...]] = field(default=lambda config: ())
    dataset: Callable[[], ArtifactRef] | None = None
    scores_samples: bool = False
    uses_overlay: bool = False  # runs the model in repository workspaces (overlay mounts, which preflight checks)
    # What a measurement of the machine ran on: the summary keys kept in the flow's result beside its numbers
    # (``described``) and those tagged on its evaluate run (``run_tags``).
    described: tuple[str, ...] = ()
    run_tags: tuple[str, ...] = ()
    # How it shows beyond its headline metric. ``summary_line``: its own line in the run summary, from the run's
    # scores and its step's summary (its summary keys then stay out of the score table). ``side_by_side``: what
    # ``codemill compare`` keeps of two paired evaluations (a, b), under the suite's name in the comparison;
    # ``compare_lines``: how the comparison prints that, at a width.
    summary_line: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None] | None = None
    side_by_side: Callable[[Manifest, Manifest], dict[str, Any]] | None = None
    compare_lines: Callable[[Mapping[str, Any], int], list[str]] | None = None

    @property
    def headline_metric(self) -> str:
        return self.headline or self.metrics[0].name

    def config(self, cfg: EvalConfig) -> StageConfig:
        """This suite's section of the evaluate config (``evaluate.<name>``)."""
        section: StageConfig = getattr(cfg, self.name)
        return section

    @property
    def summary_keys(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.metrics) + self.logged


def sampler_config(cfg: EvalConfig) -> dict[str, Any]:
    """What a generating suite's digest adds for its engine: nothing for hf (the default), the engine and its
    output-affecting options for vllm (its samples are not HFEngine's)."""
    return {} if cfg.engine == "hf" else {"engine": cfg.engine, "vllm": cfg.vllm.digest_config()}


def ci(values: np.ndarray, weights: np.ndarray, clusters: np.ndarray, cfg: EvalConfig, name: str) -> dict:
    """The suite summary's point estimate and bootstrap CI of one metric (cluster-resampled)."""
    est = bootstrap_ratio_ci(values, weights, clusters, samples=cfg.bootstrap_samples,
                             confidence=cfg.confidence, seed=cfg.seed)
    return est.as_dict(name)


def scores(rows: pl.DataFrame, metric: Metric, column: str, weights: np.ndarray | None = None) -> ItemScores:
    """The gate's view of one per-item column."""
    return ItemScores(rows["item_id"].to_numpy(), rows[column].to_numpy().astype(np.float64),
                      np.ones(rows.height) if weights is None else weights, rows["cluster"].to_numpy(),
                      metric.higher_is_better, binary=metric.binary)
