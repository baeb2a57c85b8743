"""The ``codemill`` command line."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from codemill import progress
from codemill.config import ConfigError, PipelineConfig, load_config, load_preset, preset_names
from codemill.data.sources import FolderSource
from codemill.evals.config import SUITES, SuiteName
from codemill.rl.config import algorithm_fields, algorithm_names

app = typer.Typer(help="codemill: code corpus -> tokens -> checkpoints -> evaluated models.",
                  no_args_is_help=True, add_completion=False)
console = Console()

# The ephemeral Prefect server's first start runs its database migrations, which takes longer than the
# 20 s default on a small machine; analytics would only try to reach the network.
PREFECT_DEFAULTS = {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
# torch's CPU threads (libgomp) spin while they wait for work. When anything else uses the cores, a spinning thread
# holds the core its partner needs: with one other busy process on 2 cores, bits per byte and HumanEval ran 2-3 times
# slower than with sleeping threads (3-10 times with more), which cost a quiet machine 2-3 s per suite. Read when
# torch loads, so set before any command; an OMP_WAIT_POLICY of the user's own is kept.
THREAD_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}


# The flow's INFO lines (Prefect's "Finished in state Completed()", the trainer's step lines, MLflow's table
# creation) are 90-170 columns and would interleave with the progress rows; they stay in the Prefect UI (the
# API handler is untouched) and come back on the terminal with --verbose. Warnings and errors always show.
QUIET_CONSOLE_LOGS = {"PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING", "MLFLOW_LOGGING_LEVEL": "WARNING"}

DEFAULT_PRESET = "tiny"


def build_config(config: Path | None, preset: str | None, sources: list[Path] | None, store: str | None,
                 ) -> PipelineConfig:
    """The config every command loads; bad input (unknown preset, unreadable or invalid YAML) exits 2 in a line.

    ``preset`` is None when --preset was not given, so a --preset that --config would silently replace is an
    error rather than ignored."""
    if config and preset is not None:
        _fail([f"give --config or --preset, not both: {config} is a whole pipeline config and would replace "
               f"preset {preset!r}"])
    try:
        cfg = load_config(config) if config else load_preset(preset or DEFAULT_PRESET)
    except ConfigError as e:
        _fail(e.lines)
    if sources:
        missing = [str(s) for s in sources if not s.exists()]
        if missing:
            raise typer.BadParameter(f"source path does not exist: {', '.join(missing)}", param_hint="--source")
        files = [str(s) for s in sources if not s.is_dir()]
        if files:
            raise typer.BadParameter(f"source is not a folder: {', '.join(files)}", param_hint="--source")
        cfg.ingest.sources = [FolderSource(path=str(s.resolve())) for s in sources]
    if store:
        cfg.store_root = store
    return cfg


def _fail(lines: list[str]) -> NoReturn:
    """Bad input: one ``error:`` line per problem on stderr and exit status 2 (click's usage-error code)."""
    for line in lines:
        typer.echo(f"error: {line}", err=True)
    raise typer.Exit(2)


DEBUG_ENV = "CODEMILL_DEBUG"


@app.callback()
def main(debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of a known failure too (same as "
                                                              f"{DEBUG_ENV}=1).")] = False) -> None:
    """codemill: code corpus -> tokens -> checkpoints -> evaluated models."""
    if debug:
        os.environ[DEBUG_ENV] = "1"
    for key, value in THREAD_DEFAULTS.items():
        os.environ.setdefault(key, value)
    from codemill.progress_view import silence_library_bars

    silence_library_bars()


def _debug() -> bool:
    return os.environ.get(DEBUG_ENV, "").lower() not in ("", "0", "false", "no")


def _preflight(cfg: PipelineConfig, command: str, until: str = "evaluate") -> None:
    """Everything the planned steps need, checked before the flow starts: one ``error:`` line (and ``hint:``)
    per problem and exit status 2, before any flow run, stage or MLflow run begins."""
    from codemill.preflight import needs_of, run_checks

    failed = [c for c in run_checks(cfg, needs_of(command, cfg, until)) if not c.ok]
    for check in failed:
        typer.echo(f"error: {check.problem}", err=True)
        if check.hint:
            typer.echo(f"hint: {check.hint}", err=True)
    if failed:
        raise typer.Exit(2)


