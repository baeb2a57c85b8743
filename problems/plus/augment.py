"""The per-problem recipe of test augmentation, and the augmented ``ExecProblem``.

For every problem with a reference solution:
1. seeds: the literal inputs of its ``check`` (``inputs.seed_inputs``), run on the reference;
2. ``rounds`` of type-aware mutation (``mutate``) of the seeds and of the inputs kept so far; each round's
   candidates run on the reference in one sandboxed program per problem (``runner``); an input on which the
   reference raises, runs past ``input_time_s`` or returns something that is not plain data is rejected
   (counted by reason), and at most ``max_inputs`` are kept;
3. mutants of the reference (``mutants``) run on the seeds and the kept inputs; the original tests judge every
   mutant (the real judge: what they kill is ground truth, not a guess from the seeds);
4. reduction (``reduce.greedy_cover``): the fewest kept inputs that kill every mutant the kept inputs kill
   together, whether or not the original tests kill it too (the new cases stand on their own, as EvalPlus's
   reduced suites do; the original tests are kept as well);
5. the augmented problem (``augmented_problem``): the original ``check`` and then the chosen cases; the judge
   confirms the reference passes it and counts the surviving mutants it kills. A problem whose reference fails
   its augmented tests keeps its original tests (``fallback``), as does one with no seed inputs; one with no new
   case keeps them unchanged.
Every step runs batched over all problems, so the sandbox's workers stay busy.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from codemill.problems.config import AugmentConfig
from codemill.problems.plus.inputs import seed_inputs
from codemill.problems.plus.literals import call_source, key, plus_eq, plus_eq_source, to_source
from codemill.problems.plus.mutants import mutants
from codemill.problems.plus.mutate import Mutator, Pool
from codemill.problems.plus.reduce import greedy_cover
from codemill.problems.plus.runner import Batch, BatchRunner, Call
from codemill.problems.problem import ExecProblem
from codemill.sandbox.request import JudgeRequest

PLUS_CODE_VERSION = "plus-v2"  # v2: a crashed call gets a fresh child once
ORIGINAL_CHECK = "_plus_original_check"
REFERENCE_TIMEOUTS = 3  # a round's candidates after this many slow ones are rejected unrun (a blow-up family)
Judge = Callable[[list[JudgeRequest]], list[Any]]  # JudgePool.judge_all
Say = Callable[[str], None]


@dataclass
class Counts:
    """What augmentation did to one problem (the artifact's ``counts`` rows)."""

    problem_id: str
    seeded: int = 0
    generated: int = 0
    rejected_raised: int = 0
    rejected_timeout: int = 0
    rejected_not_plain: int = 0
    rejected_too_large: int = 0
    kept: int = 0
    new_cases: int = 0
    original_asserts: int = 0
    mutants: int = 0
    killed_by_kept: int = 0
    killed_by_original: int = 0
    killed_by_augmented: int = 0
    reference_passes: bool = False
    fallback: str = ""

    @property
    def rejected(self) -> int:
        return self.rejected_raised + self.rejected_timeout + self.rejected_not_plain + self.rejected_too_large


@dataclass
class _Work:
    problem: ExecProblem
    counts: Counts
    inputs: list[tuple[Any, ...]] = field(default_factory=list)  # seeds that the reference answers, then kept
    outputs: list[Any] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    n_seeds: int = 0
    seen: set[str] = field(default_factory=set)
    mutants: list[str] = field(default_factory=list)
    kills: list[frozenset[int]] = field(default_factory=list)  # per input: the mutants it kills
    chosen: list[int] = field(default_factory=list)  # indices into inputs (new inputs only)
    killed_original: set[int] = field(default_factory=set)  # mutants the original tests fail
    augmented: ExecProblem | None = None


def augmented_problem(problem: ExecProblem, cases: Sequence[tuple[tuple[Any, ...], Any]], atol: float
                      ) -> ExecProblem:
    """``problem`` whose ``check`` runs the original ``check`` and then asserts each (args, expected) case with
    ``_plus_eq``; ``test_cases`` are the original cases (or, when it has none, the original ``check`` as one
    case) followed by one snippet per new case, for partial credit."""
    asserts = [f"assert _plus_eq({call_source(args)}, {to_source(want)})" for args, want in cases]
    body = "\n".join("    " + a for a in [f"{ORIGINAL_CHECK}(candidate)", *asserts])
    tests = (f"{problem.tests.rstrip()}\n\n\n{ORIGINAL_CHECK} = check\n{plus_eq_source(atol)}\n\n"
             f"def check(candidate):\n{body}\n")
    original_cases = list(problem.test_cases) or [f"{ORIGINAL_CHECK}(candidate)"]
    return replace(problem, tests=tests, test_cases=original_cases + asserts)


def count_asserts(tests: str) -> int:
    """``assert`` statements in a test program (the original tests' size, for the counts)."""
    import ast

    try:
        return sum(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(tests)))
    except SyntaxError:
        return 0


