"""The CLI's progress display: one row per stage that fits the terminal, and no other library's bars.

A row is the stage, how far it got (``done/total``), its elapsed time and its latest message, with store paths
shown relative to the store root. The stage, count and time are never cut; the bar is drawn only where the
terminal has room for it beside the message; a message longer than what is left (a long source path) folds
onto a second line rather than being cut.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column

from codemill.layout import relative_to

BAR_WIDTH = 12
BAR_FROM_WIDTH = 100  # narrower terminals get no bar: the count says as much, and the message needs the room
STAGE_CHARS = 10  # the longest stage name a row carries (repo_tasks)

# Progress bars of the libraries codemill calls (transformers' "Loading weights", huggingface_hub's downloads,
# MLflow's artifact uploads, any other tqdm bar) would interleave with the rows above, one per model load. The
# environment carries the switches to the processes the run starts (torchrun ranks, rollout workers); a value
# the user set stays.
QUIET_BARS = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1",
              "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}


def silence_library_bars() -> None:
    """Turn the other libraries' progress bars off in this process and the ones it starts. huggingface_hub and
    transformers read the switch when they are imported, so one already imported is told directly."""
    for key, value in QUIET_BARS.items():
        os.environ.setdefault(key, value)
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


def progress_display(console: Console) -> Progress:
    """A ``Progress`` whose rows fit ``console.width``."""
    columns: list[ProgressColumn] = [
        SpinnerColumn(table_column=Column(no_wrap=True)),
        TextColumn("[bold]{task.description}", table_column=Column(min_width=STAGE_CHARS, no_wrap=True)),
        TextColumn("{task.fields[count]}", justify="right", table_column=Column(no_wrap=True)),
        TimeElapsedColumn(table_column=Column(no_wrap=True)),
    ]
    if console.width >= BAR_FROM_WIDTH:
        columns.insert(2, BarColumn(bar_width=BAR_WIDTH, table_column=Column(width=BAR_WIDTH, no_wrap=True)))
    columns.append(TextColumn("{task.fields[status]}", markup=False, table_column=Column(overflow="fold")))
    return Progress(*columns, console=console, transient=False)


class RichSink:
    """Shows one progress line per stage; updates arrive from the tasks (same process)."""

    def __init__(self, bar: Progress, store_root: str = "") -> None:
        self.bar = bar
        self.store_root = store_root
        self.rows: dict[str, TaskID] = {}

    def _row(self, name: str) -> TaskID:
        if name not in self.rows:
            self.rows[name] = self.bar.add_task(name, total=None, status="", count="")
        return self.rows[name]

    def stage(self, name: str, message: str) -> None:
        words = [relative_to(w, self.store_root) for w in message.split(" ")]
        row = self._row(name)
        task = self._task(row)
        if task.finished and not task.fields.get("count"):  # a row without a count (eval) runs on: next suite
            task.total, task.finished_time = None, None  # update() reads total=None as "unchanged"
        self.bar.update(row, status=" ".join(words))

    def _task(self, row: TaskID) -> Task:
        return next(t for t in self.bar.tasks if t.id == row)

    def update(self, name: str, done: int, total: int) -> None:
        self.bar.update(self._row(name), completed=done, total=total, count=f"{done}/{total}")

    def finished(self, name: str, message: str) -> None:
        """The row's last message; its spinner and clock stop at the time the stage took. A later message for
        the same row (the next eval suite) starts them again."""
        self.stage(name, message)
        row = self._row(name)
        done = max(self._task(row).completed, 1)
        self.bar.update(row, total=done, completed=done)
