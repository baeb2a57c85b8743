"""The pipeline as a list of steps, computed up front from the config and the source fingerprints, then run.

Each step is a stage plan (what is hashed: config and input refs, so its digest and artifact path are known
before anything runs) plus the Prefect task that produces it. Planning touches nothing: no store writes, no
MLflow, no Prefect server, which is what ``codemill plan`` prints. ``until`` keeps a prefix of the list. A new
stage is one more step here (its plan function and its task live in its ``tasks/`` module).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from codemill.config import PipelineConfig
from codemill.data.config import TokenizeConfig
from codemill.evals import suites
from codemill.evals.config import EvalConfig
from codemill.gate.calibration import recipe_key, recipe_of_plans
from codemill.gate.config import GateConfig
from codemill.plan import PHASES, StagePlan, check_until
from codemill.problems.config import AugmentConfig
from codemill.problems.plus.artifact import STAGE as AUGMENT_STAGE
from codemill.problems.plus.artifact import plan_augment
from codemill.repos.config import RepoTasksConfig
from codemill.store import ArtifactRef, ArtifactStore
from codemill.tasks.augment import augment_task
from codemill.tasks.common import RunContext, StageResult
from codemill.tasks.evaluate import evaluate_suite_task, plan_suite
from codemill.tasks.ingest import ingest_task, plan_ingest
from codemill.tasks.repo_tasks import STAGE as REPO_TASKS_STAGE
from codemill.tasks.repo_tasks import fingerprint_repo_sources_task, plan_repo_tasks, repo_tasks_task
from codemill.tasks.resolve_model import ResolvedModel, trained_model
from codemill.tasks.tokenize import plan_tokenize, plan_tokenizer, tokenize_task, tokenizer_task
from codemill.tasks.train import plan_train, train_task

Binder = Callable[[RunContext, dict[str, StageResult]], dict[str, Any]]


@dataclass(frozen=True)
class Step:
    """One stage of a run: its plan, the task that produces it, and the task's other arguments."""

    key: str  # the result's name in the run: ingest, tokenizer, tokenize, train, eval:<suite>, seed<N>:...
    phase: str  # what ``until`` selects on
    plan: StagePlan
    task: Any  # the Prefect task: task(plan=..., ctx=..., **params, **bind(ctx, results))
    params: dict[str, Any] = field(default_factory=dict)  # not hashed: the full stage config (timeouts, ...)
    bind: Binder | None = None  # arguments that exist only once earlier steps ran (a model id)


def tokenize_config(config: PipelineConfig) -> TokenizeConfig:
    """Fine-tuning reuses the base model's tokenizer, so its token ids mean what the weights expect."""
    cfg = config.tokenize
    if config.train.init_from and not cfg.base_tokenizer:
        cfg = cfg.model_copy(update={"base_tokenizer": config.train.init_from})
    return cfg


def plan_chain(config: PipelineConfig, sources: list[dict], store: ArtifactStore) -> list[Step]:
    """The steps that make a model: ingest, tokenizer, tokenize, train."""
    tok_cfg = tokenize_config(config)
    ingest = Step("ingest", "ingest", plan_ingest(config.ingest, sources), ingest_task,
                  {"cfg": config.ingest, "sources": sources})
    corpus = store.ref_for(ingest.plan)
    tokenizer = Step("tokenizer", "tokenize", plan_tokenizer(tok_cfg, corpus), tokenizer_task, {"cfg": tok_cfg})
    tokens = Step("tokenize", "tokenize", plan_tokenize(tok_cfg, corpus, store.ref_for(tokenizer.plan)),
                  tokenize_task, {"cfg": tok_cfg})
    train = Step("train", "train", plan_train(config.train, store.ref_for(tokens.plan), store.ref_for(tokenizer.plan)),
                 train_task, {"cfg": config.train})
    return [ingest, tokenizer, tokens, train]


def bind_trained(ctx: RunContext, results: dict[str, StageResult]) -> dict[str, Any]:
    """An evaluation step's model once the run's training ran: its LoggedModel id and HF folder."""
    return {"model": trained_model(ctx, results["train"])}


def plan_pipeline(config: PipelineConfig, sources: list[dict], store: ArtifactStore,
                  until: str = "evaluate") -> list[Step]:
    """Every step of ``pipeline``/``nightly`` up to ``until``, in execution order."""
    return plan_run(config, sources, store, until).steps


