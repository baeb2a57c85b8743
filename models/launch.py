"""Launching the trainer under torchrun as a subprocess: own timeout, process-group kill, streamed output, and
a lifeline so that the ranks die with the launching process (``models/lifeline.py``)."""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from codemill.cpus import usable_cpus
from codemill.models import lifeline, rank_errors


class TrainingFailed(RuntimeError):
    """torchrun failed or timed out; the message carries its last output, ``last_error`` the one line a report
    shows: the first cause (``first_cause``, the earliest error a rank recorded, see ``rank_errors``) when there is
    one, else the last exception line of the output."""

    def __init__(self, message: str, tail: Sequence[str] = (), first_cause: str | None = None) -> None:
        super().__init__(message)
        head = (message.splitlines()[0] if message else "torchrun failed").removesuffix(" Last output:")
        error = first_cause or last_exception_line(tail)
        self.last_error = f"{head.rstrip('.;')}: {error}" if error else head


# "ValueError: ...", "torch.OutOfMemoryError: ...", optionally behind torchrun's "[rank0]: " prefix; torchrun's
# own ChildFailedError summary names no cause, so it is passed over.
_EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?)$")


def last_exception_line(lines: Sequence[str]) -> str | None:
    """The last line of the output that names an exception (the error a rank died of), or None."""
    for line in reversed(lines):
        match = _EXCEPTION_LINE.match(line.strip())
        if match and "ChildFailedError" not in match.group(1):
            return match.group(1)
    return None


def torchrun_command(spec_path: str, nproc_per_node: int, *, nnodes: str = "1", max_restarts: int = 0,
                     rdzv_endpoint: str | None = None, rdzv_id: str = "codemill",
                     extra_args: Sequence[str] = (), module: str = "codemill.models.trainer") -> list[str]:
    """Single node: ``--standalone``. Multi-node: the same command on every node with a shared c10d
    rendezvous endpoint (``host:29400``) and job id; torchrun restarts all workers on a failure, and the
    trainer resumes from the last committed checkpoint. ``module`` is the entrypoint (the trainer, or
    ``codemill.rl.update`` for a GRPO update)."""
    rdzv = (["--standalone"] if rdzv_endpoint is None else
            ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}"])
    return [sys.executable, "-m", "torch.distributed.run", *rdzv, f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc_per_node}", f"--max-restarts={max_restarts}", *extra_args,
            "-m", module, spec_path]


def threads_per_rank(nproc_per_node: int) -> int:
    return max(1, usable_cpus() // nproc_per_node)


class LaunchedJob:
    """A job started in its own session with a lifeline as stdin (its ranks die when this process does, even by
    SIGKILL, which no ``finally`` here would survive); a reader thread hands each output line to ``on_line``,
    which the caller may swap between the requests of a long-lived job, and keeps the last lines."""

    def __init__(self, cmd: list[str], env: dict[str, str], on_line: Callable[[str], None],
                 tail_lines: int = 60) -> None:
        self.errors = Path(tempfile.mkdtemp(prefix="codemill-rank-errors-"))  # each rank's error (rank_errors)
        line_r, self._lifeline = os.pipe()  # both ends close-on-exec here; Popen makes the read end the child's fd 0
        try:
            self.proc = subprocess.Popen(cmd, env={**env, **lifeline.launcher_env(), rank_errors.ENV: str(self.errors)},
                                         stdin=line_r,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                         start_new_session=True)
        except BaseException:
            os.close(self._lifeline)
            shutil.rmtree(self.errors, ignore_errors=True)
            raise
        finally:
            os.close(line_r)
        self.on_line = on_line
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.output_done = threading.Event()
        self._reader = threading.Thread(target=self._read, name="codemill-job-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                line = line.rstrip("\n")
                self.tail.append(line)
                self.on_line(line)
        finally:
            self.output_done.set()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, until: Callable[[], bool] | None = None, timeout_s: float | None = None) -> int | None:
        """Until the job exits (its return code) or ``until()`` holds (None); TimeoutError past ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if until is not None and until():
                return None
            if self.output_done.wait(0.05):
                self._reader.join()
                return self.proc.wait()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Kill the job's process group (if it still runs) and cut its lifeline."""
        try:
            if self.proc.poll() is None:
                kill_group(self.proc, sig)
            else:
                self.proc.wait()
        finally:
            self.close_lifeline()

    def failure(self, head: str) -> TrainingFailed:
        """The error of a job that died: ``head``, its last output and the first cause its ranks recorded (read
        before ``close_lifeline``, which removes the records)."""
        return TrainingFailed(f"{head}. Last output:\n" + "\n".join(self.tail), self.tail,
                              rank_errors.first_cause(self.errors))

    def close_lifeline(self) -> None:
        if self._lifeline >= 0:
            os.close(self._lifeline)  # any rank still alive dies at the lifeline's end
            self._lifeline = -1
        shutil.rmtree(self.errors, ignore_errors=True)  # the job is over: no rank records an error any more


def run_streaming(cmd: list[str], env: dict[str, str], timeout_s: float,
                  on_line: Callable[[str], None], tail_lines: int = 60) -> None:
    """Run cmd in its own session (a ``LaunchedJob``), calling on_line for each output line; kill the whole
    group on timeout. A non-zero exit raises TrainingFailed carrying the last lines of output (the trainer's
    last error)."""
    job = LaunchedJob(cmd, env, on_line, tail_lines)
    try:
        rc = job.wait(timeout_s=timeout_s)
    except TimeoutError:
        job.stop()
        raise TrainingFailed(f"training timed out after {timeout_s:.0f}s; killed. Last output:\n"
                             + "\n".join(job.tail), job.tail) from None
    except BaseException:
        job.stop()
        raise
    try:
        if rc != 0:
            raise job.failure(f"torchrun exited with code {rc}")
    finally:
        job.close_lifeline()  # the job is over either way


def kill_group(proc: subprocess.Popen, sig: signal.Signals = signal.SIGTERM, grace_s: float = 10) -> None:
    """Send ``sig`` to the process group, SIGKILL it after ``grace_s`` if it has not exited; reaps it."""
    try:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    except ProcessLookupError:
        pass
