"""What a run shows people: the eval report as markdown, ingest counts as table rows, the loss curve as PNG.

Plain functions (no Prefect, no MLflow) so the flows publish the same content to both UIs.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any


def eval_report_markdown(title: str, scores: Mapping[str, float], gate: Mapping[str, Any] | None,
                         links: Mapping[str, str]) -> str:
    """Scores with their 95% CIs, the gate verdict, and where to look next."""
    lines = [f"# {title}", "", "| metric | value | 95% CI |", "|---|---|---|"]
    for key in sorted(k for k in scores if "_ci_" not in k):
        low, high = scores.get(f"{key}_ci_low"), scores.get(f"{key}_ci_high")
        ci = f"{low:.4f} - {high:.4f}" if low is not None and high is not None else ""
        lines.append(f"| {key} | {scores[key]:.4f} | {ci} |")
    lines.append("")
    if gate:
        lines += [f"**Gate verdict: {gate['verdict']}** ({gate.get('reason', '')}); "
                  f"{gate.get('registered_model')}@{gate.get('alias')} = version {gate.get('champion_version')}", ""]
    else:
        lines += ["Gate: not run.", ""]
    lines += [f"- {name}: {url}" for name, url in links.items()]
    return "\n".join(lines)


def ingest_table(stats: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per counted outcome of the ingest stage: kept, each rejection reason (duplicates included),
    redactions by kind, decontamination drops."""
    rows = [{"count": "files seen", "value": stats.get("files_seen")},
            {"count": "files kept", "value": stats.get("files_kept")}]
    rows += [{"count": f"rejected: {reason}", "value": n}
             for reason, n in sorted((stats.get("rejected_by_reason") or {}).items())]
    rows.append({"count": "files redacted", "value": stats.get("redacted_files")})
    for kind, n in sorted((stats.get("redactions") or {}).items()):
        rows.append({"count": f"redacted: {kind}", "value": n})
    dropped = (stats.get("decontamination") or {}).get("dropped")
    if dropped is not None:
        rows.append({"count": "decontaminated", "value": len(dropped)})
    return [r for r in rows if r["value"] is not None]


def loss_curve_png(losses: Sequence[float], val_losses: Mapping[int, float] | Mapping[str, float] | None = None,
                   title: str = "training loss") -> bytes:
    """Train loss per step (and val loss at checkpoints) as a small PNG. `val_losses` keys may be strings: a
    training summary read back from JSON."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5), dpi=90)
    ax = fig.add_subplot()
    ax.plot(range(1, len(losses) + 1), losses, label="train", linewidth=1.2)
    if val_losses:
        points = sorted((int(step), loss) for step, loss in val_losses.items())
        ax.plot([step for step, _ in points], [loss for _, loss in points], "o-", label="val")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
