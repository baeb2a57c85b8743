"""The humaneval_infilling suite through the real judge pool (bubblewrap): canonical middles pass, wrong ones
fail; and the whole suite on a tiny FIM-tokenizer model, end to end on a few tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from codemill.evals import infilling as inf
from codemill.evals import suites
from codemill.evals.config import EvalConfig
from codemill.evals.suites import humaneval_infilling as hi
from codemill.evals.suites.base import SuiteRun, load_eval_model
from codemill.problems.humaneval import load_problems

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CFG = EvalConfig(humaneval_infilling={"max_tasks_per_type": 3, "max_new_tokens": 6, "context_len": 512,
                                      "wall_s": 5.0, "workers": 2, "batch_size": 8})


@pytest.fixture(scope="module")
def pool():
    with hi.infilling_pool(CFG) as p:
        yield p


def test_canonical_middles_pass_and_wrong_middles_fail(pool):
    tasks = inf.make_tasks(load_problems().values(), max_per_type=4)
    rows, summary = hi.score_middles(tasks, [t.middle for t in tasks], CFG, pool)
    assert summary["humaneval_infilling_pass_at_1"] == 1.0, rows.filter(rows["outcome"] != "passed")
    assert summary["humaneval_infilling_exact_match"] == 1.0
    assert {summary[hi.type_metric(k)] for k in inf.TASK_TYPES} == {1.0}
    assert summary["tasks"] == {"single_line": 4, "multi_line": 4, "random_span": 4}

    by_id = {t.task_id: t for t in inf.make_tasks([load_problems()["HumanEval/0"]], ("single_line",))}
    last = by_id["SingleLineInfilling/HumanEval/0/L7"]  # "    return False\n"
    wrong = [(last, "    return True\n"), (last, "return False\n"), (tasks[0], "")]
    rows, summary = hi.score_middles([t for t, _ in wrong], [m for _, m in wrong], CFG, pool)
    assert rows["outcome"].to_list() == ["failed"] * 3, rows
    assert rows["exact_match"].to_list() == [0.0] * 3
    assert summary["humaneval_infilling_pass_at_1"] == 0.0
    assert rows["cluster"].to_list() == ["HumanEval/0", "HumanEval/0", tasks[0].problem_id]


@pytest.fixture(scope="module")
def fim_model(policy: Path, tmp_path_factory) -> Path:
    """The tiny untrained policy with an untied random output layer: with tied embeddings a random model repeats
    its last input id, here ``<fim_middle>``, a stop id, so every middle would be empty. Untied, its middles
    differ from task to task, which is what checking them one by one needs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(policy))
    torch.manual_seed(0)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight) * 0.5)
    out = tmp_path_factory.mktemp("fim-model")
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(policy)).save_pretrained(str(out))
    return out


def test_the_suite_on_a_tiny_model_end_to_end(fim_model: Path, tmp_path: Path):
    policy = fim_model
    run = SuiteRun(cfg=CFG, hf_dir=policy, path=lambda n: tmp_path / n, loader=load_eval_model)
    rows, summary = suites.get("humaneval_infilling").run(run)
    assert rows.height == 9 and sorted(set(rows["type"])) == ["multi_line", "random_span", "single_line"]
    assert rows["item_id"].to_list() == [t.task_id for t in inf.make_tasks(load_problems().values(),
                                                                            max_per_type=3)]
    assert set(rows["outcome"]) <= {"passed", "failed", "timed out"} and "skipped" not in summary
    assert summary["sandbox"]["isolation"] == "bwrap"
    for key in ("humaneval_infilling_pass_at_1", *(hi.type_metric(k) for k in inf.TASK_TYPES)):
        assert 0.0 <= summary[f"{key}_ci_low"] <= summary[key] <= summary[f"{key}_ci_high"] <= 1.0
    m = run.model
    ids = inf.fim_ids(m.tokenizer.get_vocab())
    assert ids is not None
    for pred in rows["prediction"]:  # never a sentinel or EOS
        assert not any(s in pred for s in ("<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<|endoftext|>"))
    assert len(set(rows["prediction"])) > 3  # varied middles, so that a mix-up of tasks shows
    # each prediction is the model's own greedy continuation of the task's FIM prompt, one task at a time
    # (no batch, no padding), decoded up to the first stop id
    import torch

    stops = {m.tokenizer.eos_token_id, ids.prefix, ids.middle, ids.suffix}
    h = CFG.humaneval_infilling
    for t, pred in zip(inf.make_tasks(load_problems().values(), max_per_type=3), rows["prediction"],
                       strict=True):
        seq = inf.fim_prompt(lambda s: m.tokenizer(s, add_special_tokens=False)["input_ids"], ids, t.prefix,
                             t.suffix, "psm", h.context_len - h.max_new_tokens)
        new: list[int] = []
        with torch.no_grad():
            while len(new) < h.max_new_tokens:
                nxt = int(m.model(torch.tensor([seq + new])).logits[0, -1].argmax())
                if nxt in stops:
                    break
                new.append(nxt)
        assert pred == m.tokenizer.decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    # deterministic: the same model gives the same middles
    again, _ = suites.get("humaneval_infilling").run(SuiteRun(cfg=CFG, hf_dir=policy, path=lambda n: tmp_path / n))
    assert again["prediction"].to_list() == rows["prediction"].to_list()
    scores = suites.item_scores("humaneval_infilling", rows)
    assert scores["humaneval_infilling_pass_at_1"].binary and len(scores["humaneval_infilling_pass_at_1"].values) == 9
