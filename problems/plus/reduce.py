"""Test-suite reduction (EvalPlus section 2.2): the fewest new inputs that kill what all of them kill.

Set cover is NP-hard; the greedy rule (take the input that kills the most mutants not yet killed, ties to the
earliest input) is within a log factor of the optimum and is what EvalPlus uses. ``covered`` names mutants
that need no new input (e.g. those other tests already kill).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def greedy_cover(kills: Sequence[frozenset[int]], covered: Iterable[int] = ()) -> list[int]:
    """Indices of a small subset of ``kills`` (input -> mutants it kills) whose union equals the union of all
    of them minus ``covered``; in the order chosen."""
    done = set(covered)
    left = set().union(*kills) - done if kills else set()
    chosen: list[int] = []
    while left:
        best = max(range(len(kills)), key=lambda i: (len(kills[i] & left), -i))
        gain = kills[best] & left
        if not gain:  # unreachable: every mutant in left is killed by some input
            break
        chosen.append(best)
        left -= gain
    return chosen
