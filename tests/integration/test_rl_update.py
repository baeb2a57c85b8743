"""The GRPO update under torchrun (2 ranks, gloo): it moves log-probs the way the advantages say, resumes exactly
after SIGKILL, runs under DDP and FSDP2 alike, and exports the policy unchanged when no group has a signal.

The policy is a tiny Llama with the project's BPE tokenizer; the rollouts table follows docs/rl.md#rollouts-table,
its log-probs computed by the policy itself (the sampler's convention), so the first ratio is 1."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from codemill.models.checkpoint import committed_steps
from codemill.models.config import ModelConfig
from codemill.models.launch import torchrun_command
from codemill.rl.algorithms.grpo import GRPOConfig
from codemill.rl.trajectory import write_rollouts
from codemill.rl.update import SUMMARY, RLUpdateSpec, update

pytestmark = pytest.mark.integration
GROUPS, K, MAX_NEW = 6, 4, 6
EVERY, KILL_AT = 2, 5
TEXTS = ["def add(a, b):\n    return a + b\n", "def square(x):\n    return x * x\n",
         "def is_even(n):\n    return n % 2 == 0\n", "def first(xs):\n    return xs[0]\n"] * 8


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The in-process work (rollout log-probs, the one-rank update) on one thread, as the torchrun ranks run: two
    spinning OpenMP threads on the shared 2-core machine slow a tiny model down; restored after the module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    """A train-stage-style HF folder: tiny Llama weights + the project's tokenizer files."""
    from codemill.data.tokenizer import save_tokenizer, train_bpe
    from codemill.models.build import build_model

    root = tmp_path_factory.mktemp("rl-policy")
    info = save_tokenizer(train_bpe(TEXTS, vocab_size=300, min_frequency=1), root / "tok")
    vocab = len(json.loads((root / "tok" / "tokenizer.json").read_text())["model"]["vocab"])
    cfg = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    model = build_model(cfg, vocab_size=vocab, max_len=64, eos_id=0, pad_id=1, seed=11)
    model.save_pretrained(str(root / "hf"))
    for f in (root / "tok" / "hf").iterdir():
        shutil.copy2(f, root / "hf" / f.name)
    assert info  # save_tokenizer reports what it wrote
    return root / "hf"


def _logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    """The contract's convention, one row at a time (as a sampler would see it)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1:-1] / temperature, -1)
    return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).tolist()


def _write_rollouts(policy: Path, path: Path, rewards: list[list[float]], temperature: float = 1.0) -> Path:
    """One group per prompt; random completions of 2..MAX_NEW tokens, the last sample of group 0 truncated."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(policy))
    model = AutoModelForCausalLM.from_pretrained(str(policy)).eval()
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    for g, group_rewards in enumerate(rewards):
        prompt = TEXTS[g % 4].split("\n")[0] + "\n"
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        for s, r in enumerate(group_rewards):
            truncated = g == 0 and s == len(group_rewards) - 1
            n = MAX_NEW if truncated else int(rng.integers(2, MAX_NEW))
            completion = rng.integers(5, len(tok), size=n).tolist()
            rows.append({"problem_id": f"p{g}", "group": g, "sample": s, "prompt": prompt,
                         "completion": tok.decode(completion), "prompt_ids": prompt_ids, "completion_ids": completion,
                         "loss_mask": [1] * n, "logprobs": _logprobs(model, prompt_ids, completion, temperature),
                         "turn_starts": [0], "turns": 1, "turn_finish_reasons": ["length" if truncated else "stop"],
                         "finish_reason": "length" if truncated else "stop",
                         "reward": r, "turn_rewards": [r], "partial": r, "outcome": "passed" if r >= 1 else "failed",
                         "duration_s": 0.01, "suspicious": ""})
    return write_rollouts(rows, path)


# groups 0-2 and 4 mixed (group 0's truncated sample masked), group 3 all pass and group 5 all fail (dropped)
REWARDS = [[1, 0, 0, 1], [0, 1, 0, 0], [1, 1, 0, 1], [1, 1, 1, 1], [0, 1, 1, 0], [0, 0, 0, 0]]


@pytest.fixture(scope="module")
def rollouts(policy, tmp_path_factory) -> Path:
    return _write_rollouts(policy, tmp_path_factory.mktemp("rl-rollouts") / "rollouts.parquet",
                           [[float(r) for r in g] for g in REWARDS])


