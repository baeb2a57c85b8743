"""Executable problem sets: read problems from their sources, verify, deduplicate, decontaminate, split.

Pure logic (no Prefect, no MLflow); the ``problems`` stage (``tasks/problems.py``) calls ``build_problem_set``
under a store writer. Sources (``ProblemsConfig.sources``):

- ``jsonl`` / ``parquet``: HumanEval-format files (``task_id``, ``prompt``, ``entry_point``, ``test``, optional
  ``canonical_solution``, ``split_unit`` and ``test_cases``), local or any fsspec URL. A file that cannot be
  read as a whole is a ``ProblemFileError`` naming it, a line that is not a JSON object or lacks a field one
  naming the file, the line and the field: a problem set is curated input, so it is fixed, not skipped.
- ``mined``: doctest problems mined from the ingested corpus (``problems.mining.mine_doctest_problems``).
- ``synthetic``: the family in ``problems.synthetic``.

Steps, each counted per source and reason (``stats.by_source``, ``stats.steps``):
1. *check*: a problem the sandbox cannot judge is ``malformed`` (no prompt, an entry point that is not a name,
   tests that do not parse or define no ``check``).
2. *verify*: the reference solution runs against the tests in the sandbox (``JudgePool``, the same harness as
   evaluation and rewards); a reference that does not pass is ``reference_failed``. A problem without a
   reference is kept and counted ``unverified``.
3. *dedup*: exact duplicates of normalized prompt + tests (the first kept, in source order), and a second problem
   with an id already taken (``duplicate_id``).
4. *decontaminate*: a problem whose prompt or reference holds at least ``threshold`` of an eval text's token
   n-grams (HumanEval prompts and solutions by default; ``data.decontaminate``) is ``contaminated``.
5. *split*: train/val by a salted hash of the split unit (``data.corpus.assign_split``, the corpus's function).
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from codemill.data.config import DecontaminationConfig, source_config
from codemill.data.corpus import assign_split, read_split
from codemill.data.sources import FileTableSource, source_fingerprint, table_files
from codemill.problems.config import ProblemsConfig, ProblemSourceConfig
from codemill.problems.mining import MINING_CODE_VERSION
from codemill.problems.plus.counts import write_counts
from codemill.problems.problem import ExecProblem
from codemill.problems.synthetic import SYNTHETIC_CODE_VERSION, synthetic_problems
from codemill.sandbox.request import JudgeRequest

PROBLEMS_CODE_VERSION = f"problems-v2+{SYNTHETIC_CODE_VERSION}+{MINING_CODE_VERSION}"
PROBLEMS_FILE = "problems.parquet"
REJECTED_FILE = "rejected.parquet"
AUGMENT_COUNTS_FILE = "augment_counts.parquet"  # with problems.augment: problems.plus counts per problem
REQUIRED_FIELDS = ("task_id", "prompt", "entry_point", "test")
REASONS = ("malformed", "reference_failed", "duplicate", "duplicate_id", "contaminated")
PROBLEM_SCHEMA: dict[str, Any] = {
    "problem_id": pl.String, "prompt": pl.String, "entry_point": pl.String, "tests": pl.String,
    "test_cases": pl.List(pl.String), "reference_solution": pl.String, "source": pl.String,
    "split_unit": pl.String, "split": pl.String, "verified": pl.Boolean}
REJECTED_SCHEMA: dict[str, Any] = {
    "problem_id": pl.String, "source": pl.String, "step": pl.String, "reason": pl.String, "detail": pl.String}


class ProblemFileError(ValueError):
    """A problem file that cannot be used; the message names the file (and the line or row, and the field)."""


# --- sources -------------------------------------------------------------------------------------------------
def source_labels(sources: list[ProblemSourceConfig]) -> list[str]:
    """The name of each source in counts and in the ``source`` column (unique: a repeated name gets ``#i``)."""
    out: list[str] = []
    for i, src in enumerate(sources):
        if src.name:
            base = src.name
        elif src.kind in ("jsonl", "parquet"):
            base = Path(str(src.path).rstrip("/")).name or src.kind
        else:
            base = src.kind
        out.append(base if base not in out else f"{base}#{i}")
    return out


def _table_source(src: ProblemSourceConfig) -> FileTableSource:
    """The ingest's source of the same kind, to reuse its file listing, fsspec opening and fingerprints."""
    if not src.path:
        raise ProblemFileError(f"{src.kind} problem source has no path")
    table = source_config(kind=src.kind, path=src.path, storage_options=src.storage_options)
    assert isinstance(table, FileTableSource)  # jsonl and parquet: file kinds in both
    return table


def fingerprint_problem_sources(cfg: ProblemsConfig) -> list[dict[str, Any]]:
    """Content fingerprints of the file sources (what makes a changed file change the digest). Fails naming a
    missing path, bucket or unreadable source; mined and synthetic sources have none (the corpus digest and
    the config identify them)."""
    out = []
    for label, src in zip(source_labels(cfg.sources), cfg.sources, strict=True):
        if src.kind in ("jsonl", "parquet"):
            table = _table_source(src)
            fp = source_fingerprint(table)
            out.append({"name": label, "kind": src.kind, "root": fp["root"], "fingerprint": fp["fingerprint"],
                        "files": fp["files"]})
    return out


def problem_files(src: ProblemSourceConfig) -> list[str]:
    return table_files(_table_source(src))


def _text(value: Any, field: str, where: str, required: bool = True) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        got = "null" if value is None else type(value).__name__
        raise ProblemFileError(f"{where}: field {field!r} must be a string, got {got}")
    return value


def _cases(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise ProblemFileError(f"{where}: field 'test_cases' must be a list of strings")
    return list(value)


def problem_from_record(rec: Any, where: str, source: str) -> ExecProblem:
    """One HumanEval-format record -> ExecProblem; ``where`` (file:line) names it in every error."""
    if not isinstance(rec, dict):
        raise ProblemFileError(f"{where}: not a JSON object (got {type(rec).__name__})")
    missing = [f for f in REQUIRED_FIELDS if f not in rec]
    if missing:
        raise ProblemFileError(f"{where}: missing field {missing[0]!r}"
                               + (f" (also {', '.join(map(repr, missing[1:]))})" if missing[1:] else ""))
    task_id = rec["task_id"]
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    pid = _text(task_id, "task_id", where)
    prompt = _text(rec["prompt"], "prompt", where)
    entry = _text(rec["entry_point"], "entry_point", where)
    tests = _text(rec["test"], "test", where)
    ref = _text(rec.get("canonical_solution"), "canonical_solution", where, required=False)
    unit = _text(rec.get("split_unit"), "split_unit", where, required=False)
    assert pid is not None and prompt is not None and entry is not None and tests is not None
    return ExecProblem(problem_id=pid, prompt=prompt, entry_point=entry, tests=tests,
                       test_cases=_cases(rec.get("test_cases"), where), reference_solution=ref or None,
                       source=source, split_unit=unit or pid)


def read_problem_file(url: str, kind: str, storage_options: dict[str, Any], source: str) -> list[ExecProblem]:
    """Every problem of one JSONL (.jsonl.gz) or Parquet file, local or fsspec URL."""
    import fsspec

    if kind == "parquet":
        return _read_parquet(url, storage_options, source)
    out = []
    try:
        with fsspec.open(url, "rt", encoding="utf-8", compression="infer", **storage_options) as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                where = f"{url}:{lineno}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ProblemFileError(f"{where}: not valid JSON: {e.msg} (column {e.colno})") from None
                out.append(problem_from_record(rec, where, source))
    except ProblemFileError:
        raise
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise ProblemFileError(f"{url}: cannot read: {e}") from e
    return out


def _read_parquet(url: str, storage_options: dict[str, Any], source: str) -> list[ExecProblem]:
    import fsspec
    import pyarrow.parquet as pq

    try:
        fs, path = fsspec.core.url_to_fs(url, **storage_options)
        with fs.open(path, "rb") as fh:
            table = pq.read_table(fh)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        raise ProblemFileError(f"{url}: not a readable Parquet file: {e}") from e
    missing = [f for f in REQUIRED_FIELDS if f not in table.column_names]
    if missing:
        raise ProblemFileError(f"{url}: missing column {missing[0]!r} (columns: {', '.join(table.column_names)})")
    return [problem_from_record(rec, f"{url}: row {i}", source) for i, rec in enumerate(table.to_pylist())]


CorpusRows = Callable[[], Iterable[tuple[str, str, str, str]]]  # () -> (split, repo, path, content)


def corpus_files(corpus_dir: Path) -> Iterator[tuple[str, str, str, str]]:
    """(split, repo, path, content) of every file of a corpus artifact, train then val, in shard order."""
    for split in ("train", "val"):
        df = read_split(corpus_dir, split)
        for repo, path, content in df.select("repo", "path", "content").iter_rows():
            yield split, repo, path, content


def corpus_unit(split: str, repo: str, path: str) -> str:
    """A mined problem's split unit: its file's corpus split, then the file. A problem mined from a corpus
    train file is a train problem and one from a val file a val problem, so a val problem's solution is never
    in the text the model was trained on (a fresh hash split would put about a fifth of train files' functions
    into val), and the split follows the corpus's own unit (repository or top-level package)."""
    return f"{split}:{repo}/{path}"


def mined(cfg: ProblemsConfig) -> set[str]:
    """The labels of the mined sources, whose split is their corpus file's."""
    return {label for label, src in zip(source_labels(cfg.sources), cfg.sources, strict=True) if src.kind == "mined"}


def read_source(src: ProblemSourceConfig, label: str, corpus: CorpusRows | None
                ) -> tuple[list[ExecProblem], dict[str, int]]:
    """The problems of one source (with ``source`` = its label) and the source's own counts (mining steps)."""
    if src.kind in ("jsonl", "parquet"):
        problems = []
        for url in problem_files(src):
            problems += read_problem_file(url, src.kind, src.storage_options, label)
        return problems, {}
    if src.kind == "synthetic":
        by_problem = src.split_by == "problem"
        return [replace(p, source=label, split_unit=p.problem_id if by_problem else p.split_unit)
                for p in synthetic_problems(src.seed, src.count, src.family)], {}
    if corpus is None:
        raise ValueError("a mined problem source needs the corpus (the plan's 'corpus' input)")
    from codemill.problems.mining import mine_doctest_problems

    split_of_file: dict[tuple[str, str], str] = {}

    def files() -> Iterator[tuple[str, str, str]]:
        for split, repo, path, content in corpus():
            split_of_file[(repo, path)] = split
            yield repo, path, content

    found, counts = mine_doctest_problems(
        files(), split_unit_of=lambda repo, path: corpus_unit(split_of_file[(repo, path)], repo, path))
    return [replace(p, source=label) for p in found], {str(k): int(v) for k, v in counts.items()}


# --- steps ---------------------------------------------------------------------------------------------------
def malformed_reason(p: ExecProblem) -> str | None:
    """Why the sandbox could not judge this problem at all (None when it can)."""
    if not p.prompt.strip():
        return "empty prompt"
    if not p.entry_point.isidentifier():
        return f"entry point {p.entry_point!r} is not a name"
    try:
        tree = ast.parse(p.tests)
    except (SyntaxError, ValueError) as e:
        return f"tests do not parse: {e}"
    if not any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body):
        return "tests define no check(candidate)"
    return None


@dataclass(frozen=True)
class Rejected:
    problem: ExecProblem
    step: str
    reason: str
    detail: str = ""


Judge = Callable[[list[JudgeRequest]], list[Any]]  # JudgePool.judge_all


def verify(problems: list[ExecProblem], judge: Judge | None, retries: int = 2,
           counts: dict[str, int] | None = None) -> tuple[list[ExecProblem], list[Rejected]]:
    """Keep problems whose reference passes in the sandbox, and those without a reference (unverified).

    A failure the host cannot attribute to the reference (the candidate gone, no verdict, a time-out, the
    judge's ``suspicious`` labels) is judged again, up to ``retries`` times, so a problem set does not lose a good
    problem to a time-out on a loaded machine or a server lost mid-sample (the pool's servers once died with the
    thread that started them; that cause is fixed in ``sandbox.servers``). A reference that really exits or
    loops fails every time. ``counts["rejudged"]`` says how many samples were judged again."""
    with_ref = [p for p in problems if p.reference_solution is not None]
    verdicts: list[Any] = []
    if with_ref:
        if judge is None:
            raise ValueError("problems with references need a judge (the sandbox)")
        verdicts = list(judge([p.request(p.reference_solution or "") for p in with_ref]))
        for _ in range(retries):
            again = [i for i, j in enumerate(verdicts) if not j.passed and getattr(j, "suspicious", None)]
            if not again:
                break
            if counts is not None:
                counts["rejudged"] = counts.get("rejudged", 0) + len(again)
            for i, j in zip(again, judge([with_ref[i].request(with_ref[i].reference_solution or "") for i in again]),
                            strict=True):
                verdicts[i] = j
    by_problem = dict(zip(map(id, with_ref), verdicts, strict=True))
    kept, dropped = [], []
    for p in problems:
        j = by_problem.get(id(p))
        if j is None or j.passed:
            kept.append(p)
        else:
            detail = f"{j.kind}: {j.error}".strip().rstrip(":")
            dropped.append(Rejected(p, "verify", "reference_failed", detail[:500]))
    return kept, dropped


def _normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines() if line.strip())


