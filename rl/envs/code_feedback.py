"""``code_feedback``: code with test feedback, a multi-turn episode.

The policy writes a solution (turn 1). The environment runs the problem's **visible** test cases on it in the
sandbox: if one fails and turns remain, it answers with the failures in a fixed format and the prompt again,
and the policy writes the function anew (the next turn continues from exactly the tokens sampled and observed
so far). The episode ends when every visible case passes, or at the last turn (``max_turns``); its reward is
the verdict of the full tests (``tests``: the hidden ones, all of them) on the last solution, binary or partial
as ``rl.rollout.reward`` says. With ``shaping`` > 0 each turn that got feedback also earns ``shaping`` x the
share of visible cases it passed (``turn_rewards``; the trajectory's reward is their sum).

**Visible cases** are the first ``visible_cases`` of the problem's separate ``test_cases``, never all of them:
at least one case stays hidden. A problem with fewer than two cases shows none, so its episode is one turn.
The policy sees only the visible cases' source and the first line of their error (each cut to
``feedback_chars``); the full tests, and any case past the visible ones, never reach it. Each visible case is
judged as its own check in the judge pool (the same trusted side as the rewards), so a candidate cannot forge
what the feedback says any more than its reward.

Feedback format (a Python comment block, so a completion model reads it as code, then the prompt)::

    # Tests: 1 of 2 visible tests failed.
    # FAILED: assert candidate(3) == 10
    #   AssertionError
    # Write the function again.
    <the prompt>
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from codemill.config import CodeFeedbackConfig
from codemill.problems.problem import ExecProblem
from codemill.rl.env import EnvContext, Episode, EpisodeLimits, Reset, StepInfo, StepResult
from codemill.rl.envs.code_exec import prompt_observation, reward_of, verdicts

if TYPE_CHECKING:
    from codemill.models.engines import Completion


def visible_cases(task: ExecProblem, count: int) -> list[str]:
    """The cases the policy may see: the first ``count``, leaving at least one of the problem's cases hidden."""
    return list(task.test_cases[:max(0, min(count, len(task.test_cases) - 1))])


def case_check(task: ExecProblem, index: int, case: str) -> ExecProblem:
    """One visible case as a problem of its own, judged like any reward: ``check`` runs just that case."""
    body = "\n".join("    " + line for line in case.splitlines()) or "    pass"
    return ExecProblem(f"{task.problem_id}#visible{index}", task.prompt, task.entry_point,
                       f"def check(candidate):\n{body}\n", [], None, task.source, task.split_unit)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:max(0, limit - 3)] + "..."


def feedback_text(cases: Sequence[str], infos: Sequence[StepInfo], prompt: str, limit: int) -> str:
    """The observation after a turn with failing visible cases (the format in the module docstring)."""
    failed = [(c, i) for c, i in zip(cases, infos, strict=True) if not i.passed]
    lines = [f"# Tests: {len(failed)} of {len(cases)} visible tests failed."]
    for case, info in failed:
        first = (info.error.strip().splitlines() or [info.outcome])[0]
        lines.append("# FAILED: " + _clip(" ".join(case.split()), limit))
        lines.append("#   " + _clip(first, limit))
    lines.append("# Write the function again.")
    return "\n" + "\n".join(lines) + "\n" + prompt


class CodeFeedbackEnv:
    kind: ClassVar[str] = "code_feedback"

    def __init__(self, config: CodeFeedbackConfig, ctx: EnvContext) -> None:
        self.config, self.ctx = config, ctx
        self.limits = EpisodeLimits(max_turns=config.max_turns, max_total_tokens=config.max_total_tokens,
                                    wall_s=config.episode_wall_s)

    def reset(self, task: ExecProblem, seed: int) -> Reset:
        return Reset(prompt_observation(self.ctx, task), {"visible": visible_cases(task, self.config.visible_cases)})

    def step(self, episodes: Sequence[Episode], actions: Sequence[Completion],
             last: Sequence[bool]) -> list[StepResult]:
        # Every judging of the step in one call: the pool runs them concurrently.
        checks: list[tuple[int, ExecProblem, str]] = []
        for n, (e, a, final) in enumerate(zip(episodes, actions, last, strict=True)):
            if not final:
                checks += [(n, case_check(e.task, i, c), a.text) for i, c in enumerate(e.state["visible"])]
        visible = verdicts(self.ctx, [p for _, p, _ in checks], [t for _, _, t in checks])
        per_episode: dict[int, list[StepInfo]] = {}
        for (n, _, _), info in zip(checks, visible, strict=True):
            per_episode.setdefault(n, []).append(info)
        ending = [n for n, (e, final) in enumerate(zip(episodes, last, strict=True))
                  if final or all(i.passed for i in per_episode.get(n, []))]
        hidden = dict(zip(ending, verdicts(self.ctx, [episodes[n].task for n in ending],
                                           [actions[n].text for n in ending]), strict=True))
        results = []
        for n, e in enumerate(episodes):
            shown = per_episode.get(n, [])
            shaping = self.config.shaping * sum(i.passed for i in shown) / len(shown) if shown else 0.0
            spent = sum(i.duration_s for i in shown)
            if n in hidden:
                h = hidden[n]
                info = StepInfo(h.outcome, h.passed, h.partial, h.suspicious, h.error, h.duration_s + spent,
                                h.rejudged + sum(i.rejudged for i in shown))
                results.append(StepResult([], reward_of(self.ctx, h) + shaping, True, info))
                continue
            text = feedback_text(e.state["visible"], shown, e.task.prompt, self.config.feedback_chars)
            ids = list(self.ctx.tokenizer(text, add_special_tokens=False)["input_ids"])
            suspicious = next((i.suspicious for i in shown if i.suspicious), None)
            info = StepInfo("feedback", False, sum(i.passed for i in shown) / len(shown), suspicious, "", spent,
                            sum(i.rejudged for i in shown))
            results.append(StepResult(ids, shaping, False, info, text))
        return results
