"""Rewards as a library call: per-sample verdicts on problems from the judge pool, for RL and for the eval
suites alike.

``score(problems, samples, pool)`` runs every (problem id, completion) through the sandboxed judge and
returns a binary all-pass reward, partial credit (the fraction of a problem's separate test cases that
pass; equal to the binary reward when the problem has none), the outcome and duration of each sample, and
a count per batch of the samples that deserve a look (timed out, killed, exited before answering, no
verdict, bad data) — in RL these are the first sign that a policy probes the grader.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from codemill.problems.problem import ExecProblem
from codemill.sandbox.judge_pool import JudgePool


@dataclass(frozen=True)
class Reward:
    problem_id: str
    sample_idx: int
    passed: bool
    partial: float
    outcome: str
    error: str
    duration_s: float
    suspicious: str | None = None  # why the sample deserves a look (timed out, killed, exited, ...), if it does
    waited_s: float = 0.0  # time the machine's load made it wait for a CPU, not counted against its wall clock
    retried: bool = False  # judged again, alone, after the load held it back to the backstop (that verdict counts)

    @property
    def reward(self) -> float:
        return 1.0 if self.passed else 0.0


@dataclass(frozen=True)
class RewardBatch:
    rewards: list[Reward]
    suspicious: dict[str, int]

    @property
    def pass_rate(self) -> float:
        return sum(r.passed for r in self.rewards) / len(self.rewards) if self.rewards else 0.0


def score(problems: Mapping[str, ExecProblem], samples: Sequence[tuple[str, str]], pool: JudgePool,
          on_done: Callable[[int, int], None] | None = None) -> RewardBatch:
    """Rewards in input order; ``sample_idx`` counts each problem's samples in input order."""
    unknown = sorted({pid for pid, _ in samples} - set(problems))
    if unknown:
        raise ValueError(f"samples name unknown problem ids: {unknown[:5]}")
    judged = pool.judge_all([problems[pid].request(completion) for pid, completion in samples], on_done)
    counter: dict[str, int] = defaultdict(int)
    rewards: list[Reward] = []
    suspicious: Counter[str] = Counter()
    for (pid, _), j in zip(samples, judged, strict=True):
        rewards.append(Reward(pid, counter[pid], j.passed, j.partial, str(j.outcome), j.error, j.duration_s,
                              j.suspicious, j.waited_s, j.retried))
        counter[pid] += 1
        if j.suspicious:
            suspicious[j.suspicious] += 1
    return RewardBatch(rewards, dict(sorted(suspicious.items())))