@contextmanager
def _known_failures() -> Iterator[None]:
    """A failure the user can cause or fix (``codemill.errors.describe``) prints
    ``error: <what>`` and ``hint: <fix>`` and exits 2 (like bad input), without a traceback unless --debug;
    anything else is a bug and keeps its traceback (exit 1). Prefect's own log lines, printed as the flow
    failed, stay as they are."""
    from click.exceptions import ClickException, Exit

    try:
        yield
    except (Exit, ClickException):
        raise
    except Exception as e:
        from codemill.errors import describe

        found = describe(e)
        if found is None or _debug():
            raise
        what, hint = found
        typer.echo(f"error: {what}", err=True)
        if hint:
            typer.echo(f"hint: {hint}", err=True)
        typer.echo(f"(--debug or {DEBUG_ENV}=1 shows the traceback)", err=True)
        raise typer.Exit(2) from None


ConfigOpt = Annotated[Path | None, typer.Option(help="Pipeline config YAML (instead of --preset).")]
SourceOpt = Annotated[list[Path] | None, typer.Option(help="Source folder(s), replacing the config's sources; "
                                                            "each takes every file of a language in "
                                                            "ingest.languages, less lock files; repeatable.")]
PresetOpt = Annotated[str | None, typer.Option(help=f"Preset name: {', '.join(preset_names())} "
                                                   f"(default: {DEFAULT_PRESET}).")]
StoreOpt = Annotated[str | None, typer.Option(help="Artifact store root (path or fsspec URL).")]
UntilOpt = Annotated[str, typer.Option(help="Stop after this stage: ingest, tokenize, train or evaluate.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table/tree.")]
Verbose = Annotated[bool, typer.Option("--verbose", help="Also every score and each gate metric's noise in full "
                                                         "(the MLflow run's report has both), and the flow's log "
                                                         "lines (the Prefect UI has them).")]


def _check_until(until: str) -> None:
    """The flows' own check of ``until``, as a usage error (exit 2) before anything starts."""
    from codemill.plan import check_until

    try:
        check_until(until)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--until") from e


@app.command()
def run(config: ConfigOpt = None, source: SourceOpt = None, preset: PresetOpt = None, store: StoreOpt = None,
        until: UntilOpt = "evaluate", verbose: Verbose = False) -> None:
    """Run the pipeline: ingest -> tokenize -> train -> evaluate -> gate (or stop after ``--until``)."""
    cfg = build_config(config, preset, source, store)
    _check_until(until)
    _preflight(cfg, "run", until)
    _prefect_defaults(cfg, verbose)
    _skip_final_collection()
    from codemill.flows.server import start_ephemeral_api_early

    server_ready = start_ephemeral_api_early()  # boots while the flow modules import
    from codemill.flows.common import with_task_runner
    from codemill.flows.pipeline import pipeline
    from codemill.lineage import preload_store

    preload_store(cfg.mlflow_tracking_uri)  # still waiting for the server: the first MLflow call's import, now
    server_ready()
    t0 = time.perf_counter()
    with _known_failures(), _progress(cfg):
        out = with_task_runner(pipeline, cfg)(config=cfg, until=until)
    print_summary(out, time.perf_counter() - t0, verbose)


@app.command()
def calibrate(config: ConfigOpt = None, source: SourceOpt = None, preset: PresetOpt = None, store: StoreOpt = None,
              seeds: Annotated[int, typer.Option(min=2, help="Seeds in the calibration; trainings of this config "
                                                            "already in the store count.")] = 10,
              from_champion: Annotated[bool, typer.Option(
                  "--from-champion", help="Fine-tune every seed from the champion, as nightly does: calibrates "
                                          "the nightly chain (it stays calibrated as the champion changes).")] = False,
              as_json: AsJson = False) -> None:
    """Train N seeds of one config (data stages cached), evaluate each, and store the between-seed noise of
    every metric; the gate adds it when a model of this recipe (any seed, any starting weights) is the
    champion. Prints per metric the seed SD, the item-level SE and the minimum detectable effect at 80%
    power."""
    cfg = build_config(config, preset, source, store)
    _preflight(cfg, "calibrate")
    _prefect_defaults(cfg)
    from codemill.flows.calibrate import calibrate as calibrate_flow
    from codemill.flows.common import with_task_runner
    from codemill.report import calibration_lines

    t0 = time.perf_counter()
    with _known_failures(), _progress(cfg):
        out = with_task_runner(calibrate_flow, cfg)(config=cfg, seeds=seeds, from_champion=from_champion)
    if as_json:
        import json

        typer.echo(json.dumps(out, indent=2, default=str))
        return
    print_lines(calibration_lines(out, time.perf_counter() - t0, console.width))


