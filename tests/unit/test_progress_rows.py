"""A stage's progress row stops its spinner and clock when the stage has its result (a row that kept spinning
read as still running, its clock counting the whole run); the evaluate row runs again for the next suite."""

from __future__ import annotations

from rich.console import Console

from codemill.progress_view import RichSink, progress_display


def sink_at(width: int = 80) -> RichSink:
    return RichSink(progress_display(Console(width=width, record=True, force_terminal=False)), "/store")


def row(sink: RichSink, name: str):
    return next(t for t in sink.bar.tasks if t.id == sink.rows[name])


def test_a_finished_stage_stops_its_row():
    sink = sink_at()
    sink.stage("ingest", "reading sources")
    assert not row(sink, "ingest").finished
    sink.finished("ingest", "ran: /store/ingest/corpus-7cbf289ab07b")
    assert row(sink, "ingest").finished
    assert row(sink, "ingest").fields["status"] == "ran: ingest/corpus-7cbf289ab07b"


def test_the_evaluate_row_runs_again_for_the_next_suite():
    sink = sink_at()
    sink.finished("evaluate", "ran: /store/evaluate/bpb-a651416e86a5")
    sink.stage("evaluate", "humaneval: train/model-798498185d76")
    assert not row(sink, "evaluate").finished
    sink.finished("evaluate", "ran: /store/evaluate/humaneval-1d765f066591")
    assert row(sink, "evaluate").finished


def test_a_counted_row_keeps_its_count():
    sink = sink_at()
    sink.update("train", 150, 150)
    sink.finished("train", "ran: /store/train/model-798498185d76")
    sink.stage("train", "exported")
    assert row(sink, "train").finished and row(sink, "train").fields["count"] == "150/150"
