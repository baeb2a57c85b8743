"""Plans for store tests: a distinct artifact per ``tag``, addressed like any stage's."""

from __future__ import annotations

from codemill.plan import StagePlan


def scratch_plan(tag: str, stage: str = "stage", name: str = "thing") -> StagePlan:
    return StagePlan(stage=stage, name=name, code_version="t1", config={"tag": tag})
