"""Fill-in-the-middle (Bavarian et al. 2022; StarCoder): train on (prefix, suffix) -> middle.

A document is cut at two uniform character positions. PSM order: <fim_prefix> P <fim_suffix> S <fim_middle> M.
SPM order (the StarCoder variant): <fim_prefix> <fim_suffix> S <fim_middle> P M. Each part is encoded
separately, so no token spans a cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FimIds:
    prefix: int
    middle: int
    suffix: int


def doc_rng(seed: int, sha256_hex: str) -> np.random.Generator:
    """Per-document randomness from its content hash: the same choice in any order, on any machine."""
    return np.random.default_rng([seed, int(sha256_hex[:16], 16)])


def plan(text: str, rng: np.random.Generator, fim_rate: float, spm_rate: float) -> tuple[str, tuple[str, ...]]:
    """('plain', (text,)) or ('psm'|'spm', (prefix, middle, suffix))."""
    if fim_rate <= 0 or rng.random() >= fim_rate:
        return "plain", (text,)
    a, b = sorted(rng.integers(0, len(text) + 1, size=2).tolist())
    mode = "spm" if rng.random() < spm_rate else "psm"
    return mode, (text[:a], text[a:b], text[b:])


def pieces(mode: str, parts: list[list[int]], ids: FimIds) -> list[list[int]]:
    """The document's id runs in training order (sentinels as one-id runs): ``assemble`` is their concatenation.
    The stage chains every document's runs into one array without building each document's list first."""
    if mode == "plain":
        return [parts[0]]
    prefix, middle, suffix = parts
    if mode == "psm":
        return [[ids.prefix], prefix, [ids.suffix], suffix, [ids.middle], middle]
    return [[ids.prefix, ids.suffix], suffix, [ids.middle], prefix, middle]


def assemble(mode: str, parts: list[list[int]], ids: FimIds) -> list[int]:
    return [i for run in pieces(mode, parts, ids) for i in run]
