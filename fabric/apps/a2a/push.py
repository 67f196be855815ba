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
* **Durability.** Configs live in the server's local index (:class:`DurablePushConfigs`
  over :class:`~fabric.apps.a2a.store.CallStore`), with whether the task's terminal event
  went out. A server killed with a task pending re-arms its watch at the next start and
  delivers the end when it comes (see :meth:`A2AService.start`).

  Why the local index and not the board (which is the authority on task *state*): a
  config carries the receiver's credentials (``token``, ``authentication``), and board
  metadata is readable by every board user and API token; a sync task has no board task
  until it is journaled, after it ended; a URL plus credentials overflows the 255
  characters a PostgreSQL/MySQL Kanboard keeps per metadata value; and only this server
  delivers pushes, so a config is of no use to any other process. What the server owes
  the receiver is recomputed from the board at restart (the task's current state).
"""

from __future__ import annotations

import asyncio
import importlib
import ipaddress
import logging
import random
import socket
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import httpx
from a2a.server.context import ServerCallContext
from a2a.server.tasks import PushNotificationConfigStore, PushNotificationSender
from a2a.server.tasks.push_notification_config_store import normalize_push_notification_config
from a2a.server.tasks.push_notification_sender import PushNotificationEvent
from a2a.types.a2a_pb2 import TaskPushNotificationConfig
from a2a.utils.proto_utils import to_stream_response
from a2a.utils.push_url_validator import validate_push_notification_url

from fabric.settings import registry

from .convert import to_dict
from .store import CallStore

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


class DurablePushConfigs(PushNotificationConfigStore):
    """The SDK's push-config store interface over the local index (survives kill -9).

    Configs are keyed by task only: every task operation is already scoped to its caller
    (:meth:`A2AService.find`) before a config is read or written.
    """

    def __init__(self, store: CallStore) -> None:
        self.store = store
        self._json = importlib.import_module("google.protobuf.json_format")

    def _parse(self, text: str) -> TaskPushNotificationConfig:
        config = TaskPushNotificationConfig()
        self._json.Parse(text, config)
        return config

    async def set_info(
        self, task_id: str, notification_config: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        stored = normalize_push_notification_config(task_id, notification_config)
        self.store.put_push(task_id, stored.id, self._json.MessageToJson(stored, indent=None))
        return stored

    async def get_info(self, task_id: str, context: ServerCallContext) -> list[TaskPushNotificationConfig]:
        return [self._parse(t) for t in self.store.pushes(task_id)]

    async def get_info_for_dispatch(self, task_id: str) -> list[TaskPushNotificationConfig]:
        return [self._parse(t) for t in self.store.pushes(task_id)]

    async def delete_info(
        self, task_id: str, context: ServerCallContext, config_id: str | None = None
    ) -> None:
        self.store.drop_push(task_id, config_id)


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
