"""The rollouts table: one row per sample, the episode's tokens exactly as sampled and observed
(``docs/rl.md#rollouts-table``).

``prompt_ids`` is the first observation; ``completion_ids`` every token after it, in order: the policy's sampled
turns (``loss_mask`` 1, with their sampling log-probs) and the environment's observations between them
(``loss_mask`` 0, log-prob 0.0). ``turn_starts`` holds the offset in ``completion_ids`` of each turn's first
sampled token, ``turn_finish_reasons`` how each turn's sampling ended, ``turn_rewards`` each turn's reward
(``reward`` is their sum, or 0 for an episode cut on a limit). A single-turn episode is one sampled turn with
every mask 1: the table of a one-step environment is the single-turn table with ``turns`` 1. ``completion`` is
the text of the last turn (the solution that was graded); ``outcome``, ``partial`` and ``suspicious`` are the
last step's. ``duration_s`` is the episode's sandbox time. ``env_stats`` is a JSON object of the environment's
own numbers of the episode (a repository episode's tool calls by tool, tool errors, why it ended; ``{}`` when an
environment keeps none).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from codemill.layout import LOG_WIDTH, wrap
from codemill.models.engines import FINISH_REASONS
from codemill.rl.env import CUT_REASONS, Episode

ROLLOUTS_FILE = "rollouts.parquet"
EPISODE_FINISH_REASONS = FINISH_REASONS + CUT_REASONS
TRUNCATED_REASONS = ("length", *CUT_REASONS)  # the episode did not end on its own: no loss by default

ROLLOUT_SCHEMA = pa.schema([
    ("problem_id", pa.string()),
    ("group", pa.int32()),
    ("sample", pa.int32()),
    ("prompt", pa.string()),
    ("completion", pa.string()),
    ("prompt_ids", pa.list_(pa.int32())),
    ("completion_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("logprobs", pa.list_(pa.float32())),
    ("turn_starts", pa.list_(pa.int32())),
    ("turns", pa.int32()),
    ("turn_finish_reasons", pa.list_(pa.string())),
    ("finish_reason", pa.string()),
    ("reward", pa.float64()),
    ("turn_rewards", pa.list_(pa.float64())),
    ("partial", pa.float64()),
    ("outcome", pa.string()),
    ("duration_s", pa.float64()),
    ("suspicious", pa.string()),
    ("env_stats", pa.string()),
])


def trajectory_row(ep: Episode) -> dict[str, Any]:
    """A finished episode as a rollouts row."""
    if not ep.done or ep.last_action is None:
        raise ValueError(f"episode {ep.group}/{ep.sample} of {ep.task.problem_id} has not finished")
    info = ep.info
    return {"problem_id": ep.task.problem_id, "group": ep.group, "sample": ep.sample, "prompt": ep.task.prompt,
            "completion": ep.last_action.text, "prompt_ids": ep.prompt_ids, "completion_ids": ep.tokens,
            "loss_mask": ep.loss_mask, "logprobs": ep.logprobs, "turn_starts": ep.turn_starts, "turns": ep.turns,
            "turn_finish_reasons": ep.turn_finish_reasons, "finish_reason": ep.finish_reason, "reward": ep.reward,
            "turn_rewards": ep.turn_rewards,
            "partial": info.partial if info else 0.0, "outcome": info.outcome if info else ep.finish_reason,
            "duration_s": ep.sandbox_s, "suspicious": (info.suspicious if info else None) or "",
            "env_stats": json.dumps(info.stats if info else {}, sort_keys=True)}


class RolloutsSchemaError(ValueError):
    """A rollouts table that is not the contract's; the message lists every problem found."""


