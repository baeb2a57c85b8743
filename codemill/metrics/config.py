"""The metrics section: where Prometheus metrics go (off by default)."""

from __future__ import annotations

import os

from codemill.metrics import ENV_PUSHGATEWAY
from codemill.stage_config import StageConfig, runtime_only


class MetricsConfig(StageConfig):
    """Prometheus metrics (docs: Observability). Off by default: the embedded defaults need no server."""

    pushgateway: str | None = runtime_only(
        default=None, description="Pushgateway (host:port or URL) that flow runs and the trainer's rank 0 push "
        "to; empty = metrics off. The environment variable CODEMILL_METRICS_PUSHGATEWAY overrides it.")
    push_interval_s: float = runtime_only(default=15.0, gt=0, description="Seconds between pushes while a run "
                                          "works (one more push at its end).")
    delete_finished: bool = runtime_only(default=False, description="Delete a run's group from the Pushgateway "
                                         "after its final push (else it stays, marked finished).")
    serve_port: int | None = runtime_only(default=None, ge=1, le=65535, description="`codemill serve` serves "
                                          "/metrics on this port; empty = not served.")

    def gateway(self) -> str | None:
        """Where to push: the environment variable, else the setting."""
        return os.environ.get(ENV_PUSHGATEWAY) or self.pushgateway