def dedup_key(p: ExecProblem) -> str:
    """Two problems are the same when their prompts and tests agree up to trailing whitespace and blank lines."""
    return hashlib.sha256(f"{_normalize(p.prompt)}\0{_normalize(p.tests)}".encode()).hexdigest()


def exact_dedup(problems: list[ExecProblem]) -> tuple[list[ExecProblem], list[Rejected]]:
    seen: dict[str, str] = {}
    ids: set[str] = set()
    kept, dropped = [], []
    for p in problems:
        key = dedup_key(p)
        if key in seen:
            dropped.append(Rejected(p, "dedup", "duplicate", f"same prompt and tests as {seen[key]}"))
        elif p.problem_id in ids:
            dropped.append(Rejected(p, "dedup", "duplicate_id", f"problem id {p.problem_id!r} is taken"))
        else:
            seen[key] = p.problem_id
            ids.add(p.problem_id)
            kept.append(p)
    return kept, dropped


def decontaminate(problems: list[ExecProblem], cfg: DecontaminationConfig
                  ) -> tuple[list[ExecProblem], list[Rejected]]:
    """Drop problems whose prompt or reference holds ``cfg.threshold`` of some eval text's n-grams."""
    if not cfg.enabled or not problems:
        return list(problems), []
    import numpy as np

    from codemill.data.decontaminate import build_index, contamination, load_eval_texts

    index = build_index(load_eval_texts(cfg), cfg.ngram)
    by_prompt, label_p = contamination(pl.Series([p.prompt for p in problems], dtype=pl.String), index, cfg.ngram)
    by_ref, label_r = contamination(pl.Series([p.reference_solution or "" for p in problems], dtype=pl.String),
                                    index, cfg.ngram)
    kept, dropped = [], []
    for i, p in enumerate(problems):
        worst = int(np.argmax([by_prompt[i], by_ref[i]]))
        overlap, label = (by_prompt[i], label_p[i]) if worst == 0 else (by_ref[i], label_r[i])
        if overlap >= cfg.threshold:
            field = "prompt" if worst == 0 else "reference"
            dropped.append(Rejected(p, "decontaminate", "contaminated",
                                    f"{field} holds {overlap:.0%} of {label}'s {cfg.ngram}-grams"))
        else:
            kept.append(p)
    return kept, dropped