@app.command()
def plan(config: ConfigOpt = None, source: SourceOpt = None, preset: PresetOpt = None, store: StoreOpt = None,
         until: UntilOpt = "evaluate", as_json: AsJson = False) -> None:
    """Dry run: the files of each source by language, then every stage with its digest, where its artifact
    lives, and whether it would run or be skipped.

    Reads the sources (to fingerprint them) and the store; writes nothing, starts no MLflow run and needs no
    Prefect server."""
    cfg = build_config(config, preset, source, store)
    _check_until(until)
    import json

    from codemill.data.ingest import fingerprint_sources
    from codemill.flows.plan import describe, plan_pipeline
    from codemill.store import ArtifactStore

    art_store = ArtifactStore(cfg.store_root, cache_dir=f"{cfg.work_dir}/cache")
    rows = describe(plan_pipeline(cfg, fingerprint_sources(cfg.ingest), art_store, until), art_store)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    _print_sources(cfg)
    from codemill.layout import wrap
    from codemill.report import plan_lines

    print_lines(plan_lines(rows, art_store.root_uri, until, console.width))
    if until == "evaluate" and cfg.gate.enabled:
        print_lines(wrap(f"then: gate against {cfg.gate.registered_model or cfg.name}@{cfg.gate.alias} "
                         "(the champion is looked up when the run gets there)", console.width))
    _print_preflight(cfg, until)


def _print_sources(cfg: PipelineConfig) -> None:
    """Per source, the files the ingest will read by language, and what its walk leaves out."""
    from rich.text import Text

    from codemill.data.survey import survey_lines, survey_source

    console.print("sources (the files the ingest reads, by language):")
    for src in cfg.ingest.sources:
        for line in survey_lines(survey_source(src, cfg.ingest.languages)):
            console.print(Text(line))


def _print_preflight(cfg: PipelineConfig, until: str) -> None:
    """The checks ``codemill run`` makes before it starts, as a footer: ok, or would fail and why."""
    from codemill.layout import wrap
    from codemill.preflight import needs_of, run_checks

    console.print("preflight (what `codemill run` checks before it starts):")
    for check in run_checks(cfg, needs_of("run", cfg, until)):
        status = "ok" if check.ok else "would fail"
        line = f"  {check.name:<9} {status:<10} {check.detail if check.ok else check.problem}"
        console.print(Text("\n".join(wrap(line, console.width, " " * 4)), style="" if check.ok else "red"))
        if check.hint and not check.ok:
            print_lines(wrap(f"  {'':<9} {'':<10} hint: {check.hint}", console.width, " " * 4))


@app.command()
def problems(config: ConfigOpt = None, preset: PresetOpt = None, store: StoreOpt = None,
             as_json: AsJson = False) -> None:
    """Build the executable problem set (``problems`` in the config): read its sources, verify references in the
    sandbox, deduplicate, decontaminate, split; print the counts per source and step."""
    cfg = build_config(config, preset, None, store)

    def start():
        from codemill.flows.problems import problems as problems_flow

        return problems_flow(config=cfg)

    out, wall_s = _run_on_problem_sources(cfg, "problems", start)
    result = out["stages"]["problems"]
    if as_json:
        import json

        typer.echo(json.dumps(result, indent=2))
        return
    print_problem_counts(result, wall_s)


def _run_on_problem_sources(cfg: PipelineConfig, command: str, start) -> tuple[dict, float]:
    """A flow that reads ``cfg.problems``: a missing file or bucket is one line before anything starts; a
    malformed line or file is named after the flow stopped, and nothing is committed."""
    from codemill.data.sources import SourceError
    from codemill.problems.sets import ProblemFileError, fingerprint_problem_sources

    try:
        fingerprint_problem_sources(cfg.problems)
    except (SourceError, ProblemFileError) as e:
        _fail([str(e)])
    _preflight(cfg, command)
    _prefect_defaults(cfg)
    t0 = time.perf_counter()
    with _known_failures(), _progress(cfg):
        out = start()
    return out, time.perf_counter() - t0


