"""Bad input: broken files are counted by reason and skipped; a missing source path fails at once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from codemill.data.config import IngestConfig
from codemill.data.folder_source import SourceNotFoundError
from codemill.data.sources import FolderSource
from tests.system_tools import require

INGEST_ONCE = """
import json, sys
from prefect.logging import disable_run_logger
from codemill.config import IngestConfig
from codemill.tasks.common import RunContext
from codemill.tasks.ingest import fingerprint_sources_task, ingest_task, plan_ingest
cfg = IngestConfig.model_validate_json(sys.argv[1])
ctx = RunContext.model_validate_json(sys.argv[2])
with disable_run_logger():
    sources = fingerprint_sources_task.fn(cfg)
    result = ingest_task.fn(plan=plan_ingest(cfg, sources), ctx=ctx, cfg=cfg, sources=sources)
print(result.model_dump_json())
"""


def _without_root_privileges() -> list[str]:
    """As root, file modes do not stop reads; drop the capabilities that bypass them (util-linux setpriv)."""
    if os.geteuid() != 0:
        return []
    require("setpriv")
    return [str(shutil.which("setpriv")), "--bounding-set", "-dac_override,-dac_read_search"]


MARKER = "marker-3c1e: a file outside the source root"


def make_bad_corpus(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "good.py").write_text("def ok():\n    return 'fine'\n")
    (root / "pkg" / "also_good.py").write_text("VALUE = 42\n")
    (root / "other").mkdir()
    (root / "other" / "fine.py").write_text("class Fine:\n    pass\n")
    (root / "binary.py").write_bytes(bytes(range(256)) * 4)
    (root / "latin1.py").write_bytes("name = 'Jos\xe9'\n".encode("latin-1"))
    (root / "empty.py").write_text("")
    os.symlink("loop_b.py", root / "loop_a.py")
    os.symlink("loop_a.py", root / "loop_b.py")
    os.symlink("..", root / "pkg" / "up")  # a directory loop: never followed
    (root.parent / "credentials.py").write_text(f"PASSWORD = {MARKER!r}\n")  # outside the source root
    os.symlink(root.parent / "credentials.py", root / "pkg" / "settings.py")
    secret = root / "unreadable.py"
    secret.write_text("x = 1\n")
    secret.chmod(0)
    return root


def test_bad_files_are_counted_by_reason_and_the_run_is_clean(tmp_path, mlflow_uri):
    corpus = make_bad_corpus(tmp_path / "bad")
    cfg = IngestConfig(sources=[FolderSource(path=str(corpus), exclude=[])], val_fraction=0.5)
    ctx = {"store_root": str(tmp_path / "store"), "work_dir": str(tmp_path / "work"), "tracking_uri": mlflow_uri,
           "experiment": "bad-input"}
    proc = subprocess.run([*_without_root_privileges(), sys.executable, "-c", INGEST_ONCE, cfg.model_dump_json(),
                           json.dumps(ctx)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["status"] == "ran"
    manifest = json.loads((Path(result["ref"]["uri"]) / "manifest.json").read_text())
    assert manifest["stats"]["rejected_by_reason"] == {
        "binary": 1, "invalid_utf8": 1, "empty": 1, "symlink_loop": 2, "unreadable": 1,
        "symlinked_dir_not_followed": 1, "symlink_outside_root": 1}
    assert manifest["stats"]["files_kept"] == 3
    examples = dict(map(tuple, manifest["stats"]["rejected_examples"]))
    assert examples[f"{corpus.name}/unreadable.py"] == "unreadable"
    assert examples[f"{corpus.name}/latin1.py"] == "invalid_utf8"
    assert examples[f"{corpus.name}/pkg/settings.py"] == "symlink_outside_root"
    shards = list(Path(result["ref"]["uri"]).glob("*/*.parquet"))
    assert shards and not any(MARKER in pl.read_parquet(f)["content"].str.join("").item() for f in shards)


def test_missing_source_path_fails_at_once_naming_it(tmp_path):
    from codemill.data.ingest import fingerprint_sources

    missing = tmp_path / "does-not-exist"
    with pytest.raises(SourceNotFoundError, match=str(missing)):
        fingerprint_sources(IngestConfig(sources=[FolderSource(path=str(missing))]))


def test_cli_rejects_missing_source_before_starting_anything(tmp_path):
    missing = tmp_path / "nowhere"
    proc = subprocess.run([sys.executable, "-m", "codemill.cli", "run", "--source", str(missing)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "COLUMNS": "400", "NO_COLOR": "1"})
    assert proc.returncode == 2
    assert f"source path does not exist: {missing}" in proc.stdout + proc.stderr
    assert not (tmp_path / ".codemill").exists()
