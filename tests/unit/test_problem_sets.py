"""The pure pieces of the problems stage: reading HumanEval-format files, the synthetic family, the check,
dedup, decontamination and split steps; references verified on the real sandbox judge pool."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from codemill.data.config import DecontaminationConfig
from codemill.data.sources import SourceError
from codemill.problems.config import ProblemsConfig, ProblemSourceConfig
from codemill.problems.problem import ExecProblem
from codemill.problems.sets import (
    ProblemFileError,
    build_problem_set,
    decontaminate,
    exact_dedup,
    fingerprint_problem_sources,
    malformed_reason,
    read_problem_file,
    read_problem_set,
    source_labels,
    split_of,
    verify,
)
from codemill.problems.synthetic import STEPS, TEMPLATES, steps_problems, synthetic_problems
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool

GOOD = {"task_id": "mine/0", "prompt": "def double(x):\n    \"\"\"Twice x.\"\"\"\n", "entry_point": "double",
        "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-1) == -2\n",
        "canonical_solution": "    return 2 * x\n"}


@pytest.fixture(scope="module")
def pool():
    with JudgePool(Limits(wall_s=10, cpu_s=10), workers=2) as p:
        yield p


def _jsonl(path: Path, rows: list, gz: bool = False) -> Path:
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


# --- reading --------------------------------------------------------------------------------------------------
def test_a_jsonl_file_and_its_gzip_read_alike(tmp_path):
    rows = [GOOD, {**GOOD, "task_id": 7, "canonical_solution": None, "split_unit": "unit-a"}]
    plain = read_problem_file(str(_jsonl(tmp_path / "p.jsonl", rows)), "jsonl", {}, "p")
    gz = read_problem_file(str(_jsonl(tmp_path / "p.jsonl.gz", rows, gz=True)), "jsonl", {}, "p")
    assert plain == gz
    assert [p.problem_id for p in plain] == ["mine/0", "7"]
    assert plain[0].reference_solution == GOOD["canonical_solution"] and plain[0].split_unit == "mine/0"
    assert plain[1].reference_solution is None and plain[1].split_unit == "unit-a" and plain[1].source == "p"


def test_a_malformed_line_names_the_file_and_line(tmp_path):
    path = _jsonl(tmp_path / "bad.jsonl", [GOOD, "", '{"task_id": "x", "prompt": ', GOOD])
    with pytest.raises(ProblemFileError, match=rf"{tmp_path}/bad.jsonl:3: not valid JSON"):
        read_problem_file(str(path), "jsonl", {}, "bad")
    path = _jsonl(tmp_path / "list.jsonl", [GOOD, "[1, 2]"])
    with pytest.raises(ProblemFileError, match=r"list.jsonl:2: not a JSON object \(got list\)"):
        read_problem_file(str(path), "jsonl", {}, "list")


def test_a_missing_or_mistyped_field_names_the_field_and_line(tmp_path):
    no_entry = {k: v for k, v in GOOD.items() if k != "entry_point"}
    path = _jsonl(tmp_path / "m.jsonl", [GOOD, GOOD, no_entry])
    with pytest.raises(ProblemFileError, match=r"m.jsonl:3: missing field 'entry_point'"):
        read_problem_file(str(path), "jsonl", {}, "m")
    path = _jsonl(tmp_path / "t.jsonl", [{**GOOD, "prompt": 5}])
    with pytest.raises(ProblemFileError, match=r"t.jsonl:1: field 'prompt' must be a string, got int"):
        read_problem_file(str(path), "jsonl", {}, "t")


def test_parquet_files_read_and_a_damaged_one_is_named(tmp_path):
    pl.DataFrame([GOOD]).write_parquet(tmp_path / "p.parquet")
    (got,) = read_problem_file(str(tmp_path / "p.parquet"), "parquet", {}, "pq")
    assert got.entry_point == "double" and got.reference_solution == GOOD["canonical_solution"]
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ProblemFileError, match=r"broken.parquet: not a readable Parquet file"):
        read_problem_file(str(tmp_path / "broken.parquet"), "parquet", {}, "pq")
    pl.DataFrame([{k: v for k, v in GOOD.items() if k != "test"}]).write_parquet(tmp_path / "nt.parquet")
    with pytest.raises(ProblemFileError, match=r"nt.parquet: missing column 'test'"):
        read_problem_file(str(tmp_path / "nt.parquet"), "parquet", {}, "pq")


def test_a_missing_path_is_a_clear_error_and_a_changed_file_changes_the_fingerprint(tmp_path):
    missing = ProblemsConfig(sources=[ProblemSourceConfig(kind="jsonl", path=str(tmp_path / "nope.jsonl"))])
    with pytest.raises(SourceError, match=r"nope.jsonl'?: path does not exist"):
        fingerprint_problem_sources(missing)
    path = _jsonl(tmp_path / "p.jsonl", [GOOD])
    cfg = ProblemsConfig(sources=[ProblemSourceConfig(kind="jsonl", path=str(path)), ProblemSourceConfig()])
    (before,) = fingerprint_problem_sources(cfg)  # the synthetic source has no fingerprint: its config is hashed
    assert before["name"] == "p.jsonl" and before["files"] == 1
    _jsonl(path, [{**GOOD, "canonical_solution": "    return x + x\n"}])
    assert fingerprint_problem_sources(cfg)[0]["fingerprint"] != before["fingerprint"]


def test_source_labels_are_unique():
    srcs = [ProblemSourceConfig(kind="jsonl", path="a/p.jsonl"), ProblemSourceConfig(kind="jsonl", path="b/p.jsonl"),
            ProblemSourceConfig(), ProblemSourceConfig(kind="mined", name="doctests")]
    assert source_labels(srcs) == ["p.jsonl", "p.jsonl#1", "synthetic", "doctests"]


# --- synthetic ------------------------------------------------------------------------------------------------
def test_the_synthetic_family_is_deterministic_and_well_formed():
    a, b = synthetic_problems(3, 40), synthetic_problems(3, 40)
    assert a == b and len(a) == 40 and len({p.problem_id for p in a}) == 40
    assert synthetic_problems(4, 40) != a
    assert synthetic_problems(3, 10) == a[:10]  # a prefix: a bigger count only adds problems
    assert {p.split_unit for p in a} == {f"synthetic/{t.name}" for t in TEMPLATES}
    for p in a:
        assert malformed_reason(p) is None and 3 <= len(p.test_cases) <= 5
        assert p.reference_solution is not None and p.reference_solution.count("\n") == 1  # one-line body
        assert f"def {p.entry_point}(" in p.prompt and '"""' in p.prompt
    assert len(synthetic_problems(0, 10_000)) < 10_000  # each template has finitely many constants