def plan_run(config: PipelineConfig, sources: list[dict], store: ArtifactStore, until: str = "evaluate") -> RunPlan:
    """The whole ``pipeline``/``nightly`` run up to ``until``: its steps and, when it evaluates, its gate. With
    ``train.seeds`` the candidate's other seeds are trained and evaluated after it."""
    check_until(until)
    chain = plan_chain(config, sources, store)
    if until != "evaluate":
        return RunPlan([s for s in chain if PHASES.index(s.phase) <= PHASES.index(until)], None, None, [])
    evals = plan_evaluations(config, store)
    steps = [*chain, *evals.steps(store.ref_for(chain[-1].plan), store.ref_for(chain[0].plan), bind=bind_trained)]
    seeds = [config.train.seed, *extra_seeds(config)]
    for seed in seeds[1:]:
        steps += plan_seed(config, sources, store, seed, evals)
    return RunPlan(steps, evals, plan_gate(config, evals), seeds if len(seeds) > 1 else [])


def augment_steps(cfg: AugmentConfig) -> list[Step]:
    """The augment step: HumanEval's augmented tests."""
    return [Step(AUGMENT_STAGE, "evaluate", plan_augment(cfg), augment_task, {"cfg": cfg})]


def repo_task_steps(cfg: RepoTasksConfig, phase: str = "evaluate") -> list[Step]:
    """The repository task set, its sources' commits resolved and files hashed (the plan's inputs): built (or
    found in the store) in the evaluate phase of a run whose suite needs it, or as the ``repo_tasks`` flow."""
    plan = plan_repo_tasks(cfg, fingerprint_repo_sources_task(cfg))
    return [Step(REPO_TASKS_STAGE, phase, plan, repo_tasks_task, {"cfg": cfg})]


# The steps a suite can need before it (``Suite.needs``), by stage: each plans them from the stage's config.
NEEDED_STEPS: dict[str, Callable[[Any], list[Step]]] = {AUGMENT_STAGE: augment_steps,
                                                         REPO_TASKS_STAGE: repo_task_steps}


def extra_seeds(config: PipelineConfig) -> list[int]:
    """The seeds ``train.seeds`` adds after ``train.seed``: seed + 1, seed + 2, ..."""
    return [config.train.seed + i for i in range(1, config.train.seeds)]


def seed_config(config: PipelineConfig, seed: int) -> PipelineConfig:
    return config.model_copy(update={"train": config.train.model_copy(update={"seed": seed, "seeds": 1})})


def seed_key(seed: int, name: str) -> str:
    """How a run names one more seed's steps: ``seed<N>:train``, ``seed<N>:<suite>`` (never ``eval:...``)."""
    return f"seed{seed}:{name}"


def plan_seed(config: PipelineConfig, sources: list[dict], store: ArtifactStore, seed: int,
              evals: EvalPlan) -> list[Step]:
    """The training and evaluations of ``config`` at another seed (its data steps, and the steps its suites
    need, are the run's own)."""
    chain = plan_chain(seed_config(config, seed), sources, store)
    model, corpus = store.ref_for(chain[-1].plan), store.ref_for(chain[0].plan)
    return [replace(chain[-1], key=seed_key(seed, "train")),
            *(replace(step, key=seed_key(seed, step.plan.name), bind=_bind_seed(step.bind, seed))
              for step in evals.suite_steps(model, corpus, bind=bind_trained))]


def _bind_seed(bind: Binder | None, seed: int) -> Binder | None:
    if bind is None:
        return None

    def bound(ctx: RunContext, results: dict[str, StageResult]) -> dict[str, Any]:
        return bind(ctx, {"train": results[seed_key(seed, "train")]})
    return bound


def config_recipe(config: PipelineConfig) -> dict[str, Any]:
    """The training recipe of a config (``gate.calibration``), planned without reading a source: a recipe
    leaves the data's content out."""
    chain = plan_chain(config, [], ArtifactStore(config.store_root))
    return recipe_of_plans([s.plan for s in chain])


