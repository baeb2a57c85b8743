"""``code_feedback``: code with test feedback, a multi-turn episode.

The policy writes a solution (turn 1). The environment runs the problem's **visible** test cases on it in the
sandbox: if one fails and turns remain, it answers with the failures in a fixed format and the prompt again,
and the policy writes the function anew (the next turn continues from exactly the tokens sampled and observed
so far). The episode ends when every visible case passes, or at the last turn (``max_turns``); its reward is
the verdict of the full tests (``tests``: the hidden ones, all of them) on the last solution, binary or partial
as ``rl.rollout.reward`` says. With ``shaping`` > 0 each turn whose visible cases ran also earns ``shaping`` x the
gain in the share of visible cases passed over the previous such turn (potential-based: they sum to ``shaping``
x the last measured share, so failing on purpose never pays; ``turn_rewards``, the trajectory's reward is their
sum). A turn after which the next one would not fit the episode's tokens is graded as the last.

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
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from codemill.problems.problem import ExecProblem
from codemill.rl.env import EnvContext, EnvSettings, Episode, EpisodeLimits, Reset, StepInfo, StepResult
from codemill.rl.envs.code_exec import problem_of, prompt_observation, reward_of, verdicts


class CodeFeedbackConfig(EnvSettings):
    """``code_feedback``: the policy writes a solution, the visible tests' failures come back, it may revise; the
    reward is the full tests' verdict on the last solution (codemill.rl.envs.code_feedback)."""

    kind: Literal["code_feedback"] = "code_feedback"
    max_turns: int = Field(3, ge=1, le=16, description="Policy turns per episode (1 = no feedback).")
    visible_cases: int = Field(2, ge=1, description="Test cases shown as feedback: the first ones of the "
                               "problem's that stand alone, always leaving at least one hidden.")
    feedback_chars: int = Field(160, ge=20, description="Each failing case's source and error line are cut to "
                                "this many characters.")
    shaping: float = Field(0.0, ge=0, description="Per-turn reward: this times the gain in the share of "
                           "visible cases passed over the previous turn whose cases ran (potential-based; 0 = "
                           "only the final verdict).")
    max_total_tokens: int | None = Field(None, gt=0, description="Prompt, sampled and feedback tokens of an "
                                         "episode; empty = the engine's context.")
    episode_wall_s: float | None = Field(None, gt=0, description="Wall-clock limit of an episode; empty = none.")


if TYPE_CHECKING:
    from codemill.models.engines import Completion


def visible_cases(task: ExecProblem, count: int) -> list[str]:
    """The cases the policy may see: the first ``count`` that stand alone, leaving at least one of the problem's
    cases hidden. A case that calls a check function (an augmented problem's ``_plus_original_check``) runs
    the hidden tests themselves, and is never shown."""
    standalone = [c for c in task.test_cases if "check(" not in c]
    return standalone[:max(0, min(count, len(task.test_cases) - 1))]


def case_check(task: ExecProblem, index: int, case: str) -> ExecProblem:
    """One visible case as a problem of its own, judged like any reward: the problem's test program (the
    helpers its cases call) with a ``check`` that runs just that case."""
    body = "\n".join("    " + line for line in case.splitlines()) or "    pass"
    tests = f"{task.tests.rstrip()}\n\n\ndef check(candidate):\n{body}\n"
    return ExecProblem(f"{task.problem_id}#visible{index}", task.prompt, task.entry_point, tests, [], None,
                       task.source, task.split_unit)


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
    settings: ClassVar[type[EnvSettings]] = CodeFeedbackConfig

    def __init__(self, config: CodeFeedbackConfig, ctx: EnvContext) -> None:
        self.config, self.ctx = config, ctx
        self.limits = EpisodeLimits(max_turns=config.max_turns, max_total_tokens=config.max_total_tokens,
                                    wall_s=config.episode_wall_s)
        self.budget = min(ctx.max_context, config.max_total_tokens or ctx.max_context)

    def reset(self, task: ExecProblem, seed: int) -> Reset:
        return Reset(prompt_observation(self.ctx, task), {"visible": visible_cases(task, self.config.visible_cases),
                                                          "visible_share": 0.0})

    def step(self, episodes: Sequence[Episode], actions: Sequence[Completion],
             last: Sequence[bool]) -> list[StepResult]:
        # The visible cases of every episode that may go on, in one judging (the pool runs them concurrently).
        checks: list[tuple[int, ExecProblem, str]] = []
        for n, (e, a, final) in enumerate(zip(episodes, actions, last, strict=True)):
            if not final:
                checks += [(n, case_check(problem_of(e), i, c), a.text) for i, c in enumerate(e.state["visible"])]
        visible = verdicts(self.ctx, [p for _, p, _ in checks], [t for _, _, t in checks])
        shown: dict[int, list[StepInfo]] = {}
        for (n, _, _), info in zip(checks, visible, strict=True):
            shown.setdefault(n, []).append(info)
        feedback: dict[int, tuple[str, list[int]]] = {}
        ending = []
        for n, (e, final) in enumerate(zip(episodes, last, strict=True)):
            infos = shown.get(n, [])
            if final or all(i.passed for i in infos):
                ending.append(n)
                continue
            text = feedback_text(e.state["visible"], infos, e.task.prompt, self.config.feedback_chars)
            ids = list(self.ctx.tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(e.context) + len(ids) + self.ctx.max_new_tokens > self.budget:
                ending.append(n)  # no room for another turn: this one is graded as the last
            else:
                feedback[n] = (text, ids)
        # The full tests on the solutions that end their episodes, in a second judging.
        hidden = dict(zip(ending, verdicts(self.ctx, [problem_of(episodes[n]) for n in ending],
                                           [actions[n].text for n in ending]), strict=True))
        results = []
        for n, e in enumerate(episodes):
            infos = shown.get(n, [])
            shaping = self._shaping(e, infos)
            spent, rejudged = sum(i.duration_s for i in infos), sum(i.rejudged for i in infos)
            if n in hidden:
                h = hidden[n]
                info = StepInfo(h.outcome, h.passed, h.partial, h.suspicious, h.error, h.duration_s + spent,
                                h.rejudged + rejudged)
                results.append(StepResult([], reward_of(self.ctx, h) + shaping, True, info))
                continue
            text, ids = feedback[n]
            suspicious = next((i.suspicious for i in infos if i.suspicious), None)
            info = StepInfo("feedback", False, sum(i.passed for i in infos) / len(infos), suspicious, "", spent,
                            rejudged)
            results.append(StepResult(ids, shaping, False, info, text))
        return results

    def _shaping(self, e: Episode, infos: Sequence[StepInfo]) -> float:
        """``shaping`` x the visible share's gain over the previous measured turn (potential-based: the terms
        of an episode sum to ``shaping`` x its last measured share, so failing a turn on purpose never pays).
        A turn whose visible cases did not run (the last) earns none."""
        if not infos or not self.config.shaping:
            return 0.0
        share = sum(i.passed for i in infos) / len(infos)
        gain, e.state["visible_share"] = share - e.state["visible_share"], share
        return self.config.shaping * gain


ENVIRONMENT = CodeFeedbackEnv
