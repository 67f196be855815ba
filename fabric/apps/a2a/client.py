"""A thin layer over the SDK's client for ``agap a2a call``, scripts, cron and the tests.

The card is fetched with :class:`a2a.client.A2ACardResolver`; calls go through
:func:`a2a.client.create_client` with an :class:`a2a.client.AuthInterceptor` that puts
the caller's bearer token on every request (the card declares the ``bearer`` scheme).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from a2a.client import (
    A2ACardResolver,
    AuthInterceptor,
    Client,
    ClientCallContext,
    ClientConfig,
    CredentialService,
    create_client,
)
from a2a.types.a2a_pb2 import (
    AgentCard,
    AuthenticationInfo,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)

from .convert import to_dict

TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
INTERRUPTED = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})


def tls_context(
    cacert: str | None = None, client_cert: str | None = None, client_key: str | None = None
) -> ssl.SSLContext:
    """The TLS settings of a client: the CA to trust, and a certificate to present (mTLS).

    One :class:`ssl.SSLContext` passed as httpx's ``verify``: httpx ignores ``cert`` when
    ``verify`` is a path, so a CA bundle plus a client certificate must travel together.
    """
    ctx = ssl.create_default_context(cafile=cacert)
    if client_cert:
        ctx.load_cert_chain(client_cert, client_key)
    return ctx


class BearerCredentials(CredentialService):
    """One bearer token for every scheme the card asks for."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def get_credentials(
        self, security_scheme_name: str, context: ClientCallContext | None
    ) -> str | None:
        return self._token


def text_message(
    text: str,
    *,
    refs: Sequence[str] = (),
    message_id: str | None = None,
    task_id: str = "",
    context_id: str = "",
) -> Message:
    parts = [Part(text=text)] + [Part(url=r) for r in refs]
    return Message(
        message_id=message_id or uuid.uuid4().hex,
        role=Role.ROLE_USER,
        parts=parts,
        task_id=task_id,
        context_id=context_id,
    )


def push_config(
    url: str, *, token: str = "", scheme: str = "", credentials: str = "", config_id: str = ""
) -> TaskPushNotificationConfig:
    cfg = TaskPushNotificationConfig(url=url, token=token, id=config_id)
    if scheme:
        cfg.authentication.CopyFrom(AuthenticationInfo(scheme=scheme, credentials=credentials))
    return cfg


def task_text(task: Task) -> str:
    """The text of a task's artifacts (or of its status message)."""
    texts = [p.text for a in task.artifacts for p in a.parts if p.text]
    if texts:
        return "\n".join(texts)
    return "\n".join(p.text for p in task.status.message.parts if p.text)


def task_dict(task: Task) -> dict[str, Any]:
    return to_dict(task)


@dataclass
class FabricA2AClient:
    """An SDK client for one agent, with its card and token."""

    client: Client
    card: AgentCard
    http: httpx.AsyncClient

    @classmethod
    async def open(
        cls,
        base_url: str,
        token: str,
        *,
        timeout: float = 300.0,
        streaming: bool = False,
        verify: ssl.SSLContext | bool = True,
        binding: str = "",
        grpc_channel: Callable[[str], Any] | None = None,
    ) -> FabricA2AClient:
        """``verify``: an :class:`ssl.SSLContext` (see :func:`tls_context`), or a bool.

        ``binding`` picks the card's interface to use ("JSONRPC", "HTTP+JSON", "GRPC";
        default: the card's first, JSON-RPC). gRPC needs ``grpc_channel``: target → channel
        (e.g. ``grpc.aio.insecure_channel``, or ``grpc.aio.secure_channel`` with TLS).
        """
        # TCP_NODELAY: without it, back-to-back calls on a kept-alive connection wait
        # ~40 ms for a delayed ACK (Nagle holds the request body behind its headers).
        transport = httpx.AsyncHTTPTransport(
            verify=verify, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        )
        http = httpx.AsyncClient(timeout=timeout, transport=transport)
        try:
            card = await A2ACardResolver(http, base_url).get_agent_card()
            config = ClientConfig(streaming=streaming, httpx_client=http, grpc_channel_factory=grpc_channel)
            if binding:
                config.supported_protocol_bindings = [binding]
                config.use_client_preference = True
            client = await create_client(
                card,
                config,
                interceptors=[AuthInterceptor(BearerCredentials(token))],
            )
        except BaseException:
            await http.aclose()
            raise
        return cls(client, card, http)

    async def close(self) -> None:
        await self.client.close()
        await self.http.aclose()

    async def __aenter__(self) -> FabricA2AClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send(
        self,
        message: Message,
        *,
        return_immediately: bool = False,
        push: TaskPushNotificationConfig | None = None,
    ) -> Task:
        """Send one message; the task it produced (the last task state seen)."""
        config = SendMessageConfiguration(return_immediately=return_immediately)
        if push is not None:
            config.task_push_notification_config.CopyFrom(push)
        request = SendMessageRequest(message=message, configuration=config)
        task: Task | None = None
        async for event in self.client.send_message(request):
            task = _apply(task, event)
        if task is None:
            raise RuntimeError("the agent answered with no task")
        return task

    async def stream(self, message: Message) -> list[StreamResponse]:
        request = SendMessageRequest(message=message)
        return [e async for e in self.client.send_message(request)]

    async def get(self, task_id: str) -> Task:
        return await self.client.get_task(GetTaskRequest(id=task_id))

    async def list(
        self, *, context_id: str = "", page_size: int = 50, page_token: str = ""
    ) -> ListTasksResponse:
        req = ListTasksRequest(
            context_id=context_id, page_size=page_size, page_token=page_token, include_artifacts=True
        )
        return await self.client.list_tasks(req)

    async def cancel(self, task_id: str) -> Task:
        return await self.client.cancel_task(CancelTaskRequest(id=task_id))

    async def wait(
        self,
        task_id: str,
        *,
        timeout: float = 60.0,
        every: float = 0.25,
        until: frozenset[int] = TERMINAL | INTERRUPTED,
    ) -> Task:
        """Poll ``GetTask`` until the task reaches one of ``until`` (bounded)."""
        deadline = time.monotonic() + timeout
        while True:
            task = await self.get(task_id)
            if task.status.state in until:
                return task
            if time.monotonic() >= deadline:
                raise TimeoutError(f"task {task_id} still {TaskState.Name(task.status.state)}")
            await asyncio.sleep(every)


def _apply(task: Task | None, event: StreamResponse) -> Task | None:
    if event.HasField("task"):
        return event.task
    if task is None:
        return None
    if event.HasField("status_update"):
        task.status.CopyFrom(event.status_update.status)
    elif event.HasField("artifact_update"):
        task.artifacts.append(event.artifact_update.artifact)
    return task
