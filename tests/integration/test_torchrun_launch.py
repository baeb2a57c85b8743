"""The torchrun launcher with real ranks: two jobs started together on one machine meet on rendezvous ports of
their own, and a dead job is named by the rank that died first, not by the echo another rank printed last."""

from __future__ import annotations

import json
import os
import threading

import pytest

from codemill.models.launch import TrainingFailed, last_exception_line, run_streaming, torchrun_command

pytestmark = pytest.mark.integration
MODULE = "tests.torchrun_jobs"


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def test_two_jobs_started_together_meet_on_their_own_rendezvous() -> None:
    """Each single-node launch's rendezvous binds a port the OS picks and holds it (``--standalone``): two at
    once never share one, so each group sums only its own ranks."""
    lines: dict[int, list[str]] = {0: [], 10: []}
    errors: list[BaseException] = []

    def launch(offset: int) -> None:
        try:
            run_streaming(torchrun_command(f"sum:{offset}", 2, module=MODULE), _env(), 180, lines[offset].append)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    jobs = [threading.Thread(target=launch, args=(offset,)) for offset in lines]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    assert not errors, [getattr(e, "last_error", e) for e in errors]
    sums = {offset: json.loads(next(line for line in out if line.startswith('{"event": "sum"')))
            for offset, out in lines.items()}
    assert {offset: s["sum"] for offset, s in sums.items()} == {0: 1.0, 10: 21.0}  # ranks 0+1, 10+11: no mixing
    assert sums[0]["port"] != sums[10]["port"]


def test_a_dead_job_is_named_by_the_rank_that_died_first() -> None:
    lines: list[str] = []
    with pytest.raises(TrainingFailed) as failed:
        run_streaming(torchrun_command("die-first", 2, module=MODULE), _env(), 180, lines.append)
    echo = last_exception_line(lines)
    assert echo is not None and "FirstFailure" not in echo, lines  # rank 1's echo came last in the output
    assert failed.value.last_error == ("torchrun exited with code 1: rank 0: FirstFailure: "
                                       "rank 0 found its checkpoint folder held by another trainer")
