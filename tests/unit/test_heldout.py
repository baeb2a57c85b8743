"""The held-out comparison of two policies: pass rates per problem, paired."""

from __future__ import annotations

import pytest

from codemill.evals.heldout import compare_pass_rates, pass_rate


def _rows(rates: dict[str, list[int]]) -> list[dict]:
    return [{"problem_id": p, "reward": float(v), "outcome": "passed" if v else "failed"}
            for p, vs in rates.items() for v in vs]


def test_pass_rate_counts_passed_outcomes_with_a_cluster_interval() -> None:
    r = pass_rate(_rows({"a": [1, 1, 0, 0], "b": [0, 0, 0, 0]}))
    assert r.rate == 0.25 and r.problems == 2 and r.samples == 8
    assert r.ci_low <= 0.25 <= r.ci_high
    partial = [{"problem_id": "a", "reward": 0.5, "outcome": "failed"}]
    assert pass_rate(partial).rate == 0.0  # partial credit is not a pass


def test_a_consistent_gain_is_significant_and_no_change_is_not() -> None:
    before = _rows({f"p{i}": [1, 0, 0, 0] for i in range(30)})
    after = _rows({f"p{i}": [1, 1, 1, 0] if i % 3 else [1, 0, 0, 0] for i in range(30)})
    c = compare_pass_rates(before, after)
    assert c.before.rate == pytest.approx(0.25) and c.after.rate == pytest.approx(0.25 + 20 / 30 * 0.5)
    assert c.gain == pytest.approx(c.after.rate - c.before.rate)
    assert c.gain_ci_low > 0 and c.p_value < 1e-4 and c.problems == 30
    same = compare_pass_rates(before, before)
    assert same.gain == 0 and same.p_value == 1.0
    worse = compare_pass_rates(after, before)
    assert worse.gain < 0 and worse.gain_ci_high < 0


def test_only_shared_problems_are_paired() -> None:
    c = compare_pass_rates(_rows({"a": [0, 0], "b": [1, 1]}), _rows({"a": [1, 1], "c": [0, 0]}))
    assert c.problems == 1 and c.before.rate == 0 and c.after.rate == 1
    with pytest.raises(ValueError, match="share no problem"):
        compare_pass_rates(_rows({"a": [1]}), _rows({"b": [1]}))
