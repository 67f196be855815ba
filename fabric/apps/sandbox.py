"""How an agent's coding runs are contained: ``cards/_sandbox.yaml``, rendered to compose.

Per agent: an image, the hosts its container may reach (through an egress proxy; nothing
else), CPU, memory and process caps, and no vault credentials. :func:`load_sandboxes`
reads the file; :func:`sandbox_service` is the compose data it renders to
(:mod:`fabric.apps.deploy.render`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fabric.cards.problems import error_message
from fabric.errors import ConfigError

SANDBOX_FILE = "_sandbox.yaml"


class SandboxSpec(BaseModel):
    """How an agent's coding runs are contained. Keyed by agent id in ``cards/_sandbox.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = Field(min_length=1)
    network_allow: tuple[str, ...] = ()  # host[:port] the container may reach; nothing else
    cpus: float = Field(default=2.0, gt=0, le=64)
    memory: str = "4g"
    pids: int = Field(default=512, ge=16)
    no_vault: bool = True  # no vault credentials in the container's environment or mounts
    workspace_root: str = "/var/lib/agap"  # <root>/workspaces/<agent>/<task uid>

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str) -> str:
        if not re.fullmatch(r"[1-9][0-9]*[kmg]", v):
            raise ValueError(f"{v!r} is not a size like 512m or 4g")
        return v

    @field_validator("network_allow")
    @classmethod
    def _hosts(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for host in v:
            if not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?", host):
                raise ValueError(f"{host!r} is not host or host:port")
        return v


def load_sandboxes(
    cards_dir: str | Path, known_agents: Sequence[str] | None = None
) -> dict[str, SandboxSpec]:
    """Agent id -> sandbox, from ``<cards_dir>/_sandbox.yaml`` (no file: no sandboxes)."""
    path = Path(cards_dir) / SANDBOX_FILE
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of agent id to sandbox")
    out: dict[str, SandboxSpec] = {}
    for agent, raw in data.items():
        if known_agents is not None and agent not in known_agents:
            raise ConfigError(f"{path}: no card for agent {agent!r}", where=str(agent))
        try:
            out[str(agent)] = SandboxSpec.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise ConfigError(f"{path}: {agent}.{field}: {error_message(first)}") from None
    return out


VAULT_PREFIXES = ("VAULT_", "BAO_", "AGAP_VAULT_")


def sandbox_service(agent: str, spec: SandboxSpec) -> dict[str, Any]:
    """The compose data a sandbox renders to: a service fragment, its networks, its proxy.

    * the agent's container joins only an ``internal`` network (no route out) shared with
      an egress proxy that allows exactly ``network_allow``; ``HTTP(S)_PROXY`` point at it;
    * ``cpus``, ``mem_limit`` and ``pids_limit`` cap it; all capabilities are dropped and
      privileges cannot be regained; the root filesystem is read-only except the workspace
      volume and ``/tmp``;
    * with ``no_vault`` no variable starting with a vault prefix and no secret is passed.
    """
    net = f"sandbox-{agent}"
    proxy = f"egress-{agent}"
    service: dict[str, Any] = {
        "image": spec.image,
        "networks": [net],
        "cpus": spec.cpus,
        "mem_limit": spec.memory,
        "pids_limit": spec.pids,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "read_only": True,
        "tmpfs": ["/tmp"],
        "volumes": [f"agap-workspaces-{agent}:{spec.workspace_root}/workspaces/{agent}"],
        "environment": {
            "AGAP_WORKSPACE_ROOT": spec.workspace_root,
            "HTTP_PROXY": f"http://{proxy}:3128",
            "HTTPS_PROXY": f"http://{proxy}:3128",
            "NO_PROXY": "",
        },
        "depends_on": [proxy],
    }
    return {
        "service": service,
        "egress_proxy": {"name": proxy, "allow": list(spec.network_allow), "networks": [net, "fabric"]},
        "networks": {net: {"internal": True}},
        # no_vault: drop these variables and attach no compose `secrets:` to the service
        "forbidden_env_prefixes": list(VAULT_PREFIXES) if spec.no_vault else [],
    }


__all__ = ["SANDBOX_FILE", "VAULT_PREFIXES", "SandboxSpec", "load_sandboxes", "sandbox_service"]