def _spec(policy: Path, rollouts: Path, work: Path, parallelism: str = "ddp", **grpo) -> Path:
    cfg = GRPOConfig(lr=2e-3, epochs=3, micro_batch_size=2, grad_accum=2, parallelism=parallelism,
                     nproc_per_node=2, device="cpu", checkpoint_every=EVERY, keep_checkpoints=1, **grpo)
    spec = RLUpdateSpec(grpo=cfg, policy_dir=str(policy), rollouts_path=str(rollouts), out_dir=str(work / "out"),
                        ckpt_dir=str(work / "ckpt"), max_new_tokens=MAX_NEW,
                        reference_dir=str(policy) if parallelism == "fsdp" else None)
    work.mkdir(parents=True, exist_ok=True)
    (work / "spec.json").write_text(spec.model_dump_json())
    return work / "spec.json"


def _run(spec: Path, kill_at: int | None = None) -> list[dict]:
    """torchrun to the end, or SIGKILL its process group once rank 0 reports step ``kill_at``."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(torchrun_command(str(spec), 2, module="codemill.rl.update"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    assert proc.stdout is not None
    events, tail = [], []
    for line in proc.stdout:
        tail.append(line)
        if line.startswith("{"):
            events.append(json.loads(line))
            if kill_at is not None and events[-1]["event"] == "step" and events[-1]["step"] >= kill_at:
                os.killpg(proc.pid, signal.SIGKILL)
                break
    proc.wait(timeout=120)
    proc.stdout.close()
    if kill_at is None:
        assert proc.returncode == 0, "".join(tail[-200:])  # every rank's last words, not only torchrun's summary
    return events


@pytest.fixture(scope="module")
def ddp_run(policy, rollouts, tmp_path_factory) -> tuple[Path, list[dict]]:
    work = tmp_path_factory.mktemp("rl-ddp")
    return work, _run(_spec(policy, rollouts, work))


def _seq_logprobs(model_dir: Path, table: dict) -> np.ndarray:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    return np.array([sum(_logprobs(model, list(p), list(c), 1.0))
                     for p, c in zip(table["prompt_ids"], table["completion_ids"], strict=True)])


def test_update_moves_logprobs_with_the_advantages(policy, rollouts, ddp_run):
    work, events = ddp_run
    done = events[-1]
    assert done["event"] == "done"
    m = done["metrics"]
    assert (m["groups"], m["groups_kept"], m["groups_dropped"], m["groups_zero_variance"]) == (6, 4, 2, 2)
    assert (m["samples"], m["samples_truncated"], m["samples_kept"]) == (24, 1, 15)
    assert m["steps"] == 3 * 2 and [e["step"] for e in events if e["event"] == "step"] == [1, 2, 3, 4, 5, 6]
    first = next(e for e in events if e["event"] == "step")
    assert first["max_steps"] == 6  # the trainer's key: the launcher's progress reads it
    assert first["ratio_min"] == pytest.approx(1.0, abs=1e-4) and first["ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert first["kl_old"] == pytest.approx(0.0, abs=1e-6)
    for key in ["loss", "pg_loss", "kl", "entropy", "clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_min",
                "ratio_max", "tokens", "grad_norm", "update_s", "tokens_per_s"]:
        assert isinstance(m[key], float | int), key
    assert m["kl"] > 0 and m["entropy"] > 0 and m["ratio_max"] > 1.0

    out = work / "out"
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["metrics"]["steps"] == 6 and len(summary["history"]) == 6
    assert {p.name for p in Path(policy).iterdir() if "token" in p.name} <= {p.name for p in out.iterdir()}
    from transformers import AutoTokenizer

    assert len(AutoTokenizer.from_pretrained(str(out))) == len(AutoTokenizer.from_pretrained(str(policy)))

    table = pq.read_table(rollouts).to_pydict()
    before, after = _seq_logprobs(policy, table), _seq_logprobs(out, table)
    from codemill.rl.algorithms.grpo import group_advantages

    adv = group_advantages(table["reward"], table["group"])
    trained = (adv != 0) & (np.array(table["finish_reason"]) != "length")
    delta = after - before
    print("log-prob change, positive:", delta[trained & (adv > 0)].round(2),
          "negative:", delta[trained & (adv < 0)].round(2))
    assert (delta[trained & (adv > 0)] > 0).all()
    assert (delta[trained & (adv < 0)] < 0).all()


def test_sigkill_and_resume_is_bit_identical(policy, rollouts, ddp_run, tmp_path):
    straight, _ = ddp_run
    spec = _spec(policy, rollouts, tmp_path)
    _run(spec, kill_at=KILL_AT)
    assert not (tmp_path / "out").exists()  # nothing export-like before the end
    assert committed_steps(tmp_path / "ckpt") == [(KILL_AT // EVERY) * EVERY]
    events = _run(spec)
    assert {"event": "resumed", "step": 4} in events
    assert [e["step"] for e in events if e["event"] == "step"] == [5, 6]
    a = load_file(str(straight / "out" / "model.safetensors"))
    b = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    ref = json.loads((straight / "out" / SUMMARY).read_text())["history"]
    got = json.loads((tmp_path / "out" / SUMMARY).read_text())["history"]
    assert got == ref  # the steps before the kill come from the checkpoint, those after match to the bit


def test_fsdp_with_a_reference_matches_ddp(policy, rollouts, ddp_run, tmp_path):
    """FSDP2 (and a reference model, kl_coef 0: only measured) gives the DDP run's weights up to reduction order;
    the reference is the sampling policy, so the first step's KL to it is 0."""
    straight, _ = ddp_run
    events = _run(_spec(policy, rollouts, tmp_path, parallelism="fsdp"))
    steps = [e for e in events if e["event"] == "step"]
    assert steps[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6) and steps[-1]["kl_ref"] > 0
    assert steps[-1]["kl"] == steps[-1]["kl_ref"]
    a = load_file(str(straight / "out" / "model.safetensors"))
    b = load_file(str(tmp_path / "out" / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5)
    assert any(not torch.equal(a[n], load_file(str(policy / "model.safetensors"))[n]) for n in a)


def test_no_group_with_a_signal_exports_the_policy_unchanged(policy, ddp_run, tmp_path):
    """All groups zero-variance: nothing to learn, so the export is the policy itself and the metrics say so
    (one rank, in process: the skip path loads no model)."""
    rollouts = _write_rollouts(policy, tmp_path / "rollouts.parquet", [[1.0] * 3, [0.0] * 3])
    spec = RLUpdateSpec.model_validate_json(_spec(policy, rollouts, tmp_path).read_text())
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        summary = update(spec)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    m = summary["metrics"]
    assert (m["groups"], m["groups_kept"], m["groups_dropped"], m["steps"]) == (2, 0, 2, 0)
    assert "dynamic sampling" in summary["skipped"]
    assert set(m) == set(ddp_run[1][-1]["metrics"])  # the same metric names as a real update
    out = tmp_path / "out"
    for f in Path(policy).iterdir():
        assert (out / f.name).read_bytes() == f.read_bytes(), f.name
    assert json.loads((out / SUMMARY).read_text())["metrics"]["groups_kept"] == 0


def test_one_rank_matches_two_ranks(policy, rollouts, ddp_run, tmp_path):
    """The same steps on one rank (twice the micro-batch) give the two-rank weights: the loss is normalised by the
    whole step's token count, not per rank or micro-batch (in process: one rank needs no torchrun)."""
    straight, _ = ddp_run
    spec = RLUpdateSpec.model_validate_json(_spec(policy, rollouts, tmp_path).read_text())
    spec.grpo.micro_batch_size, spec.grpo.nproc_per_node = 4, 1
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        summary = update(spec)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert summary["metrics"]["steps"] == 6
    a = load_file(str(straight / "out" / "model.safetensors"))
    b = load_file(str(tmp_path / "out" / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5)

    # its checkpoints belong to these rollouts: an update of other rollouts refuses to resume them
    assert committed_steps(tmp_path / "ckpt") == [4]
    shutil.copytree(tmp_path / "ckpt", tmp_path / "ckpt-other")  # (this process still holds the first one's lock)
    other = _write_rollouts(policy, tmp_path / "other.parquet", [[1.0, 0.0, 0.0, 1.0]] * 4)
    spec = spec.model_copy(update={"rollouts_path": str(other), "ckpt_dir": str(tmp_path / "ckpt-other")})
    try:
        with pytest.raises(RuntimeError, match="checkpoint of a different update"):
            update(spec)
    finally:
        torch.use_deterministic_algorithms(deterministic)


def _chain(policy: Path, rollouts: list[Path], work: Path) -> list[RLUpdateSpec]:
    """Updates that continue one another as an RL run's do: each starts from the previous export and its
    optimizer state."""
    specs, start, optimizer = [], policy, None
    for i, table in enumerate(rollouts):
        cfg = GRPOConfig(lr=2e-3, epochs=2, micro_batch_size=2, grad_accum=2, nproc_per_node=2, device="cpu",
                         checkpoint_every=EVERY, keep_checkpoints=1, seed=100 + i)
        specs.append(RLUpdateSpec(grpo=cfg, policy_dir=str(start), rollouts_path=str(table),
                                  out_dir=str(work / f"{i}" / "out"), ckpt_dir=str(work / f"{i}" / "ckpt"),
                                  max_new_tokens=MAX_NEW, optimizer_in=optimizer,
                                  optimizer_out=str(work / f"{i}" / "optimizer")))
        start, optimizer = work / f"{i}" / "out", str(work / f"{i}" / "optimizer")
    return specs


def _same_policies(a: Path, b: Path) -> None:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    ha, hb = (json.loads((p / SUMMARY).read_text())["history"] for p in (a, b))
    assert ha == hb


def test_long_lived_workers_match_one_torchrun_per_update(policy, rollouts, tmp_path):
    """Three chained updates (train, nothing to learn, train) served by one worker group, the policy and AdamW
    state kept in memory from one to the next, give the bytes that one torchrun per update gives from disk."""
    from codemill.rl.update_workers import UpdateWorkers

    flat = _write_rollouts(policy, tmp_path / "flat.parquet", [[1.0] * 4, [0.0] * 4])
    tables = [rollouts, flat, rollouts]
    for spec in _chain(policy, tables, tmp_path / "oneshot"):
        Path(spec.out_dir).parent.mkdir(parents=True)
        (Path(spec.out_dir).parent / "spec.json").write_text(spec.model_dump_json())
        _run(Path(spec.out_dir).parent / "spec.json")

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}, "OMP_NUM_THREADS": "1"}
    workers = UpdateWorkers(2, tmp_path / "control", env)
    lines: list[list[str]] = []
    try:
        for i, spec in enumerate(_chain(policy, tables, tmp_path / "served")):
            lines.append([])
            workers.run(spec, policy_key="base" if i == 0 else f"policy-{i - 1}", output_key=f"policy-{i}",
                        timeout_s=300, on_line=lines[-1].append)
        assert workers.alive()  # one group served all three
    finally:
        workers.close()
    assert not workers.alive() and not (tmp_path / "control").exists()
    starts = [[json.loads(x) for x in ls if x.startswith('{"event": "start"')] for ls in lines]
    assert [s[0]["from_memory"] for s in starts if s] == [False, True]  # the skip loads no model
    assert all(any(x.startswith('{"event": "done"') for x in ls) for ls in lines)
    for i in (0, 1, 2):
        _same_policies(tmp_path / "oneshot" / f"{i}" / "out", tmp_path / "served" / f"{i}" / "out")


