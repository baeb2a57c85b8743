"""Update rules, one module each, registered here by ``name``.

``ALGORITHMS`` maps a name to the rule; ``codemill.rl.config.AlgorithmConfig`` is the discriminated union of their
configs on ``name`` (each rule's config is declared in its module, ``settings``), so the YAML and the Prefect form
show the chosen rule's fields only. A rule supplies what its policy artifact hashes and the job that computes the
update (``base.Algorithm``). Adding a rule is its module (ending in ``ALGORITHM = <the rule>``) plus its name in
``RULE_MODULES``.
"""

from __future__ import annotations

from codemill.registry import plugins
from codemill.rl.algorithms.base import Algorithm, AlgorithmSettings, UpdateInputs, UpdateJob

RULE_MODULES = ("grpo", "rft")  # each module's ALGORITHM is registered
ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in plugins(__name__, RULE_MODULES, "ALGORITHM")}
DEFAULT_ALGORITHM = "grpo"

__all__ = ["ALGORITHMS", "DEFAULT_ALGORITHM", "Algorithm", "AlgorithmSettings", "UpdateInputs", "UpdateJob",
           "algorithm"]


def algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown RL algorithm {name!r} (known: {sorted(ALGORITHMS)})") from None
