"""The base of every config section: pydantic models that forbid unknown keys and know which of their fields
change a stage's output (the rest, marked ``runtime_only``, stay out of its digest)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


def runtime_only(**kwargs: Any) -> Any:
    """A Field that does not affect the stage output (excluded from digests)."""
    return Field(json_schema_extra={"affects_output": False}, **kwargs)


class StageConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def digest_config(self) -> dict[str, Any]:
        """The output-affecting part of the config, recursively."""
        out: dict[str, Any] = {}
        for name, field in type(self).model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if extra.get("affects_output") is False:
                continue
            out[name] = _digestable(getattr(self, name))
        return out


def _digestable(value: Any) -> Any:
    if isinstance(value, StageConfig):
        return value.digest_config()
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_digestable(v) for v in value]
    return value