@dataclass(frozen=True)
class EvalPlan:
    """How a run evaluates a model: one step per configured suite, after the steps the suites need
    (``Suite.needs``: e.g. HumanEval's augmented tests with ``humaneval.plus``, whose artifact is that suite's
    ``plus`` input), planned once and shared by every model the run evaluates (its candidate, its seeds, the
    champion)."""

    cfg: EvalConfig
    needs: list[Step]
    needed: dict[str, dict[str, ArtifactRef]]  # per suite, the refs of what its needs make, by input name

    def steps(self, model: ArtifactRef, corpus: ArtifactRef | None, samples_file: str | None = None,
              bind: Binder | None = None, resolved: ResolvedModel | None = None) -> list[Step]:
        """The needed steps and the suites' steps for ``model``."""
        return [*self.needs, *self.suite_steps(model, corpus, samples_file, bind, resolved)]

    def suite_steps(self, model: ArtifactRef, corpus: ArtifactRef | None, samples_file: str | None = None,
                    bind: Binder | None = None, resolved: ResolvedModel | None = None) -> list[Step]:
        """The suites' steps alone. The model is known by its ref when planning; the task also needs its
        LoggedModel id and HF folder, given directly (``resolved``) or once training ran (``bind``)."""
        if bind is None and resolved is None:
            raise ValueError("an evaluation step needs the resolved model or a way to bind it")
        out = []
        for name in self.cfg.suites:
            suite = suites.get(name)
            plan = plan_suite(name, self.cfg, model, corpus, samples_file if suite.scores_samples else None,
                              self.needed.get(name))
            params: dict[str, Any] = {"cfg": self.cfg, **({"model": resolved} if resolved is not None else {})}
            out.append(Step(f"eval:{name}", "evaluate", plan, evaluate_suite_task, params, bind))
        return out


def plan_evaluations(config: PipelineConfig, store: ArtifactStore) -> EvalPlan:
    """The run's evaluations: the steps the configured suites need, in registry order, one step for a need
    that suites share, and per suite the refs of what they make by input name."""
    steps: list[Step] = []
    made: dict[tuple[str, str], ArtifactRef] = {}
    needed: dict[str, dict[str, ArtifactRef]] = {}
    for suite in (s for s in suites.REGISTRY.values() if s.name in config.evaluate.suites):
        for need in suite.needs(config):
            key = (need.stage, need.config.model_dump_json())
            if key not in made:
                built = NEEDED_STEPS[need.stage](need.config)
                steps += built
                made[key] = store.ref_for(built[-1].plan)
            needed.setdefault(suite.name, {})[need.input] = made[key]
    return EvalPlan(config.evaluate, steps, needed)


@dataclass(frozen=True)
class GatePlan:
    """What the gate of a run needs, planned with it: its settings, the registered model it gates, how to
    evaluate the champion on the run's suites and data, and the config whose recipes ``codemill calibrate``
    could measure."""

    settings: GateConfig
    registered_model: str
    evaluations: EvalPlan
    suite_digests: dict[str, Any]  # ``evaluate.digest_config()``: a calibration applies to these settings only
    recipe_config: PipelineConfig

    def calibratable(self, champion_dir: str) -> list[str]:
        """The recipe keys ``codemill calibrate`` can measure with this config: as it is, from scratch (the
        nightly flow sets ``init_from`` at run time) and ``--from-champion``."""
        train = self.recipe_config.train
        return [recipe_key(config_recipe(self.recipe_config.model_copy(update={"train": train.model_copy(update=u)})))
                for u in ({}, {"init_from": None}, {"init_from": champion_dir})]


def plan_gate(config: PipelineConfig, evals: EvalPlan) -> GatePlan | None:
    """The run's gate against the champion (None when ``gate.enabled`` is off)."""
    if not config.gate.enabled:
        return None
    return GatePlan(config.gate, config.gate.registered_model or config.name, evals,
                    config.evaluate.digest_config(), config)


@dataclass(frozen=True)
class RunPlan:
    """A planned ``pipeline``/``nightly`` run: what the flow carries instead of its config."""

    steps: list[Step]
    evaluations: EvalPlan | None  # None: the run stops before evaluate
    gate: GatePlan | None  # None: the run stops before evaluate, or the gate is off
    seeds: list[int]  # ``train.seeds`` > 1: the candidate's seeds, its own first; else empty


def describe(steps: list[Step], store: ArtifactStore) -> list[dict[str, Any]]:
    """What ``codemill plan`` prints: each step, its digest, where its artifact lives, run or skip. Reads the
    store (is the manifest there?) and writes nothing."""
    rows = []
    for step in steps:
        ref = store.ref_for(step.plan)
        rows.append({"step": step.key, "stage": step.plan.stage, "digest": step.plan.digest, "uri": ref.uri,
                     "action": "skip (in store)" if store.is_committed(ref) else "run",
                     "code_version": step.plan.code_version, "inputs": step.plan.input_digests})
    return rows
