"""One repository task in the SWE-bench instance format, and reading/writing sets of them.

The SWE-bench columns (``instance_id, repo, base_commit, problem_statement, patch, test_patch, FAIL_TO_PASS,
PASS_TO_PASS, created_at``) keep their names and meaning, so tasks and predictions move between codemill and the
tools of that ecosystem. ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` are pytest node ids (``tests/test_x.py::test_y``);
SWE-bench stores them as JSON-encoded strings, and both that and plain lists are read. codemill's own columns
say where a task came from (``source``: import or synthesis), its ``split``, how it was made (``mutation``: the
operator and where it applied) and its validation runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from codemill.errors import UserFacingError

SWE_BENCH_COLUMNS = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
                     "FAIL_TO_PASS", "PASS_TO_PASS", "created_at")
REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS")


class TaskFileError(UserFacingError, ValueError):
    """A task or prediction file that cannot be read as the SWE-bench format (names the file and line)."""


@dataclass(frozen=True)
class RepoTask:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...] = ()
    created_at: str = ""
    source: str = "import"  # import | synthesis
    split: str = ""
    mutation: str = ""  # synthesis: "<operator> <path>:<function>"
    validation: str = ""  # JSON: what the validation runs found

    @property
    def expected_tests(self) -> tuple[str, ...]:
        """Every test id whose pass the reward needs: FAIL_TO_PASS then PASS_TO_PASS, each once."""
        return tuple(dict.fromkeys(self.FAIL_TO_PASS + self.PASS_TO_PASS))

    def test_files(self) -> list[str]:
        """The files the task's tests live in (from the ids) and the ones ``test_patch`` touches: restored to
        the task's version at grading, whatever the agent did to them."""
        files = {t.split("::", 1)[0] for t in self.expected_tests}
        files.update(patch_paths(self.test_patch))
        return sorted(files)

    def row(self) -> dict[str, Any]:
        """The task as a table row: SWE-bench's JSON-string encoding of the test lists."""
        r = asdict(self)
        r["FAIL_TO_PASS"] = json.dumps(list(self.FAIL_TO_PASS))
        r["PASS_TO_PASS"] = json.dumps(list(self.PASS_TO_PASS))
        return r


def patch_paths(patch: str) -> list[str]:
    """The files a unified (git) diff changes, old and new names, without the ``a/`` / ``b/`` prefixes."""
    paths: list[str] = []
    for line in patch.splitlines():
        if line.startswith(("--- ", "+++ ")):
            name = line[4:].split("\t", 1)[0].strip()
            if name != "/dev/null":
                paths.append(name[2:] if name[:2] in ("a/", "b/") else name)
    return sorted(set(paths))


def _id_list(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as e:
            raise TaskFileError(f"{where}: not a JSON list of test ids: {e}") from e
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise TaskFileError(f"{where}: expected a list of test ids, got {type(value).__name__}")
    return tuple(value)


def task_from_row(row: dict[str, Any], where: str) -> RepoTask:
    """One task from a JSONL/Parquet row; a missing column or a malformed test list is one error line."""
    missing = [c for c in REQUIRED if not row.get(c)]
    if missing:
        raise TaskFileError(f"{where}: missing {', '.join(missing)}")
    text = {k: str(row.get(k) or "") for k in ("problem_statement", "created_at", "source", "split", "mutation",
                                                 "validation")}
    f2p = _id_list(row["FAIL_TO_PASS"], f"{where}: FAIL_TO_PASS")
    if not f2p:
        raise TaskFileError(f"{where}: FAIL_TO_PASS is empty (a task needs a test that its fix makes pass)")
    return RepoTask(str(row["instance_id"]), str(row["repo"]), str(row["base_commit"]),
                    text["problem_statement"], str(row["patch"]), str(row["test_patch"]),
                    f2p, _id_list(row.get("PASS_TO_PASS"), f"{where}: PASS_TO_PASS"),
                    text["created_at"], text["source"] or "import", text["split"], text["mutation"],
                    text["validation"])


def _rows(path: str) -> Iterable[tuple[str, dict[str, Any]]]:
    """``(where, row)`` for each row of a JSONL or Parquet file, local or any fsspec URL (``s3://``)."""
    import fsspec

    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        with fsspec.open(path, "rb") as fh:
            table = pq.read_table(fh)
        for n, r in enumerate(table.to_pylist(), 1):
            yield f"{path} row {n}", r
        return
    with fsspec.open(path, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskFileError(f"{path}:{n}: not JSON: {e}") from e
            if not isinstance(r, dict):
                raise TaskFileError(f"{path}:{n}: expected a JSON object per line")
            yield f"{path}:{n}", r


def read_tasks(path: str | Path) -> list[RepoTask]:
    """Every task of a SWE-bench-format JSONL or Parquet file (duplicate ids are an error: a prediction must
    name one task)."""
    tasks, seen = [], set()
    for where, row in _rows(str(path)):
        task = task_from_row(row, where)
        if task.instance_id in seen:
            raise TaskFileError(f"{where}: instance_id {task.instance_id!r} appears twice")
        seen.add(task.instance_id)
        tasks.append(task)
    return tasks


def write_tasks(tasks: Sequence[RepoTask], path: str | Path) -> None:
    """JSONL (one SWE-bench row per line) or Parquet, by the file's suffix."""
    rows = [t.row() for t in tasks]
    if str(path).endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows, schema=_schema()), str(path))
        return
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _schema():
    import pyarrow as pa

    return pa.schema([(name, pa.string()) for name in RepoTask.__dataclass_fields__])


@dataclass(frozen=True)
class Prediction:
    """One line of a SWE-bench predictions file."""

    instance_id: str
    model_name_or_path: str
    model_patch: str = field(repr=False)


def read_predictions(path: str | Path) -> list[Prediction]:
    preds, seen = [], set()
    for where, row in _rows(str(path)):
        if "instance_id" not in row or "model_patch" not in row:
            raise TaskFileError(f"{where}: a prediction needs instance_id and model_patch")
        iid = str(row["instance_id"])
        if iid in seen:
            raise TaskFileError(f"{where}: a second prediction for {iid!r}")
        seen.add(iid)
        preds.append(Prediction(iid, str(row.get("model_name_or_path") or ""), str(row["model_patch"] or "")))
    return preds
