"""What a command's planned steps need from this machine, checked before its flow starts.

A run that would die at its fifth stage for want of something the first second could see (no sandbox, a
tracking server that refuses the password, an unwritable store, a GPU that is not there) stops at once, with
one line per problem and a hint. ``codemill plan`` shows the same checks without failing. Only what the
planned steps use is checked: the sandbox only when a step executes model or reference code (HumanEval,
problems, RL), torchrun and the device only when a step trains.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from codemill.config import PipelineConfig
from codemill.errors import UserFacingError

MiB = 1 << 20
DISK_MARGIN = 256 * MiB  # logs, caches and the data stages' artifacts, which the estimate leaves out


@dataclass(frozen=True)
class Check:
    name: str
    problem: str | None = None  # None: the check passed
    detail: str = ""  # what was found, shown when it passed
    hint: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class Needs:
    """What the planned steps of one command use."""

    sandbox: bool = False
    training: bool = False
    devices: tuple[str, ...] = ()  # the device preferences ("auto", "cpu", "cuda") of the steps that train or sample
    vllm: str | None = None  # the setting that makes a step sample with vLLM (rl.rollout.engine, evaluate.engine)
    overlay: bool = False  # repository workspaces: overlay mounts, which need bubblewrap 0.10 or newer


def needs_of(command: str, cfg: PipelineConfig, until: str = "evaluate") -> Needs:
    """The needs of ``command`` on ``cfg`` (``until`` for ``run``; ``evaluate`` uses the config's suites)."""
    from codemill.evals import suites

    sandboxed_suites = any(suites.get(s).uses_sandbox(cfg.evaluate) for s in cfg.evaluate.suites)
    repo_suite = any(suites.get(s).uses_overlay for s in cfg.evaluate.suites)
    eval_vllm = "evaluate.engine" if suites.samples_with_vllm(cfg.evaluate) else None
    if command == "run":
        trains = until in ("train", "evaluate")
        evaluates = until == "evaluate"
        return Needs(sandbox=evaluates and sandboxed_suites, training=trains,
                     devices=(cfg.train.device,) if trains else (), vllm=eval_vllm if evaluates else None,
                     overlay=evaluates and repo_suite)
    if command == "calibrate":
        return Needs(sandbox=sandboxed_suites, training=True, devices=(cfg.train.device,), vllm=eval_vllm,
                     overlay=repo_suite)
    if command == "evaluate":
        return Needs(sandbox=sandboxed_suites, vllm=eval_vllm, overlay=repo_suite)
    if command in ("problems", "repo-tasks build"):
        return Needs(sandbox=True, overlay=command == "repo-tasks build")
    if command == "rl":
        update_device = getattr(cfg.rl.algorithm, "device", cfg.train.device)  # rft trains with train's device
        rollout_vllm = "rl.rollout.engine" if cfg.rl.rollout.engine == "vllm" else None
        return Needs(sandbox=True, training=True, devices=(cfg.train.device, update_device),
                     vllm=rollout_vllm or eval_vllm, overlay=cfg.rl.env.kind == "repo" or repo_suite)
    if command == "serve":  # serves every deployment: the pipeline, evaluation, problems and RL
        return Needs(sandbox=True, training=True, devices=(cfg.train.device,))
    raise ValueError(f"no preflight for command {command!r}")


def run_checks(cfg: PipelineConfig, needs: Needs) -> list[Check]:
    checks: list[Callable[[], Check]] = [lambda: check_store(cfg), lambda: check_tracking(cfg)]
    if needs.sandbox or needs.overlay:
        overlay = needs.overlay
        checks.append(lambda: check_sandbox(overlay))
    if needs.training:
        checks += [check_torchrun, lambda: check_disk(cfg)]
    if "cuda" in needs.devices:
        checks.append(check_cuda)
    if needs.vllm:
        setting = needs.vllm
        checks.append(lambda: check_vllm(setting))
    return [check() for check in checks]


def check_store(cfg: PipelineConfig) -> Check:
    from codemill.store import store_problem, writable_problem

    problem = store_problem(cfg.store_root) or _prefixed("work_dir", writable_problem(cfg.work_dir))
    if problem:
        return Check("store", problem, hint="pass --store with a writable path or a reachable URL (and its "
                                            "credentials), or fix the permissions")
    return Check("store", detail=cfg.store_root)


def _prefixed(what: str, problem: str | None) -> str | None:
    return f"{what}: {problem}" if problem else None


def check_tracking(cfg: PipelineConfig) -> Check:
    """The tracking store the run will use (``mlflow_tracking_uri``, as the flows read it): an HTTP server must
    answer and accept this client's credentials (one authenticated read through MLflow's client, the run's
    own first call); a SQLite or file store's folder must be writable."""
    from codemill.lineage.check import check_local_tracking_store, check_tracking_server, is_http

    uri = cfg.mlflow_tracking_uri
    try:
        check_tracking_server(uri, timeout=5)
        check_local_tracking_store(uri)
        if is_http(uri):
            from codemill.lineage import check_credentials

            check_credentials(uri)
    except UserFacingError as e:
        return Check("mlflow", str(e), hint=e.hint)
    return Check("mlflow", detail=uri)


def check_sandbox(overlay: bool = False) -> Check:
    """The sandbox starts, isolated; with ``overlay`` (repository workspaces), with a bubblewrap that mounts
    overlays."""
    from codemill.sandbox import Sandbox, SandboxUnavailable
    from codemill.sandbox.uids import NoFreeUid

    try:
        info = Sandbox(overlay=overlay).probe()
    except SandboxUnavailable as e:
        return Check("sandbox", str(e), hint=e.hint)
    except NoFreeUid as e:
        return Check("sandbox", f"the sandbox cannot start: {e}", hint="wait for the other sandboxes on this "
                                                                      "machine to finish")
    return Check("sandbox", detail=f"{info['bwrap_origin']} {info['bwrap_version']} ({info['bwrap']})")


def check_torchrun() -> Check:
    """torchrun is ``python -m torch.distributed.run`` of this interpreter: torch must be importable here."""
    if importlib.util.find_spec("torch") is None:
        return Check("torchrun", "torch is not installed in this Python, so torchrun cannot start the trainer",
                     hint="pip install -c constraints.txt torch==2.13.0 (the CPU wheel), or a CUDA build on GPU")
    return Check("torchrun", detail="python -m torch.distributed.run")


def check_vllm(setting: str = "rl.rollout.engine") -> Check:
    """vLLM lives in an environment of its own (scripts/vllm-env): the command must run from there."""
    from codemill.models.engines import vllm_available

    if not vllm_available():
        return Check("vllm", f"{setting} is vllm but vllm is not importable in this Python",
                     hint=f"build its environment (scripts/vllm-env DIR) and run DIR/bin/codemill, or set "
                          f"{setting}: hf")
    return Check("vllm", detail="importable")


def check_cuda() -> Check:
    if importlib.util.find_spec("torch") is None:
        return Check("device", "the config asks for device cuda, but torch is not installed",
                     hint="install a CUDA build of torch, or set train.device to auto or cpu")
    import torch

    if not torch.cuda.is_available():
        return Check("device", "the config asks for device cuda, but torch sees no CUDA device here "
                     f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})",
                     hint="set train.device (and rl.algorithm.device) to auto or cpu, or run on a GPU machine")
    return Check("device", detail=f"cuda: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")