def test_synthetic_references_pass_and_wrong_answers_fail_in_the_sandbox(pool):
    problems = synthetic_problems(0, 26)
    right = pool.judge_all([p.request(p.reference_solution or "") for p in problems])
    assert [j.kind for j in right] == ["passed"] * len(problems)
    wrong = pool.judge_all([p.request("    return None\n") for p in problems])
    assert not any(j.passed for j in wrong)


def test_the_steps_family_is_distinct_compositions_split_by_sequence():
    a = synthetic_problems(3, 300, family="steps")
    assert a == steps_problems(3, 300) and steps_problems(3, 40) == a[:40] and steps_problems(4, 40) != a[:40]
    assert len({p.problem_id for p in a}) == 300 and all(p.split_unit == p.problem_id for p in a)
    phrases = {s.phrase: s for s in STEPS}
    for p in a:
        assert malformed_reason(p) is None and 3 <= len(p.test_cases) <= 5 and p.entry_point == "f"
        doc = p.prompt.split('"""')[1].split("\n")[0]
        named = [phrases[ph] for ph in doc.removesuffix(". Return the result.").split("; ")[1:]]
        assert 2 <= len(named) <= 3
        assert p.reference_solution == "".join(f"    {s.line}\n" for s in named) + "    return x\n"
    assert len(steps_problems(0, 10_000)) == len(STEPS) ** 2 + len(STEPS) ** 3  # every sequence once
    assert synthetic_problems(0, 40) == synthetic_problems(0, 40, family="templates")  # the default is unchanged


def test_steps_references_pass_and_a_wrong_step_fails_in_the_sandbox(pool):
    problems = steps_problems(0, 26)
    right = pool.judge_all([p.request(p.reference_solution or "") for p in problems])
    assert [j.kind for j in right] == ["passed"] * len(problems)
    dropped_step = [p.request("".join((p.reference_solution or "").splitlines(keepends=True)[1:])) for p in problems]
    assert sum(j.passed for j in pool.judge_all(dropped_step)) <= 2  # a step that is not the identity matters


def test_the_family_option_keeps_the_default_digest():
    assert "family" not in ProblemSourceConfig(kind="synthetic").digest_config()
    assert ProblemSourceConfig(kind="synthetic", family="steps").digest_config()["family"] == "steps"


# --- steps ----------------------------------------------------------------------------------------------------
def _p(pid: str, **kw) -> ExecProblem:
    base = {"prompt": GOOD["prompt"], "entry_point": "double", "tests": GOOD["test"],
            "reference_solution": GOOD["canonical_solution"], "source": "s", "split_unit": pid}
    return ExecProblem(problem_id=pid, **{**base, **kw})


def test_malformed_problems_are_named():
    assert malformed_reason(_p("a")) is None
    assert malformed_reason(_p("a", prompt="  \n")) == "empty prompt"
    assert "is not a name" in (malformed_reason(_p("a", entry_point="dou ble")) or "")
    assert "do not parse" in (malformed_reason(_p("a", tests="def check(candidate):\nassert")) or "")
    assert malformed_reason(_p("a", tests="def test(candidate):\n    pass\n")) == "tests define no check(candidate)"


