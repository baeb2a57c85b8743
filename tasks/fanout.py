"""Fan the per-chunk / per-shard units of a stage out through the flow's task runner.

``.submit()`` called inside a task (here: inside ``ingest_task`` / ``tokenize_task``) goes to the task runner of
the enclosing *flow run* (Prefect 3 reads it from ``FlowRunContext``, which the task's thread inherits), so a
flow started with ``task_runner=RayTaskRunner(...)`` runs every unit on a Ray worker while the stage task itself
stays in the flow process and owns the artifact writer. Units only go through Prefect when the flow's runner is
a ``RayTaskRunner``: on the default thread pool they run in-process exactly as before, with no task run per
chunk. Results are returned in unit order, never completion order, so the artifacts are byte-identical either way.
All units are submitted at once, so their results sit in Ray's object store until the stage consumes them in
order: size ``chunk_files`` / corpus shards so that a stage's units fit there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prefect import task
from prefect.context import FlowRunContext
from prefect.task_runners import TaskRunner

from codemill.config import PipelineConfig

LOCAL = "local"


@task(name="unit", persist_result=False, cache_result_in_memory=True)
def run_unit(fn: Callable[[Any], Any], item: Any, index: int) -> Any:
    """One unit of a stage (a pure function from data/); ``index`` names it in the UI."""
    return fn(item)


def task_runner_for(config: PipelineConfig) -> TaskRunner | None:
    """The task runner ``config.ray_address`` asks for: None (keep the flow's default), or a RayTaskRunner that
    starts a local cluster (``"local"``) or connects to an existing one (``"auto"``, ``ray://host:10001``)."""
    if not config.ray_address:
        return None
    try:
        from prefect_ray import RayTaskRunner
    except ImportError as exc:
        raise RuntimeError("ray_address is set but prefect-ray is not installed: pip install 'codemill[ray]'") from exc
    address = None if config.ray_address == LOCAL else config.ray_address
    return RayTaskRunner(address=address, init_kwargs=dict(config.ray_init))


def on_ray() -> bool:
    """Whether the running flow's task runner is a RayTaskRunner (its ``.submit()`` calls go to Ray)."""
    return _on_ray()


def _on_ray() -> bool:
    ctx = FlowRunContext.get()
    if ctx is None:
        return False
    try:
        from prefect_ray import RayTaskRunner
    except ImportError:
        return False
    return isinstance(ctx.task_runner, RayTaskRunner)


def mapper(fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
    """``map(fn, items)``, fanned out as Prefect tasks when the flow runs on Ray; results in item order."""
    items = list(items)
    if not _on_ray():
        yield from map(fn, items)
        return
    futures = [run_unit.with_options(task_run_name=f"unit-{i}").submit(fn, item, i) for i, item in enumerate(items)]
    for f in futures:
        yield f.result()