def augment_problems(problems: Sequence[ExecProblem], cfg: AugmentConfig, runner: BatchRunner, judge: Judge,
                     judge_mutants: Judge, say: Say = lambda _m: None) -> tuple[list[ExecProblem], list[Counts]]:
    """Augmented problems (in input order; the original where augmentation does not apply) and their counts."""
    eq = plus_eq(cfg.atol)
    work = [_Work(p, Counts(p.problem_id, original_asserts=count_asserts(p.tests))) for p in problems]
    live = [w for w in work if _start(w)]
    say(f"{len(live)} of {len(work)} problems have a reference and literal seed inputs")
    _run_seeds(live, cfg, runner)
    for r in range(cfg.rounds):
        _round(live, cfg, runner, r)
        say(f"mutation round {r + 1}/{cfg.rounds}: {sum(w.counts.kept for w in live)} inputs kept")
    say(f"kept {sum(w.counts.kept for w in live)} new inputs; running mutants")
    _kill_matrix(live, cfg, runner, eq)
    _original_kills(live, judge_mutants)
    for w in live:
        new = list(range(w.n_seeds, len(w.inputs)))
        if cfg.reduce:
            picked = greedy_cover([w.kills[i] for i in new])
            w.chosen = sorted(new[i] for i in picked)
        else:
            w.chosen = new
        w.counts.new_cases = len(w.chosen)
    say(f"reduced to {sum(w.counts.new_cases for w in live)} new cases; verifying in the judge")
    for w in live:
        w.augmented = augmented_problem(w.problem, [(w.inputs[i], w.outputs[i]) for i in w.chosen], cfg.atol)
    verdicts = judge([(w.augmented or w.problem).request(w.problem.reference_solution or "") for w in live])
    for w, v in zip(live, verdicts, strict=True):
        w.counts.reference_passes = bool(v.passed)
        if not v.passed:
            w.counts.fallback = f"reference fails its augmented tests: {v.error}"[:300]
    _augmented_kills(live, judge_mutants)
    return [w.augmented if w.augmented is not None and w.chosen and not w.counts.fallback else w.problem
            for w in work], [w.counts for w in work]


def _start(w: _Work) -> bool:
    p = w.problem
    if not p.reference_solution:
        w.counts.fallback = "no reference solution"
        return False
    seeds = seed_inputs(p.tests, p.entry_point)
    w.counts.seeded = len(seeds)
    if not seeds:
        w.counts.fallback = "no literal inputs in the tests"
        return False
    w.inputs = seeds
    return True


def _source(p: ExecProblem) -> str:
    return p.prompt + (p.reference_solution or "")


def _run_seeds(live: list[_Work], cfg: AugmentConfig, runner: BatchRunner) -> None:
    """The reference on the seeds: its outputs and times (a seed it does not answer is not mutated from)."""
    results = runner.run_all([Batch(_source(w.problem), w.problem.entry_point, w.inputs,
                                    [max(cfg.input_time_s, 5.0)] * len(w.inputs)) for w in live])
    for w, calls in zip(live, results, strict=True):
        seeds, w.inputs = w.inputs, []
        for args, c in zip(seeds, calls, strict=True):
            w.seen.add(key(args))
            if c.ok and _small(c.value, cfg):
                w.inputs.append(args)
                w.outputs.append(c.value)
                w.seconds.append(c.seconds)
        w.n_seeds = len(w.inputs)


def _small(value: Any, cfg: AugmentConfig) -> bool:
    try:
        return len(to_source(value)) <= cfg.max_literal_chars
    except (TypeError, ValueError):  # not plain data, or an int too long for its decimal source
        return False


def _round(live: list[_Work], cfg: AugmentConfig, runner: BatchRunner, r: int) -> None:
    """One round of mutation: candidates from the seeds and the inputs kept so far, judged by the reference."""
    todo: list[tuple[_Work, list[tuple[Any, ...]]]] = []
    for w in live:
        want = cfg.max_inputs - w.counts.kept
        if want <= 0 or not w.inputs:
            continue
        rng = random.Random(f"{cfg.seed}:{w.problem.problem_id}:{r}")
        mutator = Mutator(rng, Pool.of(w.inputs[:w.n_seeds]))
        fresh: list[tuple[Any, ...]] = []
        for _ in range(want * 8):
            if len(fresh) >= want:
                break
            child = mutator.mutate_args(rng.choice(w.inputs))
            try:
                k = key(child)
            except (TypeError, ValueError):
                continue
            if k in w.seen:
                continue
            w.seen.add(k)
            if len(k) > cfg.max_literal_chars:
                w.counts.rejected_too_large += 1
                continue
            fresh.append(child)
        w.counts.generated += len(fresh)
        if fresh:
            todo.append((w, fresh))
    results = runner.run_all([Batch(_source(w.problem), w.problem.entry_point, fresh,
                                    [cfg.input_time_s] * len(fresh), max_timeouts=REFERENCE_TIMEOUTS)
                              for w, fresh in todo])
    for (w, fresh), calls in zip(todo, results, strict=True):
        for args, c in zip(fresh, calls, strict=True):
            if c.status in ("raised", "crashed", "load_error"):
                w.counts.rejected_raised += 1
            elif c.status in ("timeout", "skipped"):
                w.counts.rejected_timeout += 1
            elif c.status == "not_plain":
                w.counts.rejected_not_plain += 1
            elif not _small(c.value, cfg):
                w.counts.rejected_too_large += 1
            elif w.counts.kept < cfg.max_inputs:
                w.inputs.append(args)
                w.outputs.append(c.value)
                w.seconds.append(c.seconds)
                w.counts.kept += 1


