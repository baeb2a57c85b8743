"""``codemill serve``: every deployment of deployments/prefect.yaml served from one process (one machine).

The YAML stays the single source of truth: the same file feeds ``prefect deploy --all`` for work pools.
Entrypoints (``flows/x.py:f``) map to the installed modules (``codemill.flows.x``), so serving works from
an installed wheel too. Stopping the process pauses the schedules (Prefect's ``pause_on_shutdown``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

DEFAULT_PREFECT_FILE = Path(__file__).resolve().parents[1] / "deployments" / "prefect.yaml"


def load_flow(entrypoint: str):
    path, _, name = entrypoint.partition(":")
    module = "codemill." + path.removesuffix(".py").replace("/", ".")
    return getattr(importlib.import_module(module), name)


def deployment_specs(prefect_file: Path) -> list[dict[str, Any]]:
    if not prefect_file.is_file():
        raise FileNotFoundError(f"deployments file not found: {prefect_file}")
    specs = (yaml.safe_load(prefect_file.read_text()) or {}).get("deployments") or []
    if not specs:
        raise ValueError(f"{prefect_file} defines no deployments")
    return specs


def build_deployments(prefect_file: Path = DEFAULT_PREFECT_FILE, timezone: str | None = None) -> list:
    """RunnerDeployments for ``prefect.serve``; ``timezone`` overrides every schedule's time zone."""
    from prefect.client.schemas.schedules import construct_schedule
    from prefect.deployments.runner import EntrypointType

    out = []
    for spec in deployment_specs(prefect_file):
        schedules = [construct_schedule(cron=s["cron"], timezone=timezone or s.get("timezone") or "UTC")
                     for s in spec.get("schedules") or []]
        out.append(load_flow(spec["entrypoint"]).to_deployment(
            name=spec["name"], description=spec.get("description"), tags=spec.get("tags"),
            parameters=spec.get("parameters") or {}, concurrency_limit=spec.get("concurrency_limit"),
            schedules=schedules or None, entrypoint_type=EntrypointType.MODULE_PATH))
    return out


class PrefectApiAuthError(PermissionError):
    """The Prefect API refused this process's credentials (PREFECT_API_AUTH_STRING)."""


def check_api_access() -> None:
    """Preflight of ``codemill serve``: one authenticated request to the configured Prefect API, so a missing or
    wrong PREFECT_API_AUTH_STRING fails at once naming the API (not later, in the runner's background loop).
    The ephemeral API (no PREFECT_API_URL) has no authentication."""
    import httpx
    from prefect import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        return
    try:
        with get_client(sync_client=True) as client:
            client.hello()
    except httpx.HTTPStatusError as e:
        status = e.response.status_code
        if status not in (401, 403):
            raise
        fix = ("PREFECT_API_AUTH_STRING does not match the server's PREFECT_SERVER_API_AUTH_STRING"
               if PREFECT_API_AUTH_STRING.value() else "set PREFECT_API_AUTH_STRING to the server's auth string")
        raise PrefectApiAuthError(f"Prefect API {url} refused this client: HTTP {status} ({fix})") from e


def serve(prefect_file: Path = DEFAULT_PREFECT_FILE, timezone: str | None = None, limit: int | None = None) -> None:
    from prefect import serve as prefect_serve

    check_api_access()
    prefect_serve(*build_deployments(prefect_file, timezone), limit=limit, pause_on_shutdown=True)
