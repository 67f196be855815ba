"""Push notifications: who may be called back, and delivery with retries.

* **Targets.** http(s) only; a host that resolves to a loopback, private, link-local or
  otherwise non-public address is refused (the SDK's check) unless it is allow-listed in
  ``AGAP_A2A_PUSH_ALLOW`` (comma-separated host names, IP addresses or CIDR blocks, e.g.
  ``127.0.0.1,hooks.lan,10.0.0.0/8``). Checked when the config is set and again before
  every delivery (a name can change what it resolves to).
* **Delivery.** The same ``StreamResponse`` JSON the stream carries, ``POST``ed with the
  config's ``authentication`` (``Authorization: <scheme> <credentials>``) and its
  ``token`` (``X-A2A-Notification-Token``). Retried with exponential backoff on
  connection errors, timeouts, 408, 429 and 5xx; other 4xx answers are final.
  At-least-once: receivers must be idempotent.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import socket
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import httpx
from a2a.server.tasks import PushNotificationConfigStore, PushNotificationSender
from a2a.server.tasks.push_notification_sender import PushNotificationEvent
from a2a.types.a2a_pb2 import TaskPushNotificationConfig
from a2a.utils.proto_utils import to_stream_response
from a2a.utils.push_url_validator import validate_push_notification_url

from fabric.settings import registry

from .convert import to_dict

log = logging.getLogger("agap.a2a.push")

RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class PushPolicy:
    """Which push targets are accepted (see the module docstring)."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PushPolicy:
        return cls.parse(registry.get_list("AGAP_A2A_PUSH_ALLOW", env))

    @classmethod
    def parse(cls, items: Iterable[str]) -> PushPolicy:
        hosts: set[str] = set()
        nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for raw in items:
            item = raw.strip().lower()
            if not item:
                continue
            try:
                nets.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                hosts.add(item)
        return cls(frozenset(hosts), tuple(nets))

    def _allowed_ip(self, text: str) -> bool:
        try:
            ip = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            return False
        return any(ip in n for n in self.networks)

    async def accepts(self, url: str) -> bool:
        """True when ``url`` may receive push notifications."""
        try:
            parsed = urllib.parse.urlparse(url)
            port = parsed.port
        except ValueError:
            return False
        host = (parsed.hostname or "").lower()
        if parsed.scheme not in ("http", "https") or not host:
            return False
        if host in self.hosts or self._allowed_ip(host):
            return True
        if self.networks:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port or (443 if parsed.scheme == "https" else 80), type=socket.SOCK_STREAM
                )
            except OSError:
                return False
            if infos and all(self._allowed_ip(str(i[4][0])) for i in infos):
                return True
        return await validate_push_notification_url(url)


@dataclass
class DeliveryStats:
    delivered: int = 0
    failed: int = 0
    attempts: int = 0
    refused: int = 0
    last_error: str = ""
    by_task: dict[str, int] = field(default_factory=dict)


class RetryingPushSender(PushNotificationSender):
    """Sends every event of a task to each of its push configs, with retries."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        configs: PushNotificationConfigStore,
        policy: PushPolicy,
        *,
        attempts: int = 5,
        base_delay: float = 0.5,
        max_delay: float = 30.0,
    ) -> None:
        self.client = client
        self.configs = configs
        self.policy = policy
        self.attempts = attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.stats = DeliveryStats()

    async def send_notification(self, task_id: str, event: PushNotificationEvent) -> None:
        try:
            configs = await self.configs.get_info_for_dispatch(task_id)
        except Exception:
            log.exception("push configs of task %s unreadable", task_id)
            return
        if configs:
            await asyncio.gather(*(self._deliver(task_id, c, event) for c in configs))

    async def _deliver(
        self, task_id: str, config: TaskPushNotificationConfig, event: PushNotificationEvent
    ) -> bool:
        if not await self.policy.accepts(config.url):
            self.stats.refused += 1
            log.warning("push for task %s: target %s refused by policy", task_id, config.url)
            return False
        headers = {"Content-Type": "application/json"}
        if config.token:
            headers["X-A2A-Notification-Token"] = config.token
        if config.HasField("authentication") and config.authentication.scheme:
            auth = config.authentication
            headers["Authorization"] = (
                f"{auth.scheme} {auth.credentials}" if auth.credentials else auth.scheme
            )
        body = to_dict(to_stream_response(event))
        for attempt in range(1, self.attempts + 1):
            self.stats.attempts += 1
            try:
                resp = await self.client.post(config.url, json=body, headers=headers)
                if resp.status_code < 300:
                    self.stats.delivered += 1
                    self.stats.by_task[task_id] = self.stats.by_task.get(task_id, 0) + 1
                    return True
                self.stats.last_error = f"HTTP {resp.status_code}"
                if resp.status_code not in RETRYABLE:
                    break
            except httpx.HTTPError as exc:
                self.stats.last_error = type(exc).__name__
            if attempt < self.attempts:
                delay = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
        self.stats.failed += 1
        log.warning(
            "push for task %s to %s failed after %d attempts (%s)",
            task_id,
            config.url,
            attempt,
            self.stats.last_error,
        )
        return False
