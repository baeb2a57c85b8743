"""The ``problems`` flow: the executable problem set (HumanEval-format files, doctests mined from the corpus, the
synthetic family) as one content-addressed artifact, with one MLflow parent run per flow run.

Planned first like the pipeline: when a source mines the corpus, the ingest step comes first (the pipeline's own
plan, so its corpus is the one ``codemill run`` makes and is skipped when already in the store), then the
problems step, whose inputs are the corpus ref and the file sources' fingerprints.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run

from codemill.config import PipelineConfig
from codemill.flows.hooks import record_failure_on_mlflow, run_name_from
from codemill.flows.plan import Step, plan_chain
from codemill.flows.run import open_run
from codemill.store import ArtifactStore
from codemill.tasks.ingest import fingerprint_sources_task
from codemill.tasks.problems import fingerprint_problem_sources_task, needs_corpus, plan_problems, problems_task


def plan_problem_steps(config: PipelineConfig, ingest_sources: list[dict] | None, problem_sources: list[dict],
                       store: ArtifactStore) -> list[Step]:
    """[ingest (only when doctests are mined), problems]: planning touches nothing."""
    steps: list[Step] = []
    corpus = None
    if needs_corpus(config.problems):
        if ingest_sources is None:
            raise ValueError("a mined problem source needs the ingest sources' fingerprints")
        steps = plan_chain(config, ingest_sources, store)[:1]
        corpus = store.ref_for(steps[0].plan)
    plan = plan_problems(config.problems, problem_sources, corpus)
    steps.append(Step("problems", "problems", plan, problems_task,
                      {"cfg": config.problems, "sources": problem_sources}))
    return steps


def _run_name() -> str:
    return run_name_from(flow_run.flow_name or "problems", flow_run.parameters)


@flow(name="problems", flow_run_name=_run_name, persist_result=True, log_prints=True,
      on_failure=[record_failure_on_mlflow], on_crashed=[record_failure_on_mlflow])
def problems(config: PipelineConfig = PipelineConfig()) -> dict[str, Any]:  # noqa: B008
    """Executable problems (prompt, entry point, tests, reference) from ``config.problems.sources``: references
    verified in the sandbox, deduplicated, decontaminated against HumanEval, split train/val by split unit."""
    logger = get_run_logger()
    with open_run(config, "problems") as run:
        ingest_sources = fingerprint_sources_task(config.ingest) if needs_corpus(config.problems) else None
        steps = plan_problem_steps(config, ingest_sources, fingerprint_problem_sources_task(config.problems),
                                   run.store)
        stages = run.execute(steps)
        run.tag_stages(stages)
        counts = stages["problems"].summary["by_source"]
        create_table_artifact([{"source": name, **{k: v for k, v in c.items() if k != "mining"}}
                               for name, c in counts.items()], key="problems-stats",
                              description="problems: read, malformed, reference failed, unverified, duplicate, "
                                          "contaminated, kept, train/val per source")
        for name, st in stages.items():
            logger.info("%-9s %-8s %s", name, st.status, st.ref.uri)
        return run.finish(stages)