def checkpoint_bytes(cfg: PipelineConfig) -> int | None:
    """Disk the trainings' checkpoints need in ``work_dir``: weights and the two AdamW moments (fp32) per kept
    checkpoint plus the one being written, and the exported weights, for each of ``train.seeds``. None for a
    pretrained start (its size is not known before it loads)."""
    if cfg.train.init_from:
        return None
    m, vocab = cfg.train.model, cfg.tokenize.vocab_size
    head_dim = m.hidden_size // m.num_heads
    per_layer = (2 * m.hidden_size * m.hidden_size + 2 * m.hidden_size * head_dim * m.num_kv_heads
                 + 3 * m.hidden_size * m.intermediate_size + 2 * m.hidden_size)
    params = vocab * m.hidden_size + m.num_layers * per_layer + m.hidden_size  # embeddings tied to the head
    return params * 4 * (3 * (cfg.train.keep_checkpoints + 1) + 1) * cfg.train.seeds


def check_disk(cfg: PipelineConfig) -> Check:
    need = checkpoint_bytes(cfg)
    from codemill.store import nearest_existing

    folder = nearest_existing(cfg.work_dir)
    free = shutil.disk_usage(folder).free
    if need is None:
        return Check("disk", detail=f"{free / MiB:,.0f} MiB free in {folder} (checkpoint size unknown: "
                                    "pretrained start)")
    need += DISK_MARGIN
    if free < need:
        return Check("disk", f"{free / MiB:,.0f} MiB free in {folder}, the training needs about "
                             f"{need / MiB:,.0f} MiB (checkpoints x{cfg.train.keep_checkpoints + 1} and export, "
                             f"x{cfg.train.seeds} seeds)",
                     hint="free disk there, lower train.keep_checkpoints, or set work_dir elsewhere")
    return Check("disk", detail=f"{free / MiB:,.0f} MiB free, about {need / MiB:,.0f} MiB needed")
