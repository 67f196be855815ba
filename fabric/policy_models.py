"""The policy file's schema (``cards/_policy.yaml``), checked with pydantic.

Imported by :func:`fabric.policy_file.load_policy_config` when it reads a file, never with
it: a process that reads the checked snapshot (:mod:`fabric.cardcache`) imports no pydantic.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fabric.durations import parse_duration
from fabric.errors import FabricError

__all__ = ["PolicyFile", "QuotaFile", "QuotaLimit", "ValidationError", "check_domain"]

# fabric.policy_file.SHARED: the module that imports this one is not imported back.
_SHARED = "shared"
_DOMAIN = re.compile(r"^(?:private:[a-z][a-z0-9_.-]{0,38}|[a-z][a-z0-9-]{0,38})$")


def check_domain(value: str) -> str:
    """``value`` if it is a privacy domain (``shared``, ``private:<human>``), else ValueError."""
    if not _DOMAIN.match(value) or value == "private":
        raise ValueError(f"{value!r} is not a privacy domain (write 'shared' or 'private:<human>')")
    return value


class QuotaLimit(BaseModel):
    """One quota: ``limit`` tasks per ``window``."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    limit: int = Field(ge=0)
    window: str = "1h"

    @field_validator("window")
    @classmethod
    def _window(cls, v: str) -> str:
        try:
            parse_duration(v)
        except FabricError as exc:
            raise ValueError(exc.what) from None
        return v


class QuotaFile(BaseModel):
    """``quota:``: the default, and per agent."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    # Constant defaults, made without a check (they are the defaults PolicyConfig has).
    default: QuotaLimit = QuotaLimit.model_construct(limit=60, window="1h")
    agents: dict[str, QuotaLimit] = Field(default_factory=dict)


class PolicyFile(BaseModel):
    """The whole file; every key has a default."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    quota: QuotaFile = QuotaFile.model_construct()
    max_depth: int = Field(default=8, ge=0)
    gate_to: str | None = None
    default_domain: str = _SHARED
    domains: dict[str, str] = Field(default_factory=dict)
    tainted: dict[str, str] = Field(default_factory=dict)
    promote_to: str | None = None

    @field_validator("default_domain")
    @classmethod
    def _default(cls, v: str) -> str:
        return check_domain(v)

    @field_validator("domains")
    @classmethod
    def _domains(cls, v: dict[str, str]) -> dict[str, str]:
        for d in v.values():
            check_domain(d)
        return v
