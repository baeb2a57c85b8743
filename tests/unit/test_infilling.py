"""HumanEval infilling: the task construction (Bavarian et al. 2022's counts, exact reconstruction), the FIM
prompt layout against the training layout (``data.fim``), and the skip of a model without FIM sentinels."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from codemill.data import fim
from codemill.data.tokenizer import EOS_TOKEN, FIM_TOKENS, PAD_TOKEN, train_bpe
from codemill.evals import infilling as inf
from codemill.evals import suites
from codemill.evals.config import EvalConfig
from codemill.evals.suites import humaneval_infilling as hi
from codemill.evals.suites.base import EvalModel, SuiteRun
from codemill.problems.humaneval import load_problems
from codemill.problems.problem import ExecProblem
from codemill.report import skipped_suites, summary_lines
from codemill.tasks.evaluate import metrics_of


@pytest.fixture(scope="module")
def problems() -> dict[str, ExecProblem]:
    return load_problems()


@pytest.fixture(scope="module")
def tasks(problems) -> list[inf.InfillTask]:
    return inf.make_tasks(problems.values())


def test_counts_per_type_are_the_papers(tasks):
    assert Counter(t.type for t in tasks) == inf.PAPER_COUNTS == {"single_line": 1033, "multi_line": 5815,
                                                                  "random_span": 1640}
    assert len({t.task_id for t in tasks}) == len(tasks)
    assert len({t.problem_id for t in tasks}) == 164


def test_every_task_reconstructs_the_canonical_solution_exactly(problems, tasks):
    for t in tasks:
        p = problems[t.problem_id]
        assert t.prefix + t.middle + t.suffix == p.prompt + p.reference_solution, t.task_id
        assert t.prefix.startswith(p.prompt) and t.completion(t.middle) == p.reference_solution, t.task_id


def test_line_tasks_are_whole_lines_between_non_blank_lines(problems, tasks):
    first = {t.task_id: t for t in tasks if t.problem_id == "HumanEval/0"}
    # HumanEval/0's solution: 7 non-blank lines (index 6 is blank), so 7 single-line and 28 multi-line tasks
    assert [k.rsplit("/", 1)[1] for k in first if k.startswith("Single")] == ["L0", "L1", "L2", "L3", "L4", "L5",
                                                                               "L7"]
    assert sum(k.startswith("Multi") for k in first) == 28
    lines = problems["HumanEval/0"].reference_solution.split("\n")
    assert first["SingleLineInfilling/HumanEval/0/L3"].middle == lines[3] + "\n"
    assert first["MultiLineInfilling/HumanEval/0/L5_L7"].middle == "\n".join(lines[5:8]) + "\n"
    for t in tasks:
        if t.type != "random_span":
            assert t.middle.strip() and t.middle.endswith("\n") and t.prefix.endswith("\n"), t.task_id


def test_random_spans_are_fixed_and_the_subsample_is_deterministic(problems):
    one = [problems["HumanEval/3"]]
    assert inf.problem_tasks(one[0], "random_span") == inf.problem_tasks(one[0], "random_span")
    assert len({(t.prefix, t.middle) for t in inf.problem_tasks(one[0], "random_span")}) > 5
    sub = inf.make_tasks(problems.values(), ("single_line", "random_span"), max_per_type=7)
    assert Counter(t.type for t in sub) == {"single_line": 7, "random_span": 7}
    assert sub == inf.make_tasks(load_problems().values(), ("single_line", "random_span"), max_per_type=7)
    assert len({t.problem_id for t in sub}) > 7  # spread over problems, not the first few
    with pytest.raises(ValueError, match="unknown infilling type"):
        inf.problem_tasks(one[0], "whole_file")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import PreTrainedTokenizerFast

    texts = [p.prompt + (p.reference_solution or "") for p in load_problems().values()]
    tok = train_bpe(texts, 600, min_frequency=2)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                   additional_special_tokens=FIM_TOKENS)


def _encode(tok):
    return lambda text: tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("mode", ["psm", "spm"])
def test_the_prompt_is_the_training_document_up_to_its_middle(tokenizer, tasks, mode):
    """The training document (``fim.assemble`` of separately encoded parts) starts with the prompt; the
    middle's ids follow it."""
    ids = inf.fim_ids(tokenizer.get_vocab())
    assert ids is not None
    enc = _encode(tokenizer)
    for t in tasks[::400]:
        prompt = inf.fim_prompt(enc, ids, t.prefix, t.suffix, mode, budget=10**6)
        middle = enc(t.middle)
        assert prompt + middle == fim.assemble(mode, [enc(t.prefix), middle, enc(t.suffix)], ids)
        p, s = enc(t.prefix), enc(t.suffix)
        if mode == "psm":
            assert prompt == [ids.prefix, *p, ids.suffix, *s, ids.middle]
        else:
            assert prompt == [ids.prefix, ids.suffix, *s, ids.middle, *p]