def test_a_failing_update_stops_the_workers_and_the_next_starts_fresh(policy, rollouts, tmp_path):
    """An update that fails raises its error in the caller and ends the group (its ranks may be out of step); the
    run's next update gets a new group, which reads its start from disk."""
    from codemill.models.launch import TrainingFailed
    from codemill.rl.update_workers import UpdateWorkers, close_live_workers, live_workers

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}, "OMP_NUM_THREADS": "1"}
    specs = _chain(policy, [rollouts, rollouts], tmp_path / "w")
    broken = specs[0].model_copy(update={"rollouts_path": str(tmp_path / "missing.parquet")})
    try:
        first = live_workers("k", lambda: UpdateWorkers(2, tmp_path / "c1", env))
        with pytest.raises(TrainingFailed, match="missing.parquet"):
            first.run(broken, "base", "policy-0", timeout_s=120, on_line=lambda line: None)
        assert not first.alive()
        second = live_workers("k", lambda: UpdateWorkers(2, tmp_path / "c2", env))
        assert second is not first
        for i, spec in enumerate(specs):
            second.run(spec, "base" if i == 0 else "policy-0", f"policy-{i}", timeout_s=300,
                       on_line=lambda line: None)
        assert live_workers("k", lambda: UpdateWorkers(2, tmp_path / "c3", env)) is second
    finally:
        close_live_workers()
    assert (tmp_path / "w" / "1" / "out" / "model.safetensors").exists()
