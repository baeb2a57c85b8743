from __future__ import annotations

from datetime import UTC, datetime

from codemill.config import PipelineConfig
from codemill.flows.hooks import run_name_from, run_tags
from codemill.report import eval_report_markdown, ingest_table, loss_curve_png


def test_run_name_says_what_ran_on_what_and_when():
    cfg = PipelineConfig(name="exp")
    cfg.train.max_steps = 7
    now = datetime(2026, 12, 3, 2, 0, 5, tzinfo=UTC)
    name = run_name_from("pipeline", {"config": cfg, "until": "ingest"}, now)
    assert name == "exp-pipeline-until-ingest-s7-20261203-020005"
    assert run_name_from("nightly", {"config": cfg.model_dump(mode="json")}, now) == "exp-nightly-s7-20261203-020005"
    assert {"codemill", "flow:nightly", "experiment:exp"} <= set(run_tags("nightly", {"config": cfg}))


def test_eval_report_lists_scores_with_ci_and_verdict():
    md = eval_report_markdown("run-1", {"val_bpb": 2.5, "val_bpb_ci_low": 2.4, "val_bpb_ci_high": 2.6, "em": 0.1},
                              {"verdict": "promote", "reason": "better", "registered_model": "m", "alias": "champion",
                               "champion_version": "3"}, {"MLflow run": "http://x/#/runs/1"})
    assert "| val_bpb | 2.5000 | 2.4000 - 2.6000 |" in md
    assert "| em | 0.1000 |  |" in md
    assert "val_bpb_ci_low |" not in md
    assert "**Gate verdict: promote**" in md and "http://x/#/runs/1" in md
    assert "Gate: not run." in eval_report_markdown("r", {}, None, {})


def test_ingest_table_counts_every_reason():
    rows = ingest_table({"files_seen": 10, "files_kept": 6, "rejected_by_reason": {"near_duplicate": 1, "binary": 3},
                         "redactions": {"email": 2}, "redacted_files": 1, "decontamination": {"dropped": [{}]}})
    table = {r["count"]: r["value"] for r in rows}
    assert table == {"files seen": 10, "files kept": 6, "rejected: binary": 3, "rejected: near_duplicate": 1,
                     "files redacted": 1, "redacted: email": 2, "decontaminated": 1}


def test_loss_curve_is_a_png():
    png = loss_curve_png([5.0, 4.0, 3.5], {"2": 4.2})
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


def _rl_out(signal: list[float], kl: float | None = 0.01) -> dict:
    rows = [{"iteration": i, "reward_mean": 0.1 * i, "pass_rate": 0.1 * i, "signal_groups": s, "kl": kl,
             "response_tokens_mean": 40.0, "generation_s": 3.2, "reward_s": 1.1, "rollout_wall_s": 3.4,
             "update_s": 12.5}
            for i, s in enumerate(signal)]
    heldout = {"before": {"rate": 0.25}, "after": {"rate": 0.5}, "gain": 0.25, "gain_ci_low": 0.1,
               "gain_ci_high": 0.4, "p_value": 0.003, "problems": 12}
    return {"iterations": rows, "heldout": heldout, "gate": None, "model_id": "m-" + "0" * 32,
            "parent_run_id": "f" * 32}


def test_rl_summary_fits_80_columns_and_shows_the_learnable_share_per_iteration():
    from codemill.report import rl_summary_lines

    lines = rl_summary_lines(_rl_out([0.5, 0.25], kl=None), 123.4)
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    header = next(line for line in lines if line.lstrip().startswith("iter"))
    assert header.split()[:4] == ["iter", "reward", "pass", "signal"]
    rows = [line.split() for line in lines if line[:4].strip() in ("0", "1")]
    assert [r[3] for r in rows] == ["0.50", "0.25"] and rows[0][4] == "-"  # rft: no kl
    assert header.split()[-3:] == ["s", "update", "s"] and "rollout s" in header
    assert rows[0][-2:] == ["3.4", "12.5"]  # the rollouts' wall time, not their overlapping parts' sums
    assert any("0.250 -> 0.500 (gain +0.250, 95% CI [+0.100, +0.400]" in line for line in lines)
    assert not any(line.startswith("no learnable signal") for line in lines)


def test_rl_summary_warns_once_when_no_group_ever_had_a_signal():
    from codemill.report import rl_summary_lines

    lines = rl_summary_lines(_rl_out([0.0, 0.0, 0.0]), 10.0)
    assert sum(line.startswith("no learnable signal: every group had equal rewards") for line in lines) == 1
    assert not any(line.startswith("no learnable signal")
                   for line in rl_summary_lines(_rl_out([0.0, 0.125]), 10.0))