def test_verify_keeps_passing_and_unverified_and_drops_failing_references():
    problems = [_p("ok"), _p("bad", reference_solution="    return x\n"), _p("noref", reference_solution=None),
                _p("exits", reference_solution="    import os\n    os._exit(0)\n")]
    fast = JudgePool(Limits(wall_s=3, cpu_s=1), workers=2)
    counts: dict[str, int] = {}
    with fast:
        kept, dropped = verify(problems, fast.judge_all, counts=counts)
    assert [p.problem_id for p in kept] == ["ok", "noref"]
    assert [(r.problem.problem_id, r.reason) for r in dropped] == [("bad", "reference_failed"),
                                                                   ("exits", "reference_failed")]
    assert dropped[0].detail.startswith("failed") and "exited with status 0" in dropped[1].detail
    assert counts == {"rejudged": 2}  # the exit is judged twice more (load can fake one); the wrong answer not


def test_exact_dedup_ignores_trailing_whitespace_and_blank_lines_and_refuses_a_taken_id():
    a = _p("a")
    same = _p("b", prompt=GOOD["prompt"].replace("\n", "   \n") + "\n\n", tests="\n" + GOOD["test"])
    other_tests = _p("c", tests=GOOD["test"] + "    assert candidate(0) == 0\n")
    taken = _p("a", prompt="def double(y):\n    pass\n")
    kept, dropped = exact_dedup([a, same, other_tests, taken])
    assert [p.problem_id for p in kept] == ["a", "c"]
    assert [(r.problem.problem_id, r.reason) for r in dropped] == [("b", "duplicate"), ("a", "duplicate_id")]


def test_problems_overlapping_humaneval_are_dropped():
    from codemill.problems.humaneval import load_problems

    he = load_problems()["HumanEval/0"]
    copied_prompt = _p("he-prompt", prompt=he.prompt, entry_point=he.entry_point)
    copied_ref = _p("he-ref", reference_solution=load_problems()["HumanEval/12"].reference_solution)
    clean = synthetic_problems(0, 26)
    kept, dropped = decontaminate([copied_prompt, *clean, copied_ref], DecontaminationConfig())
    assert kept == clean
    assert [(r.problem.problem_id, r.reason) for r in dropped] == [("he-prompt", "contaminated"),
                                                                   ("he-ref", "contaminated")]
    assert "HumanEval/0" in dropped[0].detail and "reference" in dropped[1].detail
    assert decontaminate([copied_prompt], DecontaminationConfig(enabled=False))[0] == [copied_prompt]


def test_the_split_is_by_unit_and_deterministic():
    cfg = ProblemsConfig(val_fraction=0.5)
    problems = synthetic_problems(0, 130)
    by_unit: dict[str, set[str]] = {}
    for p in problems:
        by_unit.setdefault(p.split_unit, set()).add(split_of(p, cfg))
    assert all(len(s) == 1 for s in by_unit.values())  # a template never straddles train and val
    assert {next(iter(s)) for s in by_unit.values()} == {"train", "val"}
    assert [split_of(p, cfg) for p in problems] == [split_of(p, cfg) for p in synthetic_problems(0, 130)]
    assert split_of(_p("x"), cfg.model_copy(update={"split_salt": "other"})) in ("train", "val")


def test_build_problem_set_counts_every_step_per_source(pool, tmp_path):
    rows = [GOOD, {**GOOD, "task_id": "mine/1", "canonical_solution": "    return x\n"},  # reference fails
            {**GOOD, "task_id": "mine/2", "prompt": GOOD["prompt"] + "\n"},  # a duplicate of mine/0
            {**GOOD, "task_id": "mine/3", "test": "assert True\n"},  # malformed: no check
            {**GOOD, "task_id": "mine/4", "test": GOOD["test"] + "    assert candidate(5) == 10\n",
             "canonical_solution": None}]  # unverified
    path = _jsonl(tmp_path / "mine.jsonl", rows)
    cfg = ProblemsConfig(sources=[ProblemSourceConfig(kind="jsonl", path=str(path)),
                                  ProblemSourceConfig(kind="synthetic", count=20)], val_fraction=0.3)
    stats = build_problem_set(cfg, tmp_path / "out", pool.judge_all)
    assert stats["by_source"]["mine.jsonl"] == {
        "kind": "jsonl", "read": 5, "malformed": 1, "reference_failed": 1, "unverified": 1, "duplicate": 1,
        "contaminated": 0, "kept": 2, "train": stats["by_source"]["mine.jsonl"]["train"],
        "val": stats["by_source"]["mine.jsonl"]["val"]}
    assert stats["by_source"]["synthetic"]["kept"] == 20 and stats["problems"] == 22
    assert stats["splits"]["train"] + stats["splits"]["val"] == 22
    kept = read_problem_set(tmp_path / "out" / "problems.parquet")
    assert [p.problem_id for p in kept][:2] == ["mine/0", "mine/4"] and len(kept) == 22
    assert kept[2] == synthetic_problems(0, 20)[0]
    assert len(read_problem_set(tmp_path / "out" / "problems.parquet", "val")) == stats["splits"]["val"]
    rejected = pl.read_parquet(tmp_path / "out" / "rejected.parquet")
    assert sorted(zip(rejected["problem_id"], rejected["reason"], strict=True)) == [
        ("mine/1", "reference_failed"), ("mine/2", "duplicate"), ("mine/3", "malformed")]