def split_of(p: ExecProblem, cfg: ProblemsConfig, corpus_split: bool = False) -> str:
    """Train or val: a mined problem's (``corpus_split``) is its corpus file's, the others' a salted hash of the
    split unit."""
    if corpus_split:
        return p.split_unit.split(":", 1)[0]
    return assign_split(p.split_unit or p.problem_id, cfg.val_fraction, cfg.split_salt)


# --- the whole set -------------------------------------------------------------------------------------------
Augment = Callable[[list[ExecProblem], Callable[[str], None]], tuple[list[ExecProblem], list[Any]]]


def build_problem_set(cfg: ProblemsConfig, out_dir: Path, judge: Judge | None,
                      corpus: CorpusRows | None = None,
                      say: Callable[[str], None] | None = None, augment: Augment | None = None) -> dict[str, Any]:
    """Write ``problems.parquet`` (kept problems with their split) and ``rejected.parquet`` (every dropped
    problem with its step, reason and detail) under ``out_dir``; return the stats for the manifest.
    ``augment`` (``cfg.augment``: ``problems.plus``) strengthens the kept problems' tests last, so RL rewards and
    evaluation on this set judge with them; its per-problem counts go to ``augment_counts.parquet``."""
    say = say or (lambda _m: None)
    labels = source_labels(cfg.sources)
    problems: list[ExecProblem] = []
    source_counts: dict[str, dict[str, int]] = {}
    for label, src in zip(labels, cfg.sources, strict=True):
        say(f"reading {label}")
        got, counts = read_source(src, label, corpus)
        problems += got
        if counts:
            source_counts[label] = counts
    read = Counter(p.source for p in problems)
    rejected: list[Rejected] = []
    live = []
    for p in problems:
        why = malformed_reason(p)
        if why:
            rejected.append(Rejected(p, "check", "malformed", why))
        else:
            live.append(p)
    say(f"verifying {sum(p.reference_solution is not None for p in live)} references in the sandbox")
    verify_counts: dict[str, int] = {"rejudged": 0}
    live, dropped = verify(live, judge, counts=verify_counts)
    rejected += dropped
    live, dropped = exact_dedup(live)
    rejected += dropped
    say(f"decontaminating {len(live)} problems")
    live, dropped = decontaminate(live, cfg.decontamination)
    rejected += dropped
    from_corpus = mined(cfg)
    splits = [split_of(p, cfg, p.source in from_corpus) for p in live]
    augmented: list[Any] | None = None
    if augment is not None:
        say(f"augmenting the tests of {sum(p.reference_solution is not None for p in live)} problems")
        live, augmented = augment(live, say)
    _write(out_dir, live, splits, rejected)
    stats = _stats(labels, cfg, read, source_counts, live, splits, rejected)
    stats["verify"] = verify_counts
    if augmented is not None:
        stats["augment"] = write_counts(out_dir, augmented, AUGMENT_COUNTS_FILE)
    return stats


