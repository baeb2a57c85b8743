"""The names of codemill's MLflow tags, in one place: the writers (``lineage.record``), the readers
(``lineage.read``) and the code that reads tags back from runs all spell them from here. No MLflow import, so
anything may use them cheaply."""

from __future__ import annotations

PREFIX = "codemill"

STAGE = "codemill.stage"  # run: which stage (or "pipeline" for a flow's parent run)
DIGEST = "codemill.digest"  # LoggedModel: the store digest of its weights
OUTPUT_DIGEST = "codemill.output_digest"  # stage run: the digest of the artifact it produced
OUTPUT_URI = "codemill.output_uri"  # stage run / LoggedModel: where that artifact lives
REREGISTERED = "codemill.reregistered"  # stage run recorded for an artifact found in the store
SHIPPED = "codemill.shipped"  # stage run: the package data file its artifact was taken from, not built
MODEL_ID = "codemill.model_id"  # run / registry version: the LoggedModel it made or evaluated
MODEL_DIGEST = "codemill.model_digest"
MODEL_URI = "codemill.model_uri"
HF_DIR = "codemill.hf_dir"
SUITE = "codemill.suite"
UNSAFE_NO_SANDBOX = "codemill.eval.unsafe_no_sandbox"
SUITE_SKIPPED = "codemill.eval.skipped"  # why a suite did not apply to the model (it logged no metrics)
TRAIN_DATA_DIGEST = "codemill.train_data_digest"
SAMPLING_MODEL_ID = "codemill.rl.sampling_model_id"  # RL update run: the LoggedModel whose samples it trained on
EXTERNAL_PATH = "codemill.external_path"
CHECKPOINT_STEP = "codemill.step"
GATE_VERDICT = "codemill.gate.verdict"
GATE_CHAMPION_VERSION = "codemill.gate.champion_version"
FAILURE = "codemill.failure"
FAILED_STATE = "codemill.failed_state"
UNTIL = "codemill.until"
RECIPE_KEY = "codemill.recipe_key"  # calibration run / LoggedModel: the training recipe apart from seed and weights
CALIBRATION_URI = "codemill.calibration.uri"  # LoggedModel / calibration run: the noise artifact
REGISTERED_MODEL = "codemill.registered_model"  # calibration run: the registered model it calibrates


def calibration(recipe_key: str) -> str:
    """Registered model tag: where the calibration of one recipe (by its key) lives."""
    return f"codemill.calibration.{recipe_key[:16]}"


FLOW_RUN = "prefect.flow_run_id"
FLOW_RUN_URL = "prefect.flow_run_url"


def sandbox(key: str) -> str:
    """Evaluate / problems / RL run: what isolated its verdicts (isolation, bwrap, bwrap_origin, bwrap_version)."""
    return f"codemill.sandbox.{key}"


def eval_setting(key: str) -> str:
    """Evaluate run: what a measurement ran on (latency: engine, engine_version, device, dtype, torch, threads)."""
    return f"codemill.eval.{key}"


def input_digest(name: str) -> str:
    """Stage run: the digest of one of its inputs (by the input's name in the plan)."""
    return f"codemill.input.{name}.digest"


def source(i: int, key: str) -> str:
    """Ingest run: one field (root, repo, kind, fingerprint, commit) of its i-th source."""
    return f"codemill.source.{i}.{key}"


SOURCE_KEYS = ("root", "repo", "kind", "fingerprint", "commit")


def problem_source(i: int, key: str) -> str:
    """Problems run: one field (name, kind, root, fingerprint) of its i-th file source."""
    return f"codemill.problem_source.{i}.{key}"


def stage_status(key: str) -> str:
    """Pipeline parent run: ran / present / cached, per step."""
    return f"codemill.{key}.status"


def stage_digest(key: str) -> str:
    """Pipeline parent run: the artifact digest of each step."""
    return f"codemill.{key}.digest"
