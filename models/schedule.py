"""Learning-rate schedules: linear warmup, then cosine decay or warmup-stable-decay (WSD), to a floor."""

from __future__ import annotations

import math


def cosine_with_warmup(step: int, *, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr at `step` (0-based): 0 -> 1 over warmup, then cosine 1 -> min_ratio."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    span = max(total - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_stable_decay(step: int, *, warmup: int, total: int, min_ratio: float, decay_fraction: float) -> float:
    """WSD (as in MiniCPM / OpenCoder): warmup, hold the peak, then decay linearly over the last fraction."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    decay_steps = max(1, round(total * decay_fraction))
    decay_start = total - decay_steps
    if step < decay_start:
        return 1.0
    progress = min((step - decay_start + 1) / decay_steps, 1.0)
    return 1.0 - (1.0 - min_ratio) * progress


def lr_multiplier(kind: str, step: int, *, warmup: int, total: int, min_ratio: float,
                  decay_fraction: float = 0.2) -> float:
    if kind == "cosine":
        return cosine_with_warmup(step, warmup=warmup, total=total, min_ratio=min_ratio)
    if kind == "wsd":
        return warmup_stable_decay(step, warmup=warmup, total=total, min_ratio=min_ratio,
                                   decay_fraction=decay_fraction)
    raise ValueError(f"unknown schedule {kind!r}")