def rollouts_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Rows as a table with the exact schema (columns in order, types as the contract names them)."""
    table = pa.Table.from_pylist([{"env_stats": "{}", **r} for r in rows], schema=ROLLOUT_SCHEMA)
    problems = _check(table)
    if problems:
        raise RolloutsSchemaError("rollouts rows: " + "; ".join(problems))
    return table


def write_rollouts(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write ``rollouts.parquet`` (checked first; written to a temporary name and renamed, so a reader never sees
    half a file). ``path`` is the file, or a folder to write ``rollouts.parquet`` into."""
    path = Path(path)
    if path.is_dir():
        path = path / ROLLOUTS_FILE
    table = rollouts_table(rows)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def read_rollouts(path: str | Path) -> pa.Table:
    """A rollouts file, validated: the exact columns and types, sorted (group, sample), one log-prob and one mask
    value per token, turns that start on sampled tokens, known finish reasons. Raises ``RolloutsSchemaError``
    naming everything that is wrong."""
    path = Path(path)
    if path.is_dir():
        path = path / ROLLOUTS_FILE
    table = pq.read_table(path)
    problems = _check(table)
    if problems:
        raise RolloutsSchemaError(f"{path}: " + "; ".join(problems))
    return table


def _turns_fit(starts: list[int], turns: int, rewards: list[float], mask: list[int]) -> bool:
    """``turns`` sampled turns starting at ``starts`` (the first at 0, increasing, each on a sampled token), one
    reward per turn, and every sampled token inside a turn: after a turn's observed tokens come only more
    observed tokens until the next turn starts."""
    if turns < 1 or len(starts) != turns or len(rewards) != turns or starts[0] != 0:
        return False
    if any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
        return False
    if not mask:
        return turns == 1
    if any(s >= len(mask) or mask[s] != 1 for s in starts):
        return False
    ends = [*starts[1:], len(mask)]
    for s, e in zip(starts, ends, strict=True):
        sampled = mask[s:e]
        first_observed = sampled.index(0) if 0 in sampled else len(sampled)
        if any(sampled[first_observed:]):
            return False
    return True


def _check(table: pa.Table) -> list[str]:
    problems = []
    want = {f.name: f.type for f in ROLLOUT_SCHEMA}
    have = {f.name: f.type for f in table.schema}
    missing = [n for n in want if n not in have]
    extra = [n for n in have if n not in want]
    if missing:
        problems.append(f"missing columns {missing}")
    if extra:
        problems.append(f"unexpected columns {extra}")
    problems += [f"column {n!r} is {have[n]}, expected {t}" for n, t in want.items() if n in have and have[n] != t]
    if problems:
        return problems
    if table.schema.names != ROLLOUT_SCHEMA.names:
        problems.append(f"columns out of order: {table.schema.names}")
    nulls = [n for n in want if table.column(n).null_count]
    if nulls:
        problems.append(f"null values in {nulls}")
        return problems
    cols = table.select(["group", "sample", "completion_ids", "loss_mask", "logprobs", "turn_starts", "turns",
                         "turn_finish_reasons", "turn_rewards", "reward", "finish_reason"]).to_pydict()
    keys = list(zip(cols["group"], cols["sample"], strict=True))
    if any(b <= a for a, b in zip(keys, keys[1:], strict=False)):
        problems.append("rows are not sorted by (group, sample) without duplicates")
    bad_len = [i for i, (ids, lps, mask) in enumerate(zip(cols["completion_ids"], cols["logprobs"], cols["loss_mask"],
                                                          strict=True)) if not len(ids) == len(lps) == len(mask)]
    if bad_len:
        problems.append(f"rows {bad_len[:5]} do not have one log-prob and one loss-mask value per completion token")
    bad_mask = [i for i, mask in enumerate(cols["loss_mask"]) if any(m not in (0, 1) for m in mask)]
    if bad_mask:
        problems.append(f"rows {bad_mask[:5]} have loss_mask values other than 0 and 1")
    bad_turns = [i for i, (starts, turns, rewards, mask) in enumerate(zip(
        cols["turn_starts"], cols["turns"], cols["turn_rewards"], cols["loss_mask"], strict=True))
        if not _turns_fit(starts, turns, rewards, mask)]
    if bad_turns:
        problems.append(f"rows {bad_turns[:5]} have turn_starts/turns/turn_rewards that do not describe their "
                        "sampled turns")
    bad_reward = [i for i, (reward, rewards, reason) in enumerate(zip(
        cols["reward"], cols["turn_rewards"], cols["finish_reason"], strict=True))
        if not math.isclose(reward, 0.0 if reason in CUT_REASONS else sum(rewards), rel_tol=1e-9, abs_tol=1e-12)]
    if bad_reward:
        problems.append(f"rows {bad_reward[:5]} have a reward that is not the sum of their turn_rewards (0 for an "
                        "episode cut on a limit)")
    bad_turn_reasons = [i for i, (reasons, turns, reason) in enumerate(zip(
        cols["turn_finish_reasons"], cols["turns"], cols["finish_reason"], strict=True))
        if len(reasons) != turns or any(r not in FINISH_REASONS for r in reasons)
        or (reason not in CUT_REASONS and reasons and reasons[-1] != reason)]
    if bad_turn_reasons:
        problems.append(f"rows {bad_turn_reasons[:5]} do not have one turn_finish_reasons value per turn (each "
                        f"one of {list(FINISH_REASONS)}, the last equal to finish_reason unless the episode was cut)")
    reasons = sorted({r for r in cols["finish_reason"] if r not in EPISODE_FINISH_REASONS}, key=str)
    if reasons:
        problems.append(f"unknown finish_reason values {reasons[:5]} (expected one of "
                        f"{list(EPISODE_FINISH_REASONS)})")
    return problems


