"""``/metrics`` for a long-running process (``codemill serve``): Prometheus scrapes it instead of a push."""

from __future__ import annotations

from prometheus_client import start_http_server

from codemill import metrics


def serve_metrics(port: int, addr: str = "0.0.0.0") -> None:
    """Turn metrics on in this process and serve them on ``addr:port`` from a daemon thread."""
    start_http_server(port, addr, registry=metrics.enable())