@app.command()
def rl(config: ConfigOpt = None, preset: PresetOpt = None, store: StoreOpt = None,
       model: Annotated[str | None, typer.Option(help="Starting policy: a LoggedModel id (m-...), a store train or "
                                                      "policy artifact folder, or an HF folder; empty = the "
                                                      "champion (or the pipeline's trained model).")] = None,
       algorithm: Annotated[str | None, typer.Option(help="grpo or rft (overrides rl.algorithm.name; another rule "
                                                          "than the config's starts from its defaults).")] = None,
       iterations: Annotated[int | None, typer.Option(help="Overrides rl.iterations.")] = None,
       as_json: AsJson = False) -> None:
    """RL for code (``rl`` in the config): iterations of rollouts judged in the sandbox and policy updates (GRPO
    or rejection-sampling fine-tuning), then the held-out pass rate before/after, the evaluation and the gate."""
    cfg = build_config(config, preset, None, store)
    overrides: dict[str, Any] = {} if iterations is None else {"iterations": iterations}
    if algorithm is not None and algorithm not in algorithm_names():
        _fail([f"--algorithm: {algorithm!r} is not an RL algorithm (one of {', '.join(algorithm_names())})"])
    if algorithm is not None and algorithm != cfg.rl.algorithm.name:  # that rule's defaults, sampling as configured
        fields = algorithm_fields(algorithm)  # a rule that scores tokens at a temperature takes the rollout's
        overrides["algorithm"] = {"name": algorithm, **({"temperature": cfg.rl.rollout.temperature}
                                                        if "temperature" in fields else {})}
    for option, value in overrides.items():  # one at a time: an error names the option that caused it
        try:
            cfg = cfg.model_copy(update={"rl": cfg.rl.model_validate({**cfg.rl.model_dump(), option: value})})
        except ValueError as e:
            _fail([f"--{option}: {' '.join(str(e).split())}"])

    def start():
        from codemill.flows.rl import rl as rl_flow

        return rl_flow(config=cfg, model=model)

    out, wall_s = _run_on_problem_sources(cfg, "rl", start)
    if as_json:
        import json

        typer.echo(json.dumps(out, indent=2, default=str))
        return
    print_rl_summary(out, wall_s)


def print_rl_summary(out: dict, wall_s: float) -> None:
    from codemill.report import rl_summary_lines

    print_lines(rl_summary_lines(out, wall_s, console.width))


def print_problem_counts(result: dict, wall_s: float) -> None:
    from codemill.report import problem_count_lines

    print_lines(problem_count_lines(result, wall_s, console.width))


def _skip_final_collection() -> None:
    """At exit, after every other exit handler (Prefect's server stop and log flush run first: handlers run last
    registered first), freeze the garbage collector's view of all live objects. With torch, transformers, MLflow
    and Prefect loaded, the collector's final passes over them took 2-8 s of a 20 s no-change rerun; the process
    is ending and everything it recorded is committed, so there is nothing for them to reclaim."""
    import atexit
    import gc

    atexit.register(gc.freeze)


def _prefect_defaults(cfg: PipelineConfig, verbose: bool = False) -> None:
    """Set before Prefect and MLflow are imported: they read these once, at import."""
    os.environ.setdefault("MLFLOW_TRACKING_URI", cfg.mlflow_tracking_uri)
    for key, value in {**PREFECT_DEFAULTS, **({} if verbose else QUIET_CONSOLE_LOGS)}.items():
        os.environ.setdefault(key, value)


@contextmanager
def _progress(cfg: PipelineConfig) -> Iterator[None]:
    """One row per stage while the flow runs, store paths shown under the store root (the summary names it)."""
    from codemill.progress_view import RichSink, progress_display
    from codemill.store import ArtifactStore

    with progress_display(console) as bar:
        progress.set_sink(RichSink(bar, ArtifactStore(cfg.store_root).root_uri))
        try:
            yield
        finally:
            progress.set_sink(None)


