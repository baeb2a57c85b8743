"""Errors a user can cause or fix, and how the command line shows them.

An exception that subclasses :class:`UserFacingError` (or is one of the kinds in ``KNOWN``) is a known failure:
the command line prints ``error: <what>`` and, where there is a fix, ``hint: <fix>``, with no traceback
(``--debug`` or ``CODEMILL_DEBUG=1`` shows it). Anything else is a bug and keeps its traceback. No third-party
import here: every layer may raise these.
"""

from __future__ import annotations

import sys


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
    for module, name, hint in KNOWN:
        kind = getattr(sys.modules.get(module), name, None)  # never imported: exc cannot be one of its kind
        if isinstance(kind, type) and isinstance(exc, kind):
            lines = getattr(exc, "lines", None)  # a ConfigError's problems, each already one line
            what = ("; ".join(lines) if lines else getattr(exc, "last_error", None)) or str(exc) or type(exc).__name__
            return one_line(what), hint
    return None


# (module, class, hint): looked up in sys.modules, so describing an error imports nothing (no torch or MLflow
# in an error path, and no import error masking the error being described).
KNOWN: list[tuple[str, str, str | None]] = [
    ("codemill.config", "ConfigError", None),
    ("codemill.data.folder_source", "SourceNotFoundError", "check the source path in the config or --source"),
    ("codemill.data.sources", "SourceError", None),
    ("codemill.problems.sets", "ProblemFileError", "fix or remove the named line; nothing was committed"),
    ("codemill.lineage.read", "LineageError", None),
    ("codemill.models.launch", "TrainingFailed",
     "the trainer's output above has the rest; a rerun resumes from the last committed checkpoint"),
    ("codemill.models.checkpoint", "CheckpointDirBusy", "another trainer holds this checkpoint folder; wait for "
                                                        "it or stop it"),
    ("codemill.store", "IncompleteArtifactError", "the artifact was never committed; rerun to rebuild it"),
    ("codemill.store_claim", "ClaimWaitTimeout", "let that run finish or stop it; CODEMILL_STORE_WAIT_S sets how "
                                                 "long a run waits (seconds)"),
]
