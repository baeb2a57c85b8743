"""Bug-injection synthesis on a repository the test builds: admission, hidden failing tests, validated tasks."""

from __future__ import annotations

from codemill.repos import git
from codemill.repos.cache import RepoCache
from codemill.repos.evaluate import grade_predictions
from codemill.repos.synthesis import Synthesizer
from codemill.repos.task import Prediction
from tests.integration.repo_fixture import make_repo


def test_synthesised_tasks_are_validated_and_hide_their_failing_tests(tmp_path):
    repo, _ = make_repo(tmp_path)
    cache = RepoCache(tmp_path / "cache")
    report = Synthesizer(cache, tmp_path / "tasks", per_operator=3).synthesize("mathlib", repo)
    summary = report.summary()
    assert summary["admitted"] and summary["tests"] == 5 and summary["pass_rate"] == 1.0
    assert report.tasks and sum(report.validated.values()) == len(report.tasks)
    assert sum(report.tried.values()) == sum(report.dropped.values()) + len(report.tasks)
    for task in report.tasks:
        assert task.source == "synthesis" and task.FAIL_TO_PASS and task.PASS_TO_PASS
        assert task.validation and '"gold": ["resolved", "resolved", "resolved"]' in task.validation
        snapshot = cache.snapshot(tmp_path / "tasks" / "mathlib", task.base_commit)
        assert git.history_leaks(snapshot) == []
        for test_id in task.FAIL_TO_PASS:
            path, name = test_id.split("::")[0], test_id.split("::")[-1].split("[")[0]
            assert f"def {name}(" not in (snapshot / path).read_text(), "a failing test is visible to the agent"
            assert f"def {name}(" in task.test_patch
        changed = [ln[1:].strip() for ln in task.patch.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++",
                                                                                                      "---")]
        assert not any(len(c) > 8 and c in task.problem_statement for c in changed), "the statement leaks the diff"
    # The tasks are SWE-bench instances of the task repository: the gold patches grade as resolved there.
    preds = [Prediction(t.instance_id, "gold", t.patch) for t in report.tasks]
    out = grade_predictions(report.tasks, preds, tmp_path / "tasks", cache)
    assert out["resolved_ids"] == sorted(t.instance_id for t in report.tasks)


def test_a_repository_whose_suite_mostly_fails_is_not_admitted(tmp_path):
    repo, _ = make_repo(tmp_path)
    (repo / "tests" / "test_broken.py").write_text("".join(f"def test_{i}():\n    assert False\n\n"
                                                           for i in range(30)))
    git.git(repo, "add", "-A")
    git.git(repo, "commit", "-qm", "broken tests")
    report = Synthesizer(RepoCache(tmp_path / "cache"), tmp_path / "tasks").synthesize("mathlib", repo)
    assert not report.admission.admitted and report.tasks == [] and sum(report.tried.values()) == 0
    assert report.admission.reason == "14% of 35 tests pass (needs 80%)"
    (repo / "tests" / "conftest.py").write_text("def broken(:\n")
    git.git(repo, "add", "-A")
    git.git(repo, "commit", "-qm", "a conftest that does not parse")
    stopped = Synthesizer(RepoCache(tmp_path / "cache"), tmp_path / "tasks").synthesize("mathlib", repo)
    assert not stopped.admission.admitted and stopped.admission.reason.startswith("the suite does not run")