def render_row(row: dict[str, Any], decode: Any, width: int = 0, columns: int = LOG_WIDTH) -> str:
    """One rollouts row as text to read: the prompt, then each run of sampled (mask 1) and observed (mask 0)
    tokens under a header with its turn, mask, token count and mean log-prob, and the episode's end. ``decode``
    maps token ids to text (a tokenizer's ``decode``); ``width`` > 0 cuts each block to that many characters
    (its middle). The headers are wrapped at ``columns``; the decoded text is shown as the model wrote it."""

    def cut(text: str) -> str:
        if width <= 0 or len(text) <= width:
            return text
        return f"{text[:width // 2]}\n[... {len(text) - width} characters ...]\n{text[-(width // 2):]}"

    ids, mask, lps = row["completion_ids"], row["loss_mask"], row["logprobs"]
    starts = set(row["turn_starts"])
    lines = [*wrap(f"== {row['problem_id']} group {row['group']} sample {row['sample']}: {row['turns']} turns, "
                   f"{len(row['prompt_ids'])} prompt + {len(ids)} tokens ({sum(mask)} sampled) ==", columns),
             f"-- prompt (mask -, {len(row['prompt_ids'])} tokens) --", cut(decode(list(row["prompt_ids"])))]
    turn, i = 0, 0
    while i < len(ids):
        j = i + 1
        while j < len(ids) and mask[j] == mask[i] and j not in starts:
            j += 1
        if mask[i]:
            turn += 1
            mean = sum(lps[i:j]) / (j - i)
            head = (f"-- turn {turn}: sampled (mask 1, {j - i} tokens, mean log-prob {mean:.3f}, "
                    f"{row['turn_finish_reasons'][turn - 1]}) --")
        else:
            head = f"-- observed (mask 0, {j - i} tokens) --"
        lines += [*wrap(head, columns), cut(decode(list(ids[i:j])))]
        i = j
    stats = json.loads(row.get("env_stats") or "{}")
    flagged = f", suspicious: {row['suspicious']}" if row["suspicious"] else ""
    numbers = f", {json.dumps(stats, sort_keys=True)}" if stats else ""
    lines += wrap(f"== end: {row['finish_reason']}, outcome {row['outcome']}, reward {row['reward']:g} "
                  f"(turn rewards {row['turn_rewards']}){flagged}{numbers} ==", columns)
    return "\n".join(lines)
