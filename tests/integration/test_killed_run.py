"""A killed run leaves no orphans and no litter: ``codemill run`` SIGKILLed (its whole process group) mid-training
takes its torchrun and trainer ranks with it within seconds, the rerun resumes from the last committed checkpoint
to bit-identical weights, and the store keeps no staging or spec file of the dead run. A second trainer on a
checkpoint directory in use is refused before it touches it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL
from safetensors.torch import load_file

from codemill.models.checkpoint import committed_steps, lock_dir
from codemill.models.config import TrainConfig
from codemill.models.launch import threads_per_rank, torchrun_command
from codemill.models.trainer import TrainSpec
from codemill.store import ArtifactStore
from tests.integration.helpers import small_pipeline_config
from tests.integration.store_checks import committed_artifacts

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]
ROOT = Path(__file__).resolve().parents[2]
CODEMILL = Path(sys.executable).parent / "codemill"
# One checkpoint (step 40) before the last step, and one log line at the end: after the kill at step 40 a
# trainer writes nothing to its dead launcher's pipe for 40 steps, so a broken pipe cannot end it in time.
STEPS, EVERY = 80, 40


def _config(corpus: Path, tmp: Path) -> Path:
    cfg = small_pipeline_config(corpus, tmp, max_steps=STEPS)
    cfg.train.checkpoint_every, cfg.train.log_every, cfg.train.val_sequences = EVERY, STEPS, 16
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "config.yaml"
    path.write_text(cfg.model_dump_json())  # JSON is YAML
    return path


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}


def _start(config: Path) -> subprocess.Popen:
    """``codemill run --until train`` as a user starts it, in its own process group (so it can be killed whole)."""
    return subprocess.Popen([str(CODEMILL), "run", "--config", str(config), "--until", "train"], cwd=ROOT,
                            env={**_env(), "PREFECT_API_URL": PREFECT_API_URL.value()}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]


def _processes_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line names ``marker``: torchrun and the trainer ranks name the
    spec file, which lies in the run's store."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            found.append(int(p.name))
    return found


def _wait_for_checkpoint(work: Path, proc: subprocess.Popen, timeout: float = 300) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()[-4000:] if proc.stdout else ""
        for ckpt in work.glob("train/*/checkpoints"):
            if committed_steps(ckpt):
                return ckpt
        time.sleep(0.05)
    raise TimeoutError("no checkpoint committed")


def _train_uninterrupted(spec_file: Path, work: Path) -> Path:
    """The dead run's own training spec, run straight through by torchrun into ``work``: the reference."""
    spec = TrainSpec.model_validate_json(spec_file.read_text())
    spec.out_dir, spec.ckpt_dir = str(work / "out"), str(work / "ckpt")
    work.mkdir(parents=True)
    (work / "spec.json").write_text(spec.model_dump_json())
    env = {**_env(), "OMP_NUM_THREADS": str(threads_per_rank(spec.train.nproc_per_node)), "TQDM_DISABLE": "1"}
    r = subprocess.run(torchrun_command(str(work / "spec.json"), spec.train.nproc_per_node), env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return work / "out" / "hf" / "model.safetensors"


def test_sigkilled_run_leaves_no_orphans_and_reruns_exactly(small_corpus, tmp_path):
    config = _config(small_corpus, tmp_path / "run")
    store, work = tmp_path / "run" / "store", tmp_path / "run" / "work"
    proc = _start(config)
    try:
        ckpt = _wait_for_checkpoint(work, proc)
        trainers = _processes_with(str(store))
        assert len(trainers) >= 3, trainers  # torchrun and two ranks
        os.killpg(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait()
        while _processes_with(str(store)) and time.monotonic() < killed_at + 5:
            time.sleep(0.05)
        assert _processes_with(str(store)) == [], "trainer processes outlived the killed run"
        print(f"{len(trainers)} trainer processes gone {time.monotonic() - killed_at:.2f} s after the kill")
    finally:
        for pid in _processes_with(str(store)):  # never leave orphans behind on a red run
            os.kill(pid, signal.SIGKILL)
    assert committed_steps(ckpt) == [EVERY]
    (spec_file,) = store.glob("train/.staging-*.spec.json")  # the dead run's litter, for the sweep to remove
    assert list(store.glob("train/.staging-*/"))
    reference = _train_uninterrupted(spec_file, tmp_path / "reference")

    _finish(_start(config))
    found = committed_artifacts(ArtifactStore(str(store)))
    assert found["train/model"].stats["resumed_from"] == EVERY
    assert list(store.glob("*/.staging-*")) == [] and list(store.rglob("*.spec.json")) == []
    assert not ckpt.exists()  # the export superseded the checkpoints
    (resumed,) = store.glob("train/*/hf/model.safetensors")
    a, b = load_file(str(reference)), load_file(str(resumed))
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name] == b[name]).all(), name


def test_second_trainer_on_a_busy_checkpoint_dir_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    held = lock_dir(ckpt)  # a live trainer (this process) holds the directory
    try:
        (ckpt / ".staging-step-00000005").mkdir()  # its checkpoint being written
        spec = TrainSpec(train=TrainConfig(device="cpu", nproc_per_node=1), tokens_dir=str(tmp_path / "none"),
                         tokenizer_dir=str(tmp_path / "none"), out_dir=str(tmp_path / "out"), ckpt_dir=str(ckpt),
                         vocab_size=64, eos_id=0, pad_id=1, seq_len=16)
        (tmp_path / "spec.json").write_text(spec.model_dump_json())
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}, "OMP_NUM_THREADS": "1"}
        r = subprocess.run(torchrun_command(str(tmp_path / "spec.json"), 1), env=env, capture_output=True, text=True,
                           timeout=120)
    finally:
        os.close(held)
    assert r.returncode != 0
    assert f"checkpoint directory {ckpt} is in use by another trainer (pid {os.getpid()}" in r.stdout + r.stderr
    assert (ckpt / ".staging-step-00000005").is_dir()  # refused before it cleared anything
