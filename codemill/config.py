"""The pipeline's configuration: PipelineConfig composes the stage sections, which live beside their stages
(``data.config``, ``models.config``, ``evals.config``, ``rl.config``, ...), and a plug-in's section beside the
plug-in; this module loads YAML and presets and reports errors one line each.

PipelineConfig is the Prefect flow parameter, so every field carries a description (shown in the UI form)
and a default. Fields that do not change a stage's output are marked with ``affects_output=False``; they are
left out of the stage digest so that, say, a longer timeout does not invalidate a cached checkpoint.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError

from codemill.data.config import IngestConfig, TokenizeConfig
from codemill.evals.config import EvalConfig
from codemill.gate.config import GateConfig
from codemill.metrics.config import MetricsConfig
from codemill.models.config import TrainConfig
from codemill.problems.config import AugmentConfig, ProblemsConfig
from codemill.repos.config import RepoTasksConfig
from codemill.rl.config import RLConfig
from codemill.stage_config import StageConfig, runtime_only


class PipelineConfig(StageConfig):
    """Everything one pipeline run needs. Loadable from YAML; the Prefect flow's only parameter."""

    name: str = Field("codemill", description="Experiment name in MLflow.")
    store_root: str = runtime_only(default=".codemill/store", description="Artifact store: path or fsspec URL.")
    work_dir: str = runtime_only(default=".codemill/work", description="Local scratch: checkpoints, caches.")
    mlflow_tracking_uri: str = runtime_only(default="sqlite:///mlflow.db", description="MLflow tracking URI.")
    ray_address: str | None = runtime_only(
        default=None, description="Fan ingest chunks and tokenize shards out on Ray (prefect-ray's RayTaskRunner): "
        "'local' starts a local Ray cluster for the run, 'auto' or 'ray://host:10001' joins a running one; "
        "empty = in-process. Artifacts are identical either way.")
    ray_init: dict[str, Any] = runtime_only(default_factory=dict, description="Extra ray.init() keyword arguments "
                                            "(e.g. num_cpus, object_store_memory) for a local cluster.")
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    tokenize: TokenizeConfig = Field(default_factory=TokenizeConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    evaluate: EvalConfig = Field(default_factory=EvalConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    problems: ProblemsConfig = Field(default_factory=ProblemsConfig, description="The executable "
                                     "problem set (`codemill problems`).")
    augment: AugmentConfig = Field(default_factory=AugmentConfig, description="HumanEval+ tests: the augment "
                                   "stage, built once per HumanEval file and config (evaluate.humaneval.plus).")
    rl: RLConfig = Field(default_factory=RLConfig, description="RL for code (`codemill rl`).")
    repo_tasks: RepoTasksConfig = Field(default_factory=RepoTasksConfig, description="Repository tasks "
                                        "(`codemill repo-tasks build`).")
    metrics: MetricsConfig = runtime_only(default_factory=MetricsConfig, description="Prometheus metrics: "
                                          "Pushgateway and /metrics (off by default).")


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("codemill.configs").iterdir()
                  if p.name.endswith(".yaml"))


def load_preset(name: str) -> PipelineConfig:
    known = preset_names()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ";"
        raise ConfigError([f"unknown preset {name!r}{hint} known presets: {', '.join(known)}"])
    text = (resources.files("codemill.configs") / f"{name}.yaml").read_text()
    return parse_config(text, f"preset {name}")


def load_config(path: str | Path) -> PipelineConfig:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{p}: config file not found"]) from None
    except IsADirectoryError:
        raise ConfigError([f"{p}: is a directory, not a config file"]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{p}: cannot read the config file: {e}"]) from None
    return parse_config(text, str(p))


class ConfigError(ValueError):
    """A config that cannot be used, as one self-contained line per problem (the CLI prints them, exits 2)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def parse_config(text: str, source: str) -> PipelineConfig:
    """YAML text -> PipelineConfig; every failure is a ConfigError whose lines start with ``source``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError([_yaml_problem(e, source)]) from None
    try:
        return PipelineConfig.model_validate({} if data is None else data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, text)) from None


def format_validation_error(err: ValidationError, source: str, text: str | None = None,
                            model: type[BaseModel] = PipelineConfig) -> list[str]:
    """One line per problem: ``source[:line]: dotted.path: what is wrong``.

    pydantic's own report spends four lines on each problem and never says what was meant; an unknown key gets
    the nearest field of the model at that path (difflib), a bad value what was expected and what was given.
    ``text`` (the YAML the data came from) adds line numbers, and the problems come in file order."""
    found: list[tuple[int, str]] = []
    for e in err.errors(include_url=False):
        loc, _ = _config_path(model, e["loc"])
        if e["type"] == "extra_forbidden":
            name = str(loc[-1])
            _, parent = _config_path(model, e["loc"][:-1])
            fields = list(parent.model_fields) if parent else []
            close = difflib.get_close_matches(name, fields, n=1)
            problem = f"unknown field {name!r}"
            if close:
                problem += f"; did you mean {close[0]!r}?"
            elif fields:
                problem += f"; valid fields: {', '.join(fields)}"
        elif e["type"] == "missing":
            problem = "field required"
        else:
            msg = e["msg"]
            problem = "expected " + msg.removeprefix("Input should be ") if msg.startswith("Input should be ") \
                else msg
            given = repr(e["input"])
            problem += f"; got {given if len(given) <= 60 else given[:57] + '...'}"
        line = _yaml_line(text, loc) if text is not None else None
        found.append((line or 0, f"{source}{f':{line}' if line else ''}: {_dotted(loc)}: {problem}"))
    return [msg for _, msg in sorted(found, key=lambda f: f[0])]


def _dotted(loc: Sequence[int | str]) -> str:
    """('ingest', 'sources', 0, 'kind') -> 'ingest.sources[0].kind'; dict keys that are not names in [...]."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "top level"


def _config_path(model: type[BaseModel], loc: Sequence[int | str]) -> tuple[tuple[int | str, ...],
                                                                            type[BaseModel] | None]:
    """``loc`` as the config file spells it, and the config model found by following it through fields, list
    items and dict values (None if none). pydantic puts the tag of a discriminated union's member into the
    location (``ingest.sources.0.folder.include``); the file has no such key, so the tag is dropped and the walk
    goes on in that member."""
    t: Any = model
    out: list[int | str] = []
    for part in loc:
        member = _tagged_member(t, part)
        if member is not None:
            t = member
            continue
        out.append(part)
        t = _optional_inner(_strip_annotated(t))
        origin = get_origin(t)
        if origin in (list, tuple) and isinstance(part, int):
            t = get_args(t)[0]
        elif origin is dict:
            t = get_args(t)[1]
        elif origin is None and isinstance(t, type) and issubclass(t, BaseModel) and str(part) in t.model_fields:
            info = t.model_fields[str(part)]
            t = Annotated[info.annotation, info] if isinstance(info.discriminator, str) else info.annotation
        else:
            t = None
    t = _optional_inner(_strip_annotated(t))
    return tuple(out), t if get_origin(t) is None and isinstance(t, type) and issubclass(t, BaseModel) else None


def _tagged_member(t: Any, part: int | str) -> type[BaseModel] | None:
    """The member of the discriminated union ``t`` (an ``Annotated`` union with a discriminator) whose tag is
    ``part``; None when ``t`` is no such union or ``part`` no tag of it."""
    if get_origin(t) is not Annotated or not isinstance(part, str):
        return None
    union, *meta = get_args(t)
    tag = next((m.discriminator for m in meta if isinstance(getattr(m, "discriminator", None), str)), None)
    members = get_args(union) if tag is not None else ()
    return next((m for m in members if isinstance(m, type) and issubclass(m, BaseModel) and tag in m.model_fields
                 and m.model_fields[tag].default == part), None)


def _strip_annotated(t: Any) -> Any:
    while get_origin(t) is Annotated:
        t = get_args(t)[0]
    return t


def _optional_inner(t: Any) -> Any:
    """``X | None`` -> ``X`` (optional config sections such as train.lora)."""
    if get_origin(t) in (Union, types.UnionType):
        args = [a for a in get_args(t) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return t


def _yaml_line(text: str, loc: Sequence[int | str]) -> int | None:
    """1-based line of the deepest key or item of ``loc`` present in the YAML (a missing field: its parent's)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    if line is None and node is not None:
        line = node.start_mark.line + 1
    return line


def _yaml_problem(e: yaml.YAMLError, source: str) -> str:
    """``source:line:column: invalid YAML: problem (context)``, the shape editors and terminals link to."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        m, c = e.problem_mark, e.context_mark
        context = f" ({e.context} at {c.line + 1}:{c.column + 1})" if e.context and c is not None else ""
        return f"{source}:{m.line + 1}:{m.column + 1}: invalid YAML: {e.problem}{context}"
    return f"{source}: invalid YAML: {' '.join(str(e).split())}"