def test_a_long_prompt_keeps_its_sentinels_the_end_of_the_prefix_and_the_start_of_the_suffix(tokenizer, tasks):
    ids = inf.fim_ids(tokenizer.get_vocab())
    enc = _encode(tokenizer)
    t = max(tasks, key=lambda t: len(t.prefix))
    prompt = inf.fim_prompt(enc, ids, t.prefix, t.suffix, "psm", budget=40)
    assert len(prompt) == 40 and prompt[0] == ids.prefix and prompt[-1] == ids.middle
    cut = prompt.index(ids.suffix)
    assert prompt[1:cut] == enc(t.prefix)[-(cut - 1):]
    assert prompt[cut + 1:-1] == enc(t.suffix)[:len(prompt) - cut - 2]
    assert inf.fit(list(range(100)), [7, 8], 10) == (list(range(92, 100)), [7, 8])
    assert inf.fit([1, 2], list(range(100)), 10) == ([1, 2], list(range(8)))
    assert inf.fit(list(range(100)), list(range(100)), 10) == (list(range(95, 100)), list(range(5)))


def test_the_context_must_leave_room_for_a_prompt():
    with pytest.raises(ValueError, match="leaves no room for a prompt"):
        EvalConfig(humaneval_infilling={"max_new_tokens": 64, "context_len": 70})
    assert EvalConfig(humaneval_infilling={"max_new_tokens": 64, "context_len": 80}).humaneval_infilling


class _NoModel:
    def __getattr__(self, name):
        raise AssertionError("a skipped suite must not run the model")


def test_a_tokenizer_without_sentinels_skips_the_suite_with_its_reason(tmp_path: Path):
    from transformers import PreTrainedTokenizerFast

    plain = PreTrainedTokenizerFast(tokenizer_object=train_bpe(["def f():\n    return 1\n"] * 20, 300, 2,
                                                               special_tokens=[EOS_TOKEN, PAD_TOKEN]),
                                    eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    model = EvalModel(_NoModel(), plain, device=None)  # type: ignore[arg-type]
    run = SuiteRun(cfg=EvalConfig(), hf_dir=tmp_path, path=lambda n: tmp_path / n, loader=lambda _: model)
    rows, summary = suites.get("humaneval_infilling").run(run)
    assert rows.height == 0 and set(rows.columns) >= {"item_id", "cluster", "type", "middle", "prediction",
                                                      "outcome", "exact_match"}
    assert set(summary) == {"skipped"} and "<fim_prefix>" in summary["skipped"]
    assert metrics_of(summary) == {}  # no metrics, not zeros
    assert suites.item_scores("humaneval_infilling", rows) == {}  # the gate leaves the metric out
    rows.write_parquet(tmp_path / "rows.parquet")
    assert pl.read_parquet(tmp_path / "rows.parquet").height == 0
    stages = {"eval:humaneval_infilling": {"status": "ran", "summary": {"suite": "humaneval_infilling",
                                                                         **summary},
                                           "ref": {"name": "humaneval_infilling", "digest": "0" * 64}}}
    assert skipped_suites(stages) == {"humaneval_infilling": summary["skipped"]}
    text = "\n".join(summary_lines({"stages": stages, "scores": {}}, 1.0))
    assert "humaneval_infilling: skipped (the model's tokenizer has no fill-in-the-middle" in text


def test_item_scores_are_pass_and_exact_match_per_task_clustered_by_problem():
    rows = pl.DataFrame({"item_id": ["b", "a"], "cluster": ["HumanEval/1", "HumanEval/0"],
                         "type": ["single_line", "multi_line"], "middle": ["x", "y"], "prediction": ["x", "z"],
                         "outcome": ["passed", "failed"], "error": ["", ""], "exact_match": [1.0, 0.0]},
                        schema=hi.SCHEMA)
    s = suites.item_scores("humaneval_infilling", rows)
    p = s["humaneval_infilling_pass_at_1"]
    assert p.binary and p.item_ids.tolist() == ["a", "b"] and p.values.tolist() == [0.0, 1.0]
    assert p.clusters.tolist() == ["HumanEval/0", "HumanEval/1"]
    assert s["humaneval_infilling_exact_match"].values.tolist() == [0.0, 1.0]