def _write(out_dir: Path, kept: list[ExecProblem], splits: list[str], rejected: list[Rejected]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"problem_id": p.problem_id, "prompt": p.prompt, "entry_point": p.entry_point, "tests": p.tests,
             "test_cases": list(p.test_cases), "reference_solution": p.reference_solution, "source": p.source,
             "split_unit": p.split_unit, "split": s, "verified": p.reference_solution is not None}
            for p, s in zip(kept, splits, strict=True)]
    pl.DataFrame(rows, schema=PROBLEM_SCHEMA).write_parquet(out_dir / PROBLEMS_FILE, compression="zstd")
    pl.DataFrame([{"problem_id": r.problem.problem_id, "source": r.problem.source, "step": r.step,
                   "reason": r.reason, "detail": r.detail} for r in rejected],
                 schema=REJECTED_SCHEMA).write_parquet(out_dir / REJECTED_FILE, compression="zstd")


COUNT_COLUMNS = ("read", "malformed", "reference_failed", "unverified", "duplicate", "contaminated", "kept",
                 "train", "val")


def _stats(labels: list[str], cfg: ProblemsConfig, read: Counter[str], source_counts: dict[str, dict[str, int]],
           kept: list[ExecProblem], splits: list[str], rejected: list[Rejected]) -> dict[str, Any]:
    by_source: dict[str, dict[str, Any]] = {}
    for label, src in zip(labels, cfg.sources, strict=True):
        rej = Counter(r.reason for r in rejected if r.problem.source == label)
        mine = [(p, s) for p, s in zip(kept, splits, strict=True) if p.source == label]
        by_source[label] = {
            "kind": src.kind, "read": read[label], "malformed": rej["malformed"],
            "reference_failed": rej["reference_failed"],
            "unverified": sum(p.reference_solution is None for p, _ in mine),
            "duplicate": rej["duplicate"] + rej["duplicate_id"], "contaminated": rej["contaminated"],
            "kept": len(mine), "train": sum(s == "train" for _, s in mine), "val": sum(s == "val" for _, s in mine)}
        if label in source_counts:
            by_source[label]["mining"] = source_counts[label]
    totals = {k: sum(v[k] for v in by_source.values()) for k in COUNT_COLUMNS}
    steps = [{"step": r_step, "source": label, "reason": reason, "count": n}
             for (label, r_step, reason), n in sorted(Counter((r.problem.source, r.step, r.reason)
                                                              for r in rejected).items())]
    return {"problems": len(kept), "splits": {"train": totals["train"], "val": totals["val"]},
            "totals": totals, "by_source": by_source, "steps": steps,
            "reference_failures": dict(Counter(r.detail.split(":", 1)[0] for r in rejected
                                               if r.reason == "reference_failed")),
            "units": {"train": len({p.split_unit for p, s in zip(kept, splits, strict=True) if s == "train"}),
                      "val": len({p.split_unit for p, s in zip(kept, splits, strict=True) if s == "val"})}}


