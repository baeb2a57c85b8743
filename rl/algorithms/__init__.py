"""Update rules, one module each, registered here by ``name``.

``ALGORITHMS`` maps a name to the rule; ``codemill.rl.config.AlgorithmConfig`` is the discriminated union of their
configs on ``name``, so the YAML and the Prefect form show the chosen rule's fields only. A rule supplies what its
policy artifact hashes and the job that computes the update (``base.Algorithm``).
"""

from __future__ import annotations

from codemill.rl.algorithms.base import Algorithm, UpdateInputs, UpdateJob
from codemill.rl.algorithms.grpo import GRPO
from codemill.rl.algorithms.rft import RFT

ALGORITHMS: dict[str, Algorithm] = {
    GRPO.name: GRPO(),
    RFT.name: RFT(),
}

__all__ = ["ALGORITHMS", "Algorithm", "UpdateInputs", "UpdateJob", "algorithm"]


def algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown RL algorithm {name!r} (known: {sorted(ALGORITHMS)})") from None
