"""Each rank's error, recorded where its launcher finds it, so that a dead job is named by its first cause.

When one rank dies, the others die of it a moment later (gloo's ``Connection reset by peer`` in their next
collective) and print their own errors after the first one: the last error in the output is an echo. A rank
that fails records its error (type, message, wall-clock time) in the folder ``$CODEMILL_RANK_ERRORS`` names
before it prints and exits; its exit is what the others die of, so on one machine the cause is the earliest
record. Ranks on other nodes record on their own machines: there the launcher falls back to the output.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

ENV = "CODEMILL_RANK_ERRORS"


def error_line(exc: BaseException) -> str:
    """``Type: message`` as a traceback's last line names it (the module too, when not a builtin), one line."""
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ not in ("builtins", "__main__"):
        name = f"{kind.__module__}.{name}"
    message = " ".join(str(exc).split())
    return f"{name}: {message}" if message else name


def record(exc: BaseException) -> None:
    """Record this rank's error, when its launcher asked for records (written whole: a temporary file renamed)."""
    folder = os.environ.get(ENV)
    if not folder or (isinstance(exc, SystemExit) and not exc.code):  # no records asked for, or no failure
        return
    rank = os.environ.get("RANK", "?")
    entry = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "time": time.time(),
             "error": error_line(exc)}
    path = Path(folder) / f"rank-{rank}-{os.getpid()}.json"
    try:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, path)
    except OSError:  # the folder is gone (the launcher gave up on the job): the output still has the error
        pass


def first_cause(folder: Path) -> str | None:
    """``rank N: Type: message`` of the earliest recorded error in ``folder``, or None when no rank recorded one."""
    entries = []
    for path in folder.glob("rank-*.json"):
        try:
            entries.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    if not entries:
        return None
    first = min(entries, key=lambda e: e["time"])
    return f"rank {first['rank']}: {first['error']}"
