"""Mine doctest problems from the standard library source and this interpreter's site-packages, then verify
every kept reference solution in the real sandbox (JudgePool).

Prints the counts per mining step for each source, how many references pass verification (and why the others
fail), the time each part took, and five sample problems.

    python -m benchmarks.mine_doctests [--workers N] [--site-packages DIR] [--no-verify] [--show-failures N]
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import site
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

from codemill.problems.mining import mine_doctest_problems
from codemill.problems.problem import ExecProblem


def stdlib_files() -> Iterator[tuple[str, str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "dist-packages" in path.parts:
            continue
        yield "stdlib", str(path.relative_to(root)), _read(path)


def site_packages_files(root: Path) -> Iterator[tuple[str, str, str]]:
    """Each top-level package (or single-module distribution) of site-packages is one repo (split unit)."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        yield f"site-packages/{rel.parts[0].removesuffix('.py')}", str(rel), _read(path)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def default_site_packages() -> Path:
    for p in site.getsitepackages():
        if Path(p).is_dir():
            return Path(p)
    raise SystemExit("no site-packages folder")


def print_counts(name: str, counts: dict[str, int], seconds: float) -> None:
    print(f"\n== {name}: mined in {seconds:.1f}s")
    for step, n in counts.items():
        print(f"  {step:28s} {n:8d}")


def verify(problems: list[ExecProblem], workers: int) -> tuple[list[bool], collections.Counter, float]:
    from codemill.sandbox import Limits
    from codemill.sandbox.judge_pool import JudgePool

    t0 = time.perf_counter()
    with JudgePool(Limits(wall_s=5, cpu_s=5), workers=workers) as pool:
        judged = pool.judge_all([p.request(p.reference_solution or "") for p in problems])
    reasons: collections.Counter = collections.Counter()
    for j in judged:
        if not j.passed:
            reasons[j.kind + ": " + _reason(j.error)] += 1
    return [j.passed for j in judged], reasons, time.perf_counter() - t0


def _reason(error: str) -> str:
    """A short failure category from the judge's error text."""
    categories = [("result is not plain data", "result not plain data"),
                  ("argument that is not plain data", "an argument not plain data"),
                  ("Got nothing", "printed output only"), ("Expected:", "output differs"),
                  ("Exception raised", "unexpected exception"), ("ImportError", "import error"),
                  ("wall-clock", "timed out")]
    for key, label in categories:
        if key in error:
            return label
    return error[:60]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=max(2, (os.cpu_count() or 2) // 2))
    ap.add_argument("--site-packages", type=Path, default=None)
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--show-failures", type=int, default=0, help="print this many failing problems")
    args = ap.parse_args()

    t0 = time.perf_counter()
    std, std_counts = mine_doctest_problems(stdlib_files())
    t_std = time.perf_counter() - t0
    print_counts("stdlib " + sysconfig.get_paths()["stdlib"], std_counts, t_std)
    sp_root = args.site_packages or default_site_packages()
    t0 = time.perf_counter()
    sp, sp_counts = mine_doctest_problems(site_packages_files(sp_root))
    t_sp = time.perf_counter() - t0
    print_counts(f"site-packages {sp_root}", sp_counts, t_sp)
    # one batch for verification, deduplicated across the two sources by content
    seen: set[str] = set()
    problems = []
    for p in std + sp:
        key = p.problem_id.rsplit("#", 1)[1]
        if key not in seen:
            seen.add(key)
            problems.append(p)
    print(f"\ncandidates to verify: {len(problems)} (stdlib {len(std)}, site-packages {len(sp)}, "
          f"{len(std) + len(sp) - len(problems)} identical across the two)")
    passed = [True] * len(problems)
    if not args.no_verify:
        passed, reasons, t_verify = verify(problems, args.workers)
        n_std = sum(ok for p, ok in zip(problems, passed, strict=True) if p.split_unit == "stdlib")
        print(f"verified: {sum(passed)}/{len(problems)} pass ({n_std} stdlib, {sum(passed) - n_std} site-packages) "
              f"in {t_verify:.1f}s with {args.workers} workers")
        print("failures by reason:")
        for reason, n in reasons.most_common(15):
            print(f"  {n:6d}  {reason}")
        failing = [p for p, ok in zip(problems, passed, strict=True) if not ok]
        for p in random.Random(1).sample(failing, min(args.show_failures, len(failing))):
            print(f"\n---- FAILING {p.problem_id}\n{p.prompt}{p.reference_solution}")
    good = [p for p, ok in zip(problems, passed, strict=True) if ok]
    for p in random.Random(0).sample(good, min(args.samples, len(good))):
        tests = p.tests[p.tests.index("_ENTRY = "):] if "_ENTRY = " in p.tests else p.tests
        print(f"\n---- {p.problem_id} ({len(p.test_cases)} test cases)\n{p.prompt}--- tests (after the shared "
              f"doctest runner):\n{tests}")


if __name__ == "__main__":
    main()
