"""Serving latency of a checkpoint: time to first token and per-output-token latency at batch size 1.

What an editor feels when it asks for one completion: the prompt is prefilled into the KV cache and the first
token chosen (**time to first token**, TTFT), then each later token costs one decode step over the cache
(**per-output-token latency**). Both are measured per prompt with ``time.perf_counter_ns``, greedy, for a fixed
number of new tokens (generation never stops early, so every prompt measures the same work whatever the model
writes), after untimed warm-up prompts; on CUDA the device is synchronised before each clock read.

The timing sits behind one small protocol, ``LatencyProbe``: an engine is measured by ``measure(prompt_ids,
new_tokens)`` returning the chosen tokens and the clock of every one of them, and states what it is (``info``).
``HFLatencyProbe`` is the transformers implementation: an explicit prefill, then one forward per token with
``past_key_values``. Another engine plugs in behind the same protocol: a vLLM probe would submit one request
with ``SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)`` and stream it
(``RequestOutputKind.DELTA``), stamping each streamed token, or read TTFT from ``RequestOutput.metrics``
(``first_token_time - arrival_time``); ``summarize`` and the rows are then the same.

Statistics (``summarize``): TTFT p50/p95 over the timed prompts; per-token p50/p95 over every decode step of
every timed prompt (each prompt contributes the same number of steps); tokens/s = all timed new tokens / the
wall time of their generations (prefill included). Percentiles are linear interpolation between order
statistics (numpy's default, Hyndman-Fan type 7).

No Prefect, no MLflow.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

NS_PER_MS = 1_000_000


@dataclass(frozen=True)
class TimedGeneration:
    """One timed prompt: the tokens chosen and when. ``ttft_ns``: from handing over the prompt to having the first
    token (prefill + first token); ``step_ns``: each later token's decode step (``len(token_ids) - 1`` of them)."""

    prompt_tokens: int
    token_ids: tuple[int, ...]
    ttft_ns: int
    step_ns: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.step_ns) != max(0, len(self.token_ids) - 1):
            raise ValueError(f"{len(self.token_ids)} tokens need {len(self.token_ids) - 1} decode steps, "
                             f"got {len(self.step_ns)}")

    @property
    def total_ns(self) -> int:
        return self.ttft_ns + sum(self.step_ns)


@runtime_checkable
class LatencyProbe(Protocol):
    """An engine that can be timed: greedy, batch size 1, exactly ``new_tokens`` new tokens (no early stop)."""

    def measure(self, prompt_ids: Sequence[int], new_tokens: int) -> TimedGeneration: ...

    def info(self) -> dict[str, Any]:
        """What was measured: at least ``engine``, ``engine_version``, ``device``, ``dtype``, ``threads``."""
        ...


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


class HFLatencyProbe:
    """A transformers causal LM timed with an explicit prefill + decode loop over its KV cache (greedy argmax)."""

    def __init__(self, model: Any, device: Any) -> None:
        import inspect

        import torch

        self.model, self.device = model, torch.device(device)
        # transformers 5.x may name the KV cache ``cache`` (argument and output); 4.x ``past_key_values``.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def measure(self, prompt_ids: Sequence[int], new_tokens: int) -> TimedGeneration:
        import torch

        if not prompt_ids:
            raise ValueError("an empty prompt has no first token to time")
        if new_tokens < 1:
            raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
        clock = time.perf_counter_ns
        with torch.inference_mode():
            self._sync()
            start = clock()
            ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
            chosen = [int(token.item())]  # .item() waits for the device too
            self._sync()
            ttft = clock() - start
            steps = []
            for _ in range(new_tokens - 1):
                t0 = clock()
                out = self.model(input_ids=token, use_cache=True, **{self._cache_arg: getattr(out, self._cache_arg)})
                token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
                chosen.append(int(token.item()))
                self._sync()
                steps.append(clock() - t0)
        return TimedGeneration(len(prompt_ids), tuple(chosen), ttft, tuple(steps))

    def info(self) -> dict[str, Any]:
        import torch

        param = next(self.model.parameters())
        return {"engine": "transformers", "engine_version": _version("transformers"), "torch": torch.__version__,
                "device": device_name(self.device), "dtype": str(param.dtype).removeprefix("torch."),
                "threads": torch.get_num_threads(), "attention": getattr(self.model.config, "_attn_implementation",
                                                                         None)}


