"""Start Prefect's ephemeral API server early, while the command line is still importing the flows.

With no ``PREFECT_API_URL``, Prefect starts a temporary API server (a uvicorn subprocess) at the first client
call, i.e. when the flow is called, and waits for it to answer. Its boot costs seconds (imports, database
migrations check), and so does importing the flow modules in this process; done one after the other they are
most of a no-change rerun's wall time. Starting the same server on a thread first lets the two overlap. The
flow then finds it running: ``SubprocessASGIServer`` is one instance per port (the ephemeral one has none),
so ``get_client`` reuses this one and stops it at exit exactly as it would stop its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


def start_ephemeral_api_early() -> Callable[[], None]:
    """Start the ephemeral API server on a thread when this process would start one; return a function that
    waits until it answers (and re-raises its start error). Call that before calling a flow: until the server
    answers, Prefect already counts it as running and would send requests to it."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return lambda: None  # a configured server, or none allowed: Prefect decides at the first call as usual
    # Imported here, not on the thread: the thread then only waits on the subprocess, and this import does not
    # share the interpreter with the flows' imports (it would finish, and the boot begin, seconds later).
    from prefect.server.api.server import SubprocessASGIServer

    errors: list[BaseException] = []

    def start() -> None:
        try:
            SubprocessASGIServer().start()
        except BaseException as e:  # handed to the caller by wait()
            errors.append(e)

    thread = threading.Thread(target=start, name="prefect-ephemeral-api", daemon=True)
    thread.start()

    def wait() -> None:
        thread.join()
        if errors:
            raise errors[0]

    return wait