@app.command()
def evaluate(
    model: Annotated[str, typer.Argument(help="LoggedModel id (m-...), store train artifact, or HF folder.")],
    config: Annotated[Path | None, typer.Option(help="Pipeline config YAML (instead of --preset).")] = None,
    preset: Annotated[str | None, typer.Option(help="Preset whose evaluate/gate sections apply (default: "
                                                    f"{DEFAULT_PRESET}).")] = None,
    corpus: Annotated[str | None, typer.Option(help="Corpus artifact (val split); default: newest.")] = None,
    suite: Annotated[list[str] | None, typer.Option(help=f"Suites ({', '.join(SUITES)}); "
                                                                     "repeatable.")] = None,
    samples: Annotated[Path | None, typer.Option(help="Score this HumanEval samples JSONL instead.")] = None,
    no_gate: Annotated[bool, typer.Option("--no-gate", help="Do not compare with the champion.")] = False,
    unsafe_no_sandbox: Annotated[bool, typer.Option("--unsafe-no-sandbox",
                                                    help="Run model code WITHOUT isolation (logged).")] = False,
    verbose: Verbose = False,
) -> None:
    """Evaluate any model on the chosen suites, and gate it against the champion."""
    cfg = build_config(config, preset, None, None)
    from codemill.evals.suites import REGISTRY

    if suite:
        cfg.evaluate.suites = _suites(suite)
    if samples:
        if not samples.is_file():
            raise typer.BadParameter(f"samples file not found: {samples}", param_hint="--samples")
        cfg.evaluate.suites = [s.name for s in REGISTRY.values() if s.scores_samples]  # those that score one
    for section in (s.config(cfg.evaluate) for s in REGISTRY.values()):  # every suite that runs model code
        if "unsafe_no_sandbox" in type(section).model_fields:
            section.unsafe_no_sandbox = unsafe_no_sandbox  # type: ignore[attr-defined]
    cfg.gate.enabled = not no_gate
    _preflight(cfg, "evaluate")
    _prefect_defaults(cfg, verbose)
    from codemill.flows.evaluate import evaluate as evaluate_flow

    t0 = time.perf_counter()
    with _known_failures(), _progress(cfg):
        out = evaluate_flow(model=model, config=cfg, corpus=corpus, samples_file=str(samples) if samples else None)
    print_summary(out, time.perf_counter() - t0, verbose)


def _suites(names: list[str]) -> list[SuiteName]:
    known = SUITES
    unknown = [n for n in names if n not in known]
    if unknown:
        raise typer.BadParameter(f"unknown suite {', '.join(unknown)}; choose from {', '.join(known)}",
                                 param_hint="--suite")
    return list(names)


def print_summary(out: dict, wall_s: float, verbose: bool = False) -> None:
    """What a run did, at the terminal's width: stages with their cost, one line per suite, the gate per
    metric, where it is recorded."""
    from codemill.report import footer_lines, summary_lines

    print_lines([*summary_lines(out, wall_s, console.width, verbose), *footer_lines(out, console.width)])


def print_lines(lines: list[str]) -> None:
    """Lines laid out for ``console.width`` (no markup in them is interpreted)."""
    console.print(Text("\n".join(lines)))


@app.command()
def presets() -> None:
    """List the shipped presets."""
    for name in preset_names():
        console.print(name)


def _lineage_sources(config: Path | None, preset: str | None, store: str | None, tracking_uri: str | None):
    """The MLflow reader + ArtifactStore from the same config `run` uses (options override it)."""
    from codemill.lineage.read import LineageReader
    from codemill.store import ArtifactStore

    cfg = build_config(config, preset, None, store)
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or cfg.mlflow_tracking_uri
    return LineageReader(uri), ArtifactStore(cfg.store_root)


LineagePreset = Annotated[str | None, typer.Option(help=f"Preset naming the store and tracking URI (default: "
                                                       f"{DEFAULT_PRESET}).")]