def _kill_matrix(live: list[_Work], cfg: AugmentConfig, runner: BatchRunner, eq: Callable[[Any, Any], bool]
                 ) -> None:
    """Which mutants each input kills: a different output, an exception, a timeout or a crash where the
    reference answered."""
    jobs: list[tuple[_Work, int]] = []
    batches: list[Batch] = []
    for w in live:
        w.mutants = mutants(w.problem.prompt, w.problem.reference_solution or "", cfg.max_mutants,
                            seed=cfg.seed)
        w.counts.mutants = len(w.mutants)
        budgets = [max(cfg.mutant_min_time_s, cfg.mutant_time_factor * s) for s in w.seconds]
        for m, source in enumerate(w.mutants):
            jobs.append((w, m))
            batches.append(Batch(source, w.problem.entry_point, w.inputs, budgets, max_timeouts=2))
    results = runner.run_all(batches)
    kills: dict[int, list[set[int]]] = {id(w): [set() for _ in w.inputs] for w in live}
    for (w, m), calls in zip(jobs, results, strict=True):
        for i, c in enumerate(calls):
            if _differs(c, w.outputs[i], eq):
                kills[id(w)][i].add(m)
    for w in live:
        w.kills = [frozenset(k) for k in kills[id(w)]]
        killed_new = set().union(*w.kills[w.n_seeds:]) if len(w.inputs) > w.n_seeds else set()
        w.counts.killed_by_kept = len(killed_new)


def _differs(c: Call, want: Any, eq: Callable[[Any, Any], bool]) -> bool:
    if c.status == "skipped":
        return False
    if not c.ok:
        return True
    try:
        return not eq(c.value, want)
    except Exception:  # noqa: BLE001 - a comparison that raises (nested types) is a difference
        return True


def _completion(mutant: str) -> str:
    """A mutant as a completion: the judge runs ``prompt + completion``, and the mutant redefines everything."""
    return "\n" + mutant + "\n"


def _original_kills(live: list[_Work], judge_mutants: Judge) -> None:
    items = [(w, m) for w in live for m in range(len(w.mutants))]
    verdicts = judge_mutants([w.problem.request(_completion(w.mutants[m])) for w, m in items]) if items else []
    for (w, m), v in zip(items, verdicts, strict=True):
        if not v.passed:
            w.killed_original.add(m)
    for w in live:
        w.counts.killed_by_original = len(w.killed_original)


def _augmented_kills(live: list[_Work], judge_mutants: Judge) -> None:
    """Mutants the original tests miss, judged on the augmented tests (those they kill, the augmented tests kill
    too: they run the original check first). A problem that keeps its original tests catches no more."""
    shipped = [w for w in live if w.augmented is not None and w.chosen and not w.counts.fallback]
    items = [(w, m) for w in shipped for m in range(len(w.mutants)) if m not in w.killed_original]
    verdicts = judge_mutants([(w.augmented or w.problem).request(_completion(w.mutants[m])) for w, m in items]
                             ) if items else []
    for w in live:
        w.counts.killed_by_augmented = w.counts.killed_by_original
    for (w, _m), v in zip(items, verdicts, strict=True):
        if not v.passed:
            w.counts.killed_by_augmented += 1


def counts_rows(counts: Sequence[Counts]) -> list[dict[str, Any]]:
    return [{**asdict(c), "rejected": c.rejected} for c in counts]


@contextlib.contextmanager
def augmenter(cfg: AugmentConfig) -> Iterator[Any]:
    """``with augmenter(cfg) as run: problems, counts = run(problems, say)``: the sandboxes augmentation needs (a
    batch runner for the reference and its mutants, a judge for the reference, a judge with short limits for
    mutants), opened together and closed together. ``run.isolation`` names the judge's isolation."""
    from codemill.sandbox import Limits
    from codemill.sandbox.judge_pool import JudgePool

    limits = Limits.of(cfg)
    mutant_cpu = max(1, int(cfg.mutant_wall_s))
    mutant_limits = Limits(wall_s=cfg.mutant_wall_s, cpu_s=mutant_cpu, memory_bytes=cfg.memory_mb << 20)
    with (BatchRunner(limits, workers=cfg.workers) as runner, JudgePool(limits, workers=cfg.workers) as judge,
          JudgePool(mutant_limits, workers=cfg.workers) as mutant_judge):
        def run(problems: list[ExecProblem], say: Callable[[str], None]) -> Any:
            return augment_problems(problems, cfg, runner, judge.judge_all, mutant_judge.judge_all, say)
        run.isolation = judge.isolation  # type: ignore[attr-defined]
        yield run
