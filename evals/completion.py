"""Line-level code completion on held-out files (CodeXGLUE style): given the file prefix, predict the line.

One item per file: a deterministic (seeded hash of the path) choice among its non-trivial lines after the
first. Exact match is whitespace-token equality; edit similarity is the Levenshtein ratio (rapidfuzz).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from rapidfuzz.distance import Levenshtein

COMPLETION_CODE_VERSION = "completion-v1"
MIN_LINE_CHARS = 4


@dataclass(frozen=True)
class CompletionItem:
    item_id: str
    cluster: str
    prefix: str
    target: str


def pick_line(path: str, lines: list[str], seed: int) -> int | None:
    candidates = [i for i in range(1, len(lines)) if len(lines[i].strip()) >= MIN_LINE_CHARS]
    if not candidates:
        return None
    h = int.from_bytes(hashlib.sha256(f"{seed}\0{path}".encode()).digest()[:8], "big")
    return candidates[h % len(candidates)]


def make_items(files: list[tuple[str, str, str]], seed: int) -> list[CompletionItem]:
    """files: (item_id, cluster, content). The prefix keeps the target line's indentation as context."""
    items = []
    for item_id, cluster, content in files:
        lines = content.split("\n")
        i = pick_line(item_id, lines, seed)
        if i is None:
            continue
        target = lines[i]
        indent = target[: len(target) - len(target.lstrip())]
        items.append(CompletionItem(item_id, cluster, "\n".join(lines[:i]) + "\n" + indent, target.strip()))
    return items


def exact_match(prediction: str, target: str) -> float:
    return float(prediction.split() == target.split())


def edit_similarity(prediction: str, target: str) -> float:
    return float(Levenshtein.normalized_similarity(prediction.strip(), target.strip()))