LineageUri = Annotated[str | None, typer.Option(help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, config).")]


@app.command()
def lineage(
    ident: Annotated[str, typer.Argument(help="LoggedModel id (m-...), MLflow run id, or artifact digest (prefix).")],
    config: ConfigOpt = None, preset: LineagePreset = None, store: StoreOpt = None,
    tracking_uri: LineageUri = None, as_json: AsJson = False,
) -> None:
    """Show the chain eval scores -> checkpoint -> training run -> tokens -> corpus -> sources."""

    from codemill.lineage import view as lineage_view

    reader, art_store = _lineage_sources(config, preset, store, tracking_uri)
    _show(lambda: lineage_view.lineage_tree(reader, art_store, ident),
          lambda tree, width: lineage_view.render(tree, width, art_store.root_uri), as_json)


@app.command()
def trajectory(
    rollouts: Annotated[Path, typer.Argument(help="A rollouts.parquet, or the rollouts artifact folder.")],
    tokenizer: Annotated[Path, typer.Option(help="The sampling policy's HF folder (its tokenizer decodes).")],
    row: Annotated[list[int] | None, typer.Option(help="Row index (repeatable); default: the first.")] = None,
    width: Annotated[int, typer.Option(help="Cut each block to this many characters (0: whole).")] = 2000,
) -> None:
    """Show episodes of a rollouts table turn by turn: the sampled tokens (mask 1) and the environment's
    (mask 0), with log-probs, finish reasons and rewards."""
    from transformers import AutoTokenizer

    from codemill.rl.trajectory import RolloutsSchemaError, read_rollouts, render_row

    try:
        rows = read_rollouts(rollouts).to_pylist()
    except (OSError, RolloutsSchemaError) as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e
    wanted = row or [0]
    bad = [i for i in wanted if not 0 <= i < len(rows)]
    if bad:
        console.print(f"[red]error:[/] {rollouts}: no row {bad[0]} (it has {len(rows)})")
        raise typer.Exit(2)
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    for i in wanted:
        typer.echo(render_row(rows[i], lambda ids: tok.decode(ids, skip_special_tokens=False), width, console.width))


@app.command()
def compare(
    model_a: Annotated[str, typer.Argument(help="LoggedModel id (a, the candidate).")],
    model_b: Annotated[str, typer.Argument(help="LoggedModel id (b, the reference).")],
    config: ConfigOpt = None, preset: LineagePreset = None, store: StoreOpt = None,
    tracking_uri: LineageUri = None, as_json: AsJson = False,
    alpha: Annotated[float, typer.Option(help="Significance level of the verdict.")] = 0.05,
) -> None:
    """Paired comparison of two models on the same eval items (the gate's statistics)."""

    from codemill import compare as cmp

    reader, art_store = _lineage_sources(config, preset, store, tracking_uri)
    _show(lambda: cmp.compare_models(reader, art_store, model_a, model_b, alpha), cmp.render_comparison, as_json)


def _show(build, render, as_json: bool) -> None:
    """Print what ``build`` returns (rendered at the terminal's width, or as JSON); a lineage error is a clean
    exit code 2."""
    import json

    from codemill.lineage import TrackingAccessDenied
    from codemill.lineage.read import LineageError

    try:
        result = build()
    except (LineageError, TrackingAccessDenied) as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
    else:
        console.print(render(result, console.width))


@app.command()
def serve(
    prefect_file: Annotated[Path | None, typer.Option(help="Deployments file (default: deployments/prefect.yaml).")]
    = None,
    timezone: Annotated[str | None, typer.Option(help="Time zone of the schedules, e.g. Europe/Berlin "
                                                     "(default: the file's, UTC).")] = None,
    limit: Annotated[int | None, typer.Option(help="Most flow runs at once in this process.")] = None,
    config: Annotated[Path | None, typer.Option(help="Config whose `metrics.serve_port` serves /metrics.")] = None,
) -> None:
    """Serve every deployment (nightly schedule, manual pipeline/stage/evaluate runs) from this process.

    Runs appear in the Prefect UI of PREFECT_API_URL. Stopping this process pauses the schedules."""
    cfg = build_config(config, None, None, None)
    _preflight(cfg, "serve")
    if cfg.metrics.serve_port:
        from codemill.metrics.http import serve_metrics

        serve_metrics(cfg.metrics.serve_port)
    for key, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    from codemill.flows.serve import DEFAULT_PREFECT_FILE, PrefectApiAuthError
    from codemill.flows.serve import serve as serve_deployments

    try:
        serve_deployments(prefect_file or DEFAULT_PREFECT_FILE, timezone, limit)
    except PrefectApiAuthError as e:  # checked before anything is served
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e


repo_tasks_app = typer.Typer(help="Repository tasks (SWE-bench format): grade predictions.", no_args_is_help=True)
app.add_typer(repo_tasks_app, name="repo-tasks")


@repo_tasks_app.command("build")
def repo_tasks_build(config: ConfigOpt = None, preset: PresetOpt = None, store: StoreOpt = None,
                     as_json: AsJson = False) -> None:
    """Build the repository task set (``repo_tasks`` in the config) as a store artifact: import and synthesise,
    validate in the sandbox, decontaminate, split by repository; print the yield."""
    import json

    cfg = build_config(config, preset, None, store)
    with _known_failures():
        from codemill.tasks.repo_tasks import fingerprint_repo_sources

        if not cfg.repo_tasks.sources:
            _fail(["repo_tasks.sources is empty: add an import or synthesis source to the config"])
        fingerprint_repo_sources(cfg.repo_tasks)  # a missing repository or commit: one line, nothing started
    _preflight(cfg, "repo-tasks build")
    _prefect_defaults(cfg)
    t0 = time.perf_counter()
    with _known_failures(), _progress(cfg):
        from codemill.flows.repo_tasks import repo_tasks as repo_tasks_flow

        out = repo_tasks_flow(config=cfg)
    result = out["stages"]["repo_tasks"]
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    summary = result["summary"]
    status = {"cached": "skipped (cached)", "present": "skipped (in store)"}.get(result["status"], "ran")
    console.print(f"repo_tasks: {status} in {time.perf_counter() - t0:.1f}s: {summary['tasks']} tasks "
                  f"(train {summary['splits']['train']}, val {summary['splits']['val']}) from "
                  f"{', '.join(summary['repositories']) or 'no repository'}; {summary['contaminated']} contaminated")
    if summary["by_operator"]:
        console.print("by operator: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["by_operator"].items())))
    console.print(f"artifact: {result['ref']['uri']} (digest {result['ref']['digest'][:12]})")
    console.print(f"MLflow run: {result['run_id']}")


@repo_tasks_app.command("grade")
def repo_tasks_grade(
    tasks: Annotated[str, typer.Option(help="Tasks: a SWE-bench-format JSONL or Parquet file (local or s3://), "
                                            "or a repo_tasks artifact folder (its snapshots need no --repos).")],
    predictions: Annotated[str, typer.Option(help="Predictions JSONL: instance_id, model_name_or_path, "
                                                  "model_patch per line.")],
    repos: Annotated[Path | None, typer.Option(help="Folder with one git repository per task `repo` "
                                                    "(owner/name, owner__name or name); not needed for a "
                                                    "repo_tasks artifact.")] = None,
    report: Annotated[Path | None, typer.Option(help="Write the JSON run report here.")] = None,
    workers: Annotated[int | None, typer.Option(help="Instances graded at once (default: usable cores).")] = None,
    wall_s: Annotated[float, typer.Option(help="Wall clock of one instance's test run, seconds.")] = 300.0,
    partial: Annotated[bool, typer.Option(help="Reward the share of FAIL_TO_PASS passing (PASS_TO_PASS intact).")]
    = False,
) -> None:
    """Grade predictions in the sandbox, each in a fresh copy of its task's repository: prints each instance's
    verdict and the counts; exit 0 whatever the verdicts, 2 on bad input."""
    from codemill.cpus import usable_cpus
    from codemill.repos.evaluate import grade_predictions, write_report
    from codemill.repos.task import read_predictions, read_tasks

    with _known_failures():
        taskset = None
        if Path(tasks).is_dir():  # a built task set (a repo_tasks artifact): snapshots from its bundles
            from codemill.repos.taskset import TaskSet

            taskset = TaskSet(Path(tasks))
            task_list = taskset.tasks()
        else:
            if repos is None:
                raise typer.BadParameter("--repos is needed with a tasks file (the folder of its repositories)")
            task_list = read_tasks(tasks)
        preds = read_predictions(predictions)

        def show(g) -> None:
            why = f"  ({g.reasons[0]})" if g.reasons and not g.resolved else ""
            flag = "  [suspicious]" if g.suspicious else ""
            typer.echo(f"{g.instance_id}: {g.status}{why}{flag}")

        out = grade_predictions(task_list, preds, repos or Path("."), workers=workers or usable_cpus(), wall_s=wall_s,
                                partial=partial, on_grade=show, taskset=taskset)
        for iid in out["unknown_ids"]:
            typer.echo(f"{iid}: unknown instance (not in {tasks})", err=True)
        typer.echo(f"resolved {out['resolved_instances']} of {out['submitted_instances']} submitted "
                   f"({out['total_instances']} tasks): {out['unresolved_instances']} unresolved, "
                   f"{out['error_instances']} errors, {out['empty_patch_instances']} empty patches, "
                   f"{out['unknown_instances']} unknown, {len(out['suspicious_ids'])} suspicious")
        if report is not None:
            write_report(out, report)
            typer.echo(f"report: {report}")


@repo_tasks_app.command("synthesize")
def repo_tasks_synthesize(
    repo: Annotated[list[str], typer.Option(help="NAME=PATH of a git repository with a pytest suite; repeatable.")],
    out: Annotated[Path, typer.Option(help="Folder for tasks.jsonl, yield.json and the task repositories "
                                           "(repos/<NAME>).")],
    per_operator: Annotated[int, typer.Option(help="Mutants tried per operator and repository.")] = 4,
    seed: Annotated[int, typer.Option(help="Which mutants are sampled.")] = 0,
    workers: Annotated[int | None, typer.Option(help="Test runs at once (default: usable cores).")] = None,
) -> None:
    """Make SWE-bench-format tasks by bug injection from local repositories (no network): prints each
    repository's yield per operator and writes the validated tasks."""
    import json

    from codemill.cpus import usable_cpus
    from codemill.repos.cache import RepoCache
    from codemill.repos.evaluate import write_report
    from codemill.repos.synthesis import Synthesizer
    from codemill.repos.task import write_tasks

    with _known_failures():
        pairs: list[tuple[str, Path]] = []
        for item in repo:
            name, sep, where = item.partition("=")
            if not sep or not name or not where:
                raise typer.BadParameter(f"--repo {item!r}: expected NAME=PATH")
            pairs.append((name, Path(where)))
        synth = Synthesizer(RepoCache(), out / "repos", per_operator=per_operator, seed=seed,
                            workers=workers or usable_cpus())
        tasks, summaries = [], []
        for name, path in pairs:
            result = synth.synthesize(name, path)
            summaries.append(result.summary())
            tasks += result.tasks
            typer.echo(json.dumps(result.summary()))
        out.mkdir(parents=True, exist_ok=True)
        write_tasks(tasks, out / "tasks.jsonl")
        write_report({"repositories": summaries}, out / "yield.json")
        typer.echo(f"{len(tasks)} validated tasks from {sum(s['admitted'] for s in summaries)} admitted of "
                   f"{len(pairs)} repositories: {out / 'tasks.jsonl'}")


@app.command("mlflow-identities")
def mlflow_identities(
    tracking_uri: Annotated[str | None, typer.Option(help="The MLflow server (default: $MLFLOW_TRACKING_URI).")] = None,
    experiment: Annotated[list[str] | None, typer.Option(
        help="Experiment (a config's `name`) the admin creates first, so no other identity owns it; repeatable. "
             "Its registered model (same name) too.")] = None,
) -> None:
    """Create or update codemill's MLflow identities on a basic-auth server; run as its admin
    (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD). `pipeline` (password from
    CODEMILL_MLFLOW_PIPELINE_PASSWORD) may write runs, models and the alias; `reader`
    (CODEMILL_MLFLOW_READER_PASSWORD) may read. Rerun with new passwords to rotate them."""
    from codemill.lineage import PIPELINE_USER, READER_USER, TrackingAccessDenied, provision_identities

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    env = {PIPELINE_USER: "CODEMILL_MLFLOW_PIPELINE_PASSWORD", READER_USER: "CODEMILL_MLFLOW_READER_PASSWORD"}
    passwords = {user: os.environ.get(var, "") for user, var in env.items()}
    missing = [env[u] for u, p in passwords.items() if not p]
    if not uri or missing:
        console.print(f"[red]error:[/] set {', '.join(missing) or 'MLFLOW_TRACKING_URI or --tracking-uri'}")
        raise typer.Exit(2)
    try:
        done = provision_identities(uri, passwords, experiment or [], experiment or [])
    except TrackingAccessDenied as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e
    for line in done:
        console.print(line)


if __name__ == "__main__":
    app()