def read_problem_set(path: Path, split: str | None = None) -> list[ExecProblem]:
    """The problems of a committed ``problems.parquet`` (one split, or all), as ExecProblem records."""
    df = pl.read_parquet(path)
    if split is not None:
        df = df.filter(pl.col("split") == split)
    return [ExecProblem(problem_id=r["problem_id"], prompt=r["prompt"], entry_point=r["entry_point"],
                        tests=r["tests"], test_cases=list(r["test_cases"] or []),
                        reference_solution=r["reference_solution"], source=r["source"], split_unit=r["split_unit"])
            for r in df.iter_rows(named=True)]


def build_in_sandbox(cfg: ProblemsConfig, out_dir: Path, corpus: CorpusRows | None = None,
                     say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``build_problem_set`` with the judge pool its verification needs (``cfg``'s sandbox limits) and, with
    ``cfg.augment``, the augmentation's sandboxes; the stats name the sandbox's isolation."""
    import contextlib

    from codemill.sandbox import Limits
    from codemill.sandbox.judge_pool import JudgePool

    limits = Limits.of(cfg)
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(JudgePool(limits, workers=cfg.workers))
        augment = None
        if cfg.augment is not None:
            from codemill.problems.plus.augment import augmenter

            augment = stack.enter_context(augmenter(cfg.augment))
        stats = build_problem_set(cfg, out_dir, pool.judge_all, corpus, say=say, augment=augment)
    stats["sandbox"] = pool.isolation
    return stats
