"""What each RL iteration trains on: which problems it samples, and the texts of a supervised fine-tune.

Pure functions of their arguments, so an iteration's inputs are known before it runs and a resumed flow draws
exactly the problems the killed one would have (no problem skipped or repeated: users of OpenRLHF and NeMo-RL
report resumes that silently skipped prompts, on the GitHub trackers of OpenRLHF/OpenRLHF and NVIDIA-NeMo/RL).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from codemill.data.pack import Packer, TokenShardWriter, positions_from_starts, token_dtype


def iteration_problems(problem_ids: Sequence[str], per_iteration: int, seed: int, iteration: int) -> list[str]:
    """The problems iteration ``iteration`` samples: epochs of seeded shuffles cut into consecutive slices.

    Every problem appears once per epoch (the last slice of an epoch may be shorter), and the answer depends
    only on (ids, per_iteration, seed, iteration), never on what ran before.
    """
    ids = sorted(set(problem_ids))
    if not ids:
        raise ValueError("no train problems to sample: the problem set's train split is empty")
    per = min(per_iteration, len(ids))
    slices = math.ceil(len(ids) / per)
    epoch, part = divmod(iteration, slices)
    order = list(ids)
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order[part * per:(part + 1) * per]


def seeded_share(ids: Sequence[str], share: float, seed: int) -> list[str]:
    """``share`` of ``ids`` (rounded, at least one), chosen by a seeded hash: the same ids for the same inputs,
    whatever order they come in."""
    ranked = sorted(set(ids), key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
    return sorted(ranked[:max(1, round(share * len(ranked)))])


def finetune_steps(max_steps: int, epochs: float | None, rows: int, rows_per_step: int) -> int:
    """``max_steps``, or ``epochs`` passes over ``rows`` packed rows (rounded up, at least 1, at most max_steps)."""
    if epochs is None:
        return max_steps
    return max(1, min(max_steps, math.ceil(epochs * rows / rows_per_step)))


def passing_documents(rows: Iterable[dict], eos_ids: set[int]) -> list[list[int]]:
    """Rejection sampling's training documents: prompt ids + completion ids of every passing sample, exactly as
    sampled (re-encoding the text could merge tokens across the prompt boundary into ids the policy never
    produces), without a trailing EOS (packing adds one). One per distinct completion of a problem: duplicates
    would weigh the easiest problems most."""
    seen: set[tuple[str, tuple[int, ...]]] = set()
    out = []
    for r in rows:
        if not all(r["loss_mask"]):
            raise ValueError(f"rollouts of {r['problem_id']} hold environment tokens (a multi-turn episode): "
                             "rejection sampling trains on whole documents, without a loss mask; use grpo")
        completion = list(r["completion_ids"])
        while completion and completion[-1] in eos_ids:
            completion.pop()
        key = (r["problem_id"], tuple(completion))
        if r["outcome"] == "passed" and key not in seen:
            seen.add(key)
            out.append(list(r["prompt_ids"]) + completion)
    return out


def solution_documents(pairs: Iterable[tuple[str, str]], tokenizer) -> list[list[int]]:
    """(prompt, solution) pairs as documents whose two parts are encoded apart, the way a rollout sees them:
    the prompt as the engine encodes it, then the solution's own tokens."""
    pairs = list(pairs)
    prompts = tokenizer([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
    solutions = tokenizer([s for _, s in pairs], add_special_tokens=False)["input_ids"]
    return [list(p) + list(s) for p, s in zip(prompts, solutions, strict=True)]


def write_sft_tokens(docs: Sequence[Sequence[int]], tokenizer, seq_len: int, out_dir: Path, seed: int) -> dict:
    """Pack token documents (each ended by EOS, in a seeded order) into the trainer's token shards under
    ``out_dir/train``. The last partial row is filled with EOS tokens (each its own one-token document, so
    no real document sees them) rather than dropped: a small fine-tune set may not fill one row."""
    if not docs:
        raise ValueError("no documents to fine-tune on")
    eos = tokenizer.eos_token_id
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    vocab = len(tokenizer)
    writer = TokenShardWriter(out_dir / "train", seq_len, token_dtype(vocab), rows_per_shard=4096)
    packer = Packer(eos, seq_len)
    tokens = 0
    for i in order:
        tokens += len(docs[i]) + 1
        for row, pos in packer.add(list(docs[i])):
            writer.add(row, pos)
    if packer.leftover:
        filler = seq_len - packer.leftover
        row = np.concatenate([np.asarray(packer.buf, dtype=np.int64), np.full(filler, eos, dtype=np.int64)])
        starts = np.concatenate([np.asarray(packer.starts, dtype=bool), np.ones(filler, dtype=bool)])
        writer.add(row, positions_from_starts(starts[None])[0])
    writer.flush()
    return {"documents": len(docs), "tokens": tokens, "rows": sum(s["rows"] for s in writer.shards),
            "seq_len": seq_len, "vocab_size": vocab, "eos_id": eos,
            "pad_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos}