def device_name(device: Any) -> str:
    """``cpu`` or ``cuda:<index> <GPU name>``."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} {torch.cuda.get_device_name(index)}"
    return device.type


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` (None: unchanged) for the block, then restored."""
    import torch

    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def visible_gpu() -> str:
    """``cuda:<id> <GPU name>`` of the first visible GPU, from ``nvidia-smi``: asking torch would create a CUDA
    context in the process that plans the run, holding GPU memory before training starts."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", visible],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return f"cuda:{visible} {out.splitlines()[0]}" if out else f"cuda:{visible}"


def torch_build() -> dict[str, Any]:
    """The constants of the installed torch's ``version.py`` (``__version__``, ``cuda``, ``hip``, ...), read without
    importing torch (seconds of a no-change rerun, which only plans); empty when it cannot be read."""
    import ast
    from importlib.util import find_spec

    spec = find_spec("torch")
    folder = spec.submodule_search_locations if spec is not None else None
    out: dict[str, Any] = {}
    try:
        tree = ast.parse(Path(next(iter(folder or ())), "version.py").read_text(encoding="utf-8"))
    except (OSError, StopIteration, SyntaxError):
        return out
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Constant):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            out |= {t.id: node.value.value for t in targets if isinstance(t, ast.Name)}
    return out


def machine_identity(label: str = "", threads: int | None = None) -> dict[str, Any]:
    """What a latency number is a property of besides the checkpoint, hashed into the latency suite's digest:
    the hardware class (CPU model, CPUs this process may use, the GPU the eval runs on), the threads torch uses
    and the software versions that run the model. Not the host name: two machines of one class measure the same
    thing and share the result; ``label`` keeps hosts apart (or forces a new measurement) when that is wanted.
    ``threads``: the thread count the timing will set (None: the process's own).

    A torch built without CUDA or ROCm sees no GPU, so with ``threads`` given nothing here needs torch imported
    (the same values as ``torch.__version__`` and ``torch.cuda.is_available()``); otherwise it is asked."""
    build = torch_build()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if threads and "__version__" in build and build.get("cuda") is None and build.get("hip") is None:
        version, cuda, cuda_version = build["__version__"], False, None
    else:
        import torch

        version, cuda = torch.__version__, torch.cuda.is_available()
        cuda_version, threads = torch.version.cuda if cuda else None, threads or torch.get_num_threads()
    return {"label": label, "arch": platform.machine(), "cpu": cpu_model(), "cpus": cpus, "threads": threads,
            "device": visible_gpu() if cuda else "cpu", "torch": version, "cuda": cuda_version,
            "transformers": _version("transformers")}


def measure_prompts(probe: LatencyProbe, prompts: Sequence[Sequence[int]], new_tokens: int,
                    warmup: int) -> list[TimedGeneration]:
    """``warmup`` untimed runs (cycling through ``prompts``: allocator, kernels and caches settle), then one timed
    run per prompt, in order."""
    for i in range(warmup):
        probe.measure(prompts[i % len(prompts)], new_tokens)
    return [probe.measure(p, new_tokens) for p in prompts]


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The ``q``-th percentile (0..100), linear between order statistics (numpy's default)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    return float(np.percentile(arr, q))


def summarize(timed: Sequence[TimedGeneration]) -> dict[str, float]:
    """The suite's summary numbers (milliseconds; tokens per second) over the timed prompts."""
    if not timed:
        raise ValueError("nothing was timed")
    ttft = np.array([t.ttft_ns for t in timed], dtype=np.float64) / NS_PER_MS
    steps = np.array([s for t in timed for s in t.step_ns], dtype=np.float64) / NS_PER_MS
    tokens = sum(len(t.token_ids) for t in timed)
    seconds = sum(t.total_ns for t in timed) / 1e9
    out = {"latency_ttft_p50_ms": percentile(ttft, 50), "latency_ttft_p95_ms": percentile(ttft, 95),
           "latency_tokens_per_s": tokens / seconds if seconds > 0 else float("inf")}
    if steps.size:  # one new token per prompt has no decode step
        out |= {"latency_per_token_p50_ms": percentile(steps, 50), "latency_per_token_p95_ms": percentile(steps, 95)}
    return out


def item_row(t: TimedGeneration) -> dict[str, Any]:
    """One prompt's row values (besides ``item_id`` and ``cluster``)."""
    steps = np.array(t.step_ns, dtype=np.float64) / NS_PER_MS
    return {"prompt_tokens": t.prompt_tokens, "new_tokens": len(t.token_ids), "ttft_ms": t.ttft_ns / NS_PER_MS,
            "per_token_p50_ms": percentile(steps, 50) if steps.size else float("nan"),
            "per_token_mean_ms": float(steps.mean()) if steps.size else float("nan"),
            "total_ms": t.total_ns / NS_PER_MS, "output_ids": list(t.token_ids)}
