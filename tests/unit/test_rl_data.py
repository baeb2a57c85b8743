"""What each RL iteration trains on: the problem schedule, rejection sampling's documents, fine-tune shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from codemill.data.pack import open_token_shards
from codemill.rl.data import (
    finetune_steps,
    iteration_problems,
    passing_documents,
    seeded_share,
    solution_documents,
    write_sft_tokens,
)

IDS = [f"p{i:02d}" for i in range(10)]


def test_every_problem_once_per_epoch_and_nothing_depends_on_history() -> None:
    per = 4  # 10 problems: slices of 4, 4, 2 per epoch
    epoch0 = [iteration_problems(IDS, per, seed=7, iteration=i) for i in range(3)]
    assert [len(s) for s in epoch0] == [4, 4, 2]
    flat = [p for s in epoch0 for p in s]
    assert sorted(flat) == IDS  # no problem skipped, none repeated
    epoch1 = [p for i in range(3, 6) for p in iteration_problems(IDS, per, seed=7, iteration=i)]
    assert sorted(epoch1) == IDS and epoch1 != flat  # a fresh shuffle each epoch
    # A resumed run asks for iteration 4 alone and gets what the uninterrupted run drew there.
    assert iteration_problems(list(reversed(IDS)), per, seed=7, iteration=4) == epoch1[4:8]
    assert iteration_problems(IDS, per, seed=8, iteration=0) != epoch0[0]


def test_more_per_iteration_than_problems_takes_each_once() -> None:
    assert sorted(iteration_problems(IDS[:3], 10, seed=0, iteration=5)) == IDS[:3]
    with pytest.raises(ValueError, match="train split is empty"):
        iteration_problems([], 4, seed=0, iteration=0)


def _row(pid: str, completion: list[int], outcome: str, mask: list[int] | None = None) -> dict:
    return {"problem_id": pid, "prompt_ids": [1, 2], "completion_ids": completion, "outcome": outcome,
            "loss_mask": [1] * len(completion) if mask is None else mask}


def test_passing_documents_refuse_episodes_with_environment_tokens() -> None:
    """A multi-turn episode's feedback tokens would be trained on as if the policy wrote them."""
    with pytest.raises(ValueError, match="environment tokens"):
        passing_documents([_row("a", [5, 6, 7], "passed", mask=[1, 0, 1])], {0})


def test_passing_documents_are_the_sampled_ids_of_distinct_passing_completions() -> None:
    rows = [_row("a", [5, 6, 0], "passed"), _row("a", [5, 6, 0], "passed"), _row("a", [7, 0], "failed"),
            _row("b", [5, 6, 0], "passed"), _row("b", [8, 9], "timed_out")]
    assert passing_documents(rows, eos_ids={0}) == [[1, 2, 5, 6], [1, 2, 5, 6]]


class _Tok:
    """Enough of a tokenizer: one id per character (EOS 0), so boundaries are visible."""

    eos_token_id = 0
    pad_token_id = 1

    def __len__(self) -> int:
        return 300

    def __call__(self, texts: list[str], add_special_tokens: bool = False) -> dict:
        return {"input_ids": [[ord(c) for c in t] for t in texts]}


def test_solution_documents_encode_prompt_and_solution_apart() -> None:
    assert solution_documents([("ab", "cd")], _Tok()) == [[97, 98, 99, 100]]


def test_fine_tune_shards_hold_every_document_and_pad_the_last_row(tmp_path: Path) -> None:
    docs = [[10, 11, 12], [20, 21], [30]]
    info = write_sft_tokens(docs, _Tok(), seq_len=4, out_dir=tmp_path, seed=0)
    tokens = np.concatenate(open_token_shards(tmp_path / "train"))
    positions = np.concatenate(open_token_shards(tmp_path / "train", "positions"))
    assert info["rows"] == tokens.shape[0] == 3 and info["tokens"] == 9  # 6 ids + 3 EOS, padded to 12
    stream = tokens.reshape(-1).tolist()
    for doc in docs:  # each document followed by EOS somewhere in the stream
        i = next(i for i in range(len(stream)) if stream[i:i + len(doc) + 1] == [*doc, 0])
        assert positions.reshape(-1)[i] == 0 or stream[i - 1] == 0
    assert stream[9:] == [0, 0, 0] and positions.reshape(-1)[9:].tolist() == [0, 0, 0]  # filler: own documents
    with pytest.raises(ValueError, match="no documents"):
        write_sft_tokens([], _Tok(), seq_len=4, out_dir=tmp_path / "empty", seed=0)


def test_fine_tune_steps_follow_the_data_when_epochs_are_set() -> None:
    assert finetune_steps(50, None, rows=3, rows_per_step=16) == 50
    assert finetune_steps(50, 2.0, rows=40, rows_per_step=16) == 5  # ceil(80 / 16)
    assert finetune_steps(50, 2.0, rows=1, rows_per_step=16) == 1
    assert finetune_steps(4, 2.0, rows=400, rows_per_step=16) == 4  # capped


def test_seeded_share_is_a_stable_subset() -> None:
    half = seeded_share(IDS, 0.5, seed=3)
    assert len(half) == 5 and set(half) <= set(IDS)
    assert seeded_share(list(reversed(IDS)), 0.5, seed=3) == half  # the order given does not matter
    assert seeded_share(IDS, 0.5, seed=4) != half
    assert seeded_share(IDS, 1.0, seed=3) == IDS and len(seeded_share(IDS, 0.01, seed=3)) == 1
