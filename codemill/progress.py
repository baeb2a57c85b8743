"""A process-wide progress sink: the CLI installs a rich display; elsewhere progress is silent."""

from __future__ import annotations

from typing import Protocol


class ProgressSink(Protocol):
    def stage(self, name: str, message: str) -> None: ...
    def update(self, name: str, done: int, total: int) -> None: ...
    def finished(self, name: str, message: str) -> None: ...


class _Silent:
    def stage(self, name: str, message: str) -> None:
        pass

    def update(self, name: str, done: int, total: int) -> None:
        pass

    def finished(self, name: str, message: str) -> None:
        pass


_sink: ProgressSink = _Silent()


def set_sink(sink: ProgressSink | None) -> None:
    global _sink
    _sink = sink or _Silent()


def sink() -> ProgressSink:
    return _sink
