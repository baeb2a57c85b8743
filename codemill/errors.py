"""Errors a user can cause or fix, and how the command line shows them.

An exception that subclasses :class:`UserFacingError` (or is listed by :func:`known_error`) is a known failure:
the command line prints ``error: <what>`` and, where there is a fix, ``hint: <fix>``, with no traceback
(``--debug`` or ``CODEMILL_DEBUG=1`` shows it). Anything else is a bug and keeps its traceback. No third-party
import here: every layer may raise these.
"""

from __future__ import annotations


class UserFacingError(Exception):
    """A failure with a one-line cause and, optionally, a one-line fix."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def one_line(text: str, limit: int = 400) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters: an error line is one line."""
    first = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return first if len(first) <= limit else first[: limit - 3] + "..."


def describe(exc: BaseException) -> tuple[str, str | None] | None:
    """``(what, hint)`` for a known failure, None for one that deserves its traceback.

    Known: :class:`UserFacingError` and the library errors whose text already names what and where (config,
    sources, problem files, lineage, a trainer that died with its last error, an incomplete artifact)."""
    if isinstance(exc, UserFacingError):
        return one_line(str(exc)), exc.hint
    for kind, hint in _known_kinds():
        if isinstance(exc, kind):
            return one_line(str(exc) or type(exc).__name__), hint
    return None


def _known_kinds() -> list[tuple[type[BaseException], str | None]]:
    """Imported lazily: these modules are cheap, but this module must import nothing at load time."""
    from codemill.config import ConfigError
    from codemill.data.folder_source import SourceNotFoundError
    from codemill.data.sources import SourceError
    from codemill.evals.problem_sets import ProblemFileError
    from codemill.lineage_read import LineageError
    from codemill.models.checkpoint import CheckpointDirBusy
    from codemill.models.launch import TrainingFailed
    from codemill.store import IncompleteArtifactError

    return [
        (ConfigError, None),
        (SourceNotFoundError, "check the source path in the config or --source"),
        (SourceError, None),
        (ProblemFileError, "fix or remove the named line; nothing was committed"),
        (LineageError, None),
        (TrainingFailed, "the trainer's log above has the full output; rerun resumes from the last checkpoint"),
        (CheckpointDirBusy, "another trainer holds this checkpoint folder; wait for it or stop it"),
        (IncompleteArtifactError, "the artifact was never committed; rerun to rebuild it"),
    ]
