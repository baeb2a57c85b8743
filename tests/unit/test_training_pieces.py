import sys
import time

import numpy as np
import pytest

from codemill.models.data_order import SequenceOrder, gather_rows
from codemill.models.launch import TrainingFailed, run_streaming
from codemill.models.schedule import cosine_with_warmup


def test_cosine_with_warmup_shape():
    f = [cosine_with_warmup(s, warmup=10, total=110, min_ratio=0.1) for s in range(120)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0) and f[60] == pytest.approx(0.55)
    assert f[110] == pytest.approx(0.1) and f[119] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[10:], f[11:], strict=False))


def test_data_order_ranks_disjoint_and_deterministic():
    order = SequenceOrder(100, seed=3)
    kw = dict(world=2, micro_batch=4, accum=2)
    step = [order.indices(5, m, r, **kw) for m in range(2) for r in range(2)]
    flat = np.concatenate(step)
    assert len(set(flat.tolist())) == 16
    again = SequenceOrder(100, seed=3)
    assert np.array_equal(again.indices(5, 1, 1, **kw), order.indices(5, 1, 1, **kw))


def test_data_order_covers_epoch_then_reshuffles():
    order = SequenceOrder(12, seed=0)
    epoch0 = np.concatenate([order.indices(s, 0, 0, world=1, micro_batch=4, accum=1) for s in range(3)])
    epoch1 = np.concatenate([order.indices(s, 0, 0, world=1, micro_batch=4, accum=1) for s in range(3, 6)])
    assert sorted(epoch0.tolist()) == list(range(12)) == sorted(epoch1.tolist())
    assert epoch0.tolist() != epoch1.tolist()


def test_gather_rows_across_shards():
    shards = [np.arange(6).reshape(2, 3), np.arange(6, 15).reshape(3, 3)]
    offsets = np.array([0, 2, 5])
    assert gather_rows(shards, offsets, np.array([4, 0, 2])).tolist() == [[12, 13, 14], [0, 1, 2], [6, 7, 8]]


def test_run_streaming_reports_last_error():
    lines = []
    cmd = [sys.executable, "-c", "print('hello', flush=True); import sys; sys.exit('boom: bad thing')"]
    with pytest.raises(TrainingFailed, match="boom: bad thing"):
        run_streaming(cmd, env={}, timeout_s=30, on_line=lines.append)
    assert lines[0] == "hello"


def test_run_streaming_kills_the_whole_group_on_timeout(tmp_path):
    marker = tmp_path / "child.pid"
    script = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(60)']); open({str(marker)!r}, 'w').write(str(p.pid)); print('started', flush=True); "
              "time.sleep(60)")
    t0 = time.monotonic()
    with pytest.raises(TrainingFailed, match="timed out"):
        run_streaming([sys.executable, "-c", script], env={}, timeout_s=2, on_line=lambda _: None)
    assert time.monotonic() - t0 < 20
    child = int(marker.read_text())
    time.sleep(0.5)
    assert not _running(child), "the trainer's child process outlived the timeout"


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan may wait for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_wsd_schedule_holds_then_decays():
    from codemill.models.schedule import lr_multiplier

    f = [lr_multiplier("wsd", s, warmup=5, total=100, min_ratio=0.1, decay_fraction=0.2) for s in range(100)]
    assert f[4] == pytest.approx(1.0) and f[50] == 1.0 and f[79] == 1.0
    assert f[80] < 1.0 and f[99] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[5:], f[6:], strict=False))
    with pytest.raises(ValueError):
        lr_multiplier("linear", 0, warmup=1, total=2, min_ratio=0.0)


def test_document_mask_blocks_across_documents():
    import torch

    from codemill.models.masking import document_ids, document_mask

    pos = torch.tensor([[0, 1, 2, 0, 1, 0]])
    assert document_ids(pos).tolist() == [[1, 1, 1, 2, 2, 3]]
    m = document_mask(pos)[0, 0]
    assert m[2].tolist() == [True, True, True, False, False, False]
    assert m[4].tolist() == [False, False, False, True, True, False]
    assert m[5].tolist() == [False] * 5 + [True]


def test_mfu_arithmetic_and_peak_table():
    from codemill.models.flops import flops_per_token, mfu, peak_flops

    per_token = flops_per_token(n_params=125_000_000, n_layers=12, n_heads=12, head_dim=64, seq_len=2048)
    assert per_token == 6 * 125e6 + 12 * 12 * 12 * 64 * 2048
    assert peak_flops("NVIDIA H200") == 989e12 and peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("cpu") is None and mfu(1e5, per_token, 1, None) is None
    assert mfu(400_000, per_token, 1, 989e12) == pytest.approx(400_000 * per_token / 989e12)
