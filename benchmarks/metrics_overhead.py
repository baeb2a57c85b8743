"""Metrics overhead: ingest throughput and RL rollout throughput with metrics off (every metric a no-op) against
metrics on (a flow-run session pushing to a real Pushgateway every second), in one run.

Repeats are interleaved, and the order of off and on alternates from repeat to repeat, so load drift on a shared
machine hits both alike. The benchmark prints the median of ``--repeats`` for each side, the spread (min to max)
and the ratio on/off. The goal is a ratio within noise, with the overhead at most 1%.

* ingest: ``run_ingest`` over a few standard-library packages with no chunk cache (every chunk processed), plus
  the stage's metric updates (``count_ingest``); MB/s of the bytes read.
* rollouts: ``collect_rollouts`` (a fresh tiny policy, synthetic problems, the judge pool), where metrics are
  counted per batch and per sample; samples/s.
* the per-sample metric updates alone (what the judge pool and the rollouts record for one sample), timed in a
  loop with metrics off and on: the bound on the overhead that machine noise cannot blur, set against the
  measured time per sample.

The Pushgateway is Debian's ``prometheus-pushgateway``, on a free port.

    python -m benchmarks.metrics_overhead [--repeats 5] [--problems 8] [--k 4] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import platform
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from importlib.metadata import version
from pathlib import Path

import torch

from benchmarks.rl_rollout import bwrap_version, tiny_policy
from codemill import metrics
from codemill.cpus import usable_cpus
from codemill.data.config import IngestConfig
from codemill.data.ingest import run_ingest
from codemill.data.sources import FolderSource, stdlib_root
from codemill.evals.humaneval import STOP_SEQUENCES
from codemill.metrics.push import flow_metrics
from codemill.models.engines import HFEngine, RolloutParams
from codemill.problems.synthetic import synthetic_problems
from codemill.rl.envs import env_for
from codemill.rl.rollout import collect_rollouts
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import Judged, JudgePool, count_verdict
from codemill.sandbox.runner import Outcome
from codemill.tasks.ingest import count_ingest

PACKAGES = ["email", "json", "http", "logging", "importlib", "concurrent", "xmlrpc", "urllib"]


@contextmanager
def pushgateway() -> Iterator[str]:
    """A real Pushgateway on a free port, its groups in memory only (Debian's default persists them): host:port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    proc = subprocess.Popen(["prometheus-pushgateway", f"--web.listen-address={address}", "--persistence.file="],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://{address}/-/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def pushgateway_version() -> str:
    done = subprocess.run(["prometheus-pushgateway", "--version"], capture_output=True, text=True)
    return (done.stdout + done.stderr).splitlines()[0]


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent)
    return done.stdout.strip() or "unknown"


def per_sample_updates_us(loops: int = 200_000) -> float:
    """Microseconds of the metric updates one judged sample makes (verdict, latency, suspicious kind, episode,
    samples in flight), with whatever metrics are live now."""
    judged = Judged(Outcome.FAILED, False, 0.0, "candidate_gone", "", 0.01, {})
    t0 = time.perf_counter()
    for _ in range(loops):
        m = metrics.get()
        count_verdict(m, judged)
        m.rollout_episodes.labels("failed").inc()
        m.rollout_samples_in_flight.dec(1)
    return (time.perf_counter() - t0) / loops * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2, help="judge pool slots")
    args = ap.parse_args()
    torch.set_num_threads(1)  # a shared machine: no OpenMP spinning against the judge pool

    tmp = tempfile.TemporaryDirectory()
    root = Path(tmp.name)
    ingest_cfg = IngestConfig(sources=[FolderSource(path=stdlib_root(), include=[f"{p}/**/*.py" for p in PACKAGES],
                                                    exclude=[], skip_dirs=["__pycache__"])])
    engine = HFEngine(tiny_policy(root / "policy"), rows_per_forward=args.problems * args.k)
    problems = synthetic_problems(1, args.problems)
    params = RolloutParams(temperature=1.0, max_new_tokens=args.max_new_tokens, stop=STOP_SEQUENCES)
    results: dict[str, dict[str, list[float]]] = {"ingest MB/s": {}, "rollout samples/s": {}}

    with pushgateway() as gateway, JudgePool(Limits(wall_s=3.0, cpu_s=3), workers=args.workers) as pool:

        def ingest(tag: str) -> float:
            t0 = time.perf_counter()
            stats = run_ingest(ingest_cfg, root / f"ingest-{tag}")
            count_ingest(stats)
            return stats["bytes_seen"] / 1e6 / (time.perf_counter() - t0)

        def rollouts(tag: str) -> float:
            env = env_for(None, engine, pool, params.max_new_tokens)
            _, timings = collect_rollouts(engine, env, problems, args.k, params, seed=7, batch_problems=4)
            return timings.samples_per_s

        work: dict[str, Callable[[str], float]] = {"ingest MB/s": ingest, "rollout samples/s": rollouts}
        rollouts("warm-up")  # every judge slot's servers started, the model's first forwards done
        ingest("warm-up")  # the corpus in the page cache
        for rep in range(args.repeats):
            for side in (("off", "on") if rep % 2 == 0 else ("on", "off")):
                session = flow_metrics(gateway, "benchmark", f"rep{rep}-{side}", interval_s=1.0) \
                    if side == "on" else nullcontext()
                with session:
                    for name, fn in work.items():
                        results[name].setdefault(side, []).append(fn(f"{rep}-{side}"))
    tmp.cleanup()
    updates = {"off": per_sample_updates_us()}
    metrics.enable(fresh=True)
    updates["on"] = per_sample_updates_us()
    metrics.disable()
    per_sample_us = 1e6 / statistics.median(results["rollout samples/s"]["off"])

    print(f"codemill metrics overhead, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit()}")
    print(f"machine: {platform.machine()}, {usable_cpus()} usable CPUs, {platform.platform()}")
    print(f"python {platform.python_version()}, torch {torch.__version__}, prometheus-client "
          f"{version('prometheus-client')}, {pushgateway_version()}, bwrap {bwrap_version()}")
    print(f"{args.repeats} repeats interleaved; ingest of {len(PACKAGES)} stdlib packages; rollouts "
          f"{args.problems} problems x {args.k}, {args.max_new_tokens} new tokens, {args.workers} judge slots")
    for name, sides in results.items():
        off, on = statistics.median(sides["off"]), statistics.median(sides["on"])
        spread = {s: f"{min(v):.2f}-{max(v):.2f}" for s, v in sides.items()}
        print(f"{name:<18} off {off:8.2f} ({spread['off']})  on {on:8.2f} ({spread['on']})  on/off {on / off:.3f}")
    print(f"per-sample metric updates: off {updates['off']:.2f} us, on {updates['on']:.2f} us; a rollout sample takes "
          f"{per_sample_us:.0f} us here, so metrics on add {(updates['on'] - updates['off']) / per_sample_us:.3%}")


if __name__ == "__main__":
    main()
