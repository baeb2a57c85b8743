"""Grading a predictions file against a task set, in the shape of SWE-bench's harness and its run report.

Each prediction (``instance_id``, ``model_name_or_path``, ``model_patch``) is graded by ``grading.grade_patch``
on its task's snapshot, several at once. The report has SWE-bench's keys (``resolved_ids``, ``unresolved_ids``,
``error_ids``, ``empty_patch_ids``, the counts) plus each instance's test outcomes, why it is not resolved, and
what looked suspicious. A prediction for an instance the tasks do not have is counted (``unknown_ids``); a task
whose repository or commit is missing here is an error of that instance, with the reason, not of the run.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codemill.errors import UserFacingError
from codemill.repos.cache import RepoCache
from codemill.repos.git import repo_folder
from codemill.repos.grading import ERROR, Grade, grade_patch
from codemill.repos.pytest_run import repo_sandbox
from codemill.repos.task import Prediction, RepoTask

if TYPE_CHECKING:
    from codemill.repos.taskset import TaskSet

SCHEMA_VERSION = 2


def grade_predictions(tasks: Sequence[RepoTask], predictions: Sequence[Prediction], repos: Path,
                      cache: RepoCache | None = None, *, workers: int = 2, wall_s: float = 300.0,
                      partial: bool = False, on_grade: Callable[[Grade], None] | None = None,
                      taskset: TaskSet | None = None) -> dict[str, Any]:
    """``taskset``: tasks from a built task set (their snapshots come from its bundles, not from ``repos``)."""
    cache = taskset.cache if taskset is not None else (cache or RepoCache())
    by_id = {t.instance_id: t for t in tasks}
    known = [p for p in predictions if p.instance_id in by_id]
    unknown = sorted(p.instance_id for p in predictions if p.instance_id not in by_id)
    sandbox = repo_sandbox(wall_s)

    def one(pred: Prediction) -> Grade:
        task = by_id[pred.instance_id]
        try:
            if taskset is not None:
                snapshot = taskset.snapshot(task)
                env = taskset.env(task, snapshot)
            else:
                snapshot = cache.snapshot(repo_folder(repos, task.repo), task.base_commit)
                env = cache.env(snapshot)
            grade = grade_patch(task, snapshot, env, pred.model_patch, sandbox, partial=partial)
        except UserFacingError as e:
            grade = Grade(task.instance_id, ERROR, reasons=[str(e)])
        if on_grade is not None:
            on_grade(grade)
        return grade

    with ThreadPoolExecutor(max(1, workers)) as pool:
        grades = list(pool.map(one, known))
    return run_report(tasks, predictions, grades, unknown)


def run_report(tasks: Sequence[RepoTask], predictions: Sequence[Prediction], grades: Sequence[Grade],
               unknown: Sequence[str]) -> dict[str, Any]:
    ids = {s: sorted(g.instance_id for g in grades if g.status == s)
           for s in ("resolved", "unresolved", "error", "empty_patch")}
    completed = sorted(g.instance_id for g in grades if g.status in ("resolved", "unresolved"))
    submitted = sorted({p.instance_id for p in predictions})
    return {
        "total_instances": len(tasks), "submitted_instances": len(submitted),
        "completed_instances": len(completed), "resolved_instances": len(ids["resolved"]),
        "unresolved_instances": len(ids["unresolved"]), "empty_patch_instances": len(ids["empty_patch"]),
        "error_instances": len(ids["error"]), "unknown_instances": len(unknown),
        "completed_ids": completed, "incomplete_ids": sorted(set(submitted) - set(completed)),
        "empty_patch_ids": ids["empty_patch"], "submitted_ids": submitted, "resolved_ids": ids["resolved"],
        "unresolved_ids": ids["unresolved"], "error_ids": ids["error"], "unknown_ids": list(unknown),
        "suspicious_ids": sorted(g.instance_id for g in grades if g.suspicious),
        "instances": {g.instance_id: g.record() for g in sorted(grades, key=lambda g: g.instance_id)},
        "schema_version": SCHEMA_VERSION,
    }


def write_report(report: dict[str, Any], path: Path) -> None:
    """Written whole or not at all (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(report, fh, indent=2)
    os.replace(tmp, path)
