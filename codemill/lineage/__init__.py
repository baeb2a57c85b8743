"""Lineage in MLflow: the only code in codemill that talks to MLflow.

- ``record``: every write (stage runs, datasets, LoggedModels, eval metrics, the champion alias, rank-0 logging)
- ``read``: the queries that browse the chain; ``view``: the chain as a tree, rendered or as JSON
- ``access``: identities, credentials and the client that turns 401/403 into ``TrackingAccessDenied``
- ``check``: is the tracking store there (no MLflow import); ``tags``: the tag names (no MLflow import)

The writers' names are re-exported here and loaded on first use, so ``from codemill.lineage import tags`` or
``check`` costs no MLflow import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from codemill.lineage.access import (
        IDENTITY_GRANTS,
        PIPELINE_USER,
        READER_USER,
        TrackingAccessDenied,
        access_error,
        check_credentials,
        guarded_client,
        provision_identities,
    )
    from codemill.lineage.record import Lineage, Registry, mlflow_digest, preload_store

_HOME = {
    **dict.fromkeys(("IDENTITY_GRANTS", "PIPELINE_USER", "READER_USER", "TrackingAccessDenied", "access_error",
                     "check_credentials", "guarded_client", "provision_identities"), "access"),
    **dict.fromkeys(("Lineage", "Registry", "mlflow_digest", "preload_store"), "record"),
}

__all__ = ["IDENTITY_GRANTS", "PIPELINE_USER", "READER_USER", "Lineage", "Registry", "TrackingAccessDenied",
           "access_error", "check_credentials", "guarded_client", "mlflow_digest", "preload_store",
           "provision_identities"]


def __getattr__(name: str) -> Any:
    """A re-exported name, imported from its module at first use (MLflow loads then, not before)."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
