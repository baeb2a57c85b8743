"""A checkpoint is reported (and logged as an MLflow LoggedModel) only once committed, with its own step's state;
the LoggedModel names the step and its losses, and no folder that pruning or the train task will delete."""

from __future__ import annotations

import pytest
import torch

from codemill.models.checkpoint import Checkpointer, committed_steps, staging_dir, step_dir
from codemill.models.config import TrainConfig
from codemill.models.trainer import RankZeroLogger, TrainSpec, TrainState


def _parts():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return model, opt, sched


@pytest.mark.parametrize("async_save", [False, True])
def test_on_commit_runs_after_the_commit_with_that_steps_state(tmp_path, async_save):
    root = tmp_path / "ckpt"
    seen: list[tuple[int, dict]] = []

    def on_commit(step: int, saved: dict) -> None:
        assert (step_dir(root, step) / "trainer.pt").exists() and not staging_dir(root, step).exists()
        seen.append((step, saved))

    ckpt = Checkpointer(root, 0, keep=1, barrier=lambda: None, async_save=async_save, on_commit=on_commit)
    ckpt.open()
    model, opt, sched = _parts()
    state = TrainState(step=5, losses=[3.0, 2.5], val_losses={5: 2.0})
    ckpt.save(5, model, opt, sched, state.snapshot())
    assert [s for s, _ in seen] == ([] if async_save else [5])  # an async save is not committed yet
    state.losses.append(2.2)
    state.val_losses[10] = 1.5  # the next checkpoint's val loss: not part of step 5's state
    ckpt.save(10, model, opt, sched, state.snapshot())
    ckpt.finish()
    assert [s for s, _ in seen] == [5, 10]
    assert seen[0][1]["val_losses"] == {5: 2.0} and seen[0][1]["losses"] == [3.0, 2.5]
    assert committed_steps(root) == [10]  # keep-last-1 pruned step 5 after 10 committed


def test_checkpoint_logged_model_has_step_and_losses_but_no_path(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from codemill.lineage import Lineage, mlflow_digest

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    lineage = Lineage(uri, "ckpt-test")
    with lineage.stage_run(None, "train", "d" * 64) as run_id:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
        spec = TrainSpec(train=TrainConfig(), tokens_dir="t", tokenizer_dir="t", out_dir="o", ckpt_dir="c",
                         vocab_size=8, eos_id=0, pad_id=1, seq_len=4, dataset_digest="a" * 64)
        logger = RankZeroLogger(0, spec)
        logger.log({"train_loss": 2.5}, step=5)
        logger.checkpoint(5, 2.5, 2.0)
        assert RankZeroLogger(1, spec).lineage is None  # other ranks never talk to MLflow
    client = MlflowClient(uri)
    (model,) = client.search_logged_models([lineage.experiment_id], filter_string=f"source_run_id = '{run_id}'")
    assert model.tags == {"codemill.step": "5"} and model.name == "ckpt-step5"
    metrics = {m.key: m for m in model.metrics}
    assert metrics["train_loss"].value == 2.5 and metrics["val_loss"].value == 2.0
    assert {m.dataset_digest for m in model.metrics} == {mlflow_digest("a" * 64)}
    assert [m.step for m in client.get_metric_history(run_id, "train_loss")] == [5, 5]
