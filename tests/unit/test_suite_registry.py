"""The suite registry is the one place the evaluate stage, the gate and the CLI learn about suites."""

from typing import get_args

import numpy as np
import polars as pl
import pytest

from codemill.evals import suites
from codemill.evals.config import SUITES, EvalConfig, SuiteName
from codemill.stage_config import StageConfig


def test_every_suite_name_is_registered_with_a_config_section_and_unique_metrics():
    assert set(suites.REGISTRY) == set(get_args(SuiteName)) == set(SUITES)
    cfg = EvalConfig()
    metric_names = [m.name for s in suites.REGISTRY.values() for m in s.metrics]
    assert len(metric_names) == len(set(metric_names))
    for name, suite in suites.REGISTRY.items():
        assert suite.name == name
        assert isinstance(suite.config(cfg), StageConfig)
        assert all(m.hold_margin > 0 for m in suite.metrics)  # an uncalibrated gate holds tiny differences


def test_the_default_suites_leave_out_those_that_are_opt_in():
    assert set(EvalConfig().suites) == {name for name in SUITES if suites.get(name).default}
    assert "repo_tasks" not in EvalConfig().suites  # it needs repository tasks, which the defaults lack


def test_unknown_suite_names_the_known_ones():
    with pytest.raises(ValueError,
                       match=f"unknown suite 'nope'; known: {', '.join(SUITES)}$"):
        suites.get("nope")


def test_item_scores_keep_direction_weights_and_binary_flags():
    bpb = pl.DataFrame({"item_id": ["a", "b"], "cluster": ["r", "r"], "nll_bits": [10.0, 30.0], "bytes": [5, 10]})
    (s,) = suites.item_scores("bpb", bpb).values()
    assert not s.higher_is_better and not s.binary and s.weights.tolist() == [5.0, 10.0]
    he = pl.DataFrame({"item_id": ["t/1", "t/0", "t/0"], "cluster": ["t/1", "t/0", "t/0"],
                       "mode": ["greedy", "greedy", "sampled"], "outcome": ["failed", "passed", "passed"]})
    p = suites.item_scores("humaneval", he)["humaneval_pass_at_1"]
    assert p.binary and p.higher_is_better and p.item_ids.tolist() == ["t/0", "t/1"]
    assert np.array_equal(p.values, [1.0, 0.0])
