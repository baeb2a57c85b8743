"""What the judge pool judges: one sample, in the terms its two servers speak. The sandbox does not know where a
sample comes from (a problem set, an RL environment, a mined doctest); its caller builds the request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JudgeRequest:
    """``program``: the candidate's whole program, run in the candidate's sandbox, which answers calls of
    ``entry_point`` with plain data. ``prelude``: trusted code the judge runs first (helpers the tests call).
    ``tests``: defines ``check(candidate)``; all-pass means it returns. ``test_cases``: snippets in terms of
    ``candidate``, each run on its own for partial credit (none: partial credit is the binary verdict)."""

    program: str
    entry_point: str
    tests: str
    test_cases: tuple[str, ...] = ()
    prelude: str = ""
