"""The A2A gRPC binding: the SDK's servicer on ``grpc.aio``, behind the same bearer tokens.

One gRPC server serves every exposed agent: a request names its agent in the proto's
``tenant`` field (the card's gRPC interface says which tenant to use; the SDK's client
copies it onto every request). With a single agent an empty tenant means that agent, so a
client that never sets it (the TCK) works too.

Auth is the JSON-RPC/REST gate's: every call needs ``authorization: Bearer <token>`` in its
metadata, checked in constant time against the same :class:`TokenTable`; anything else is
answered ``UNAUTHENTICATED`` before the servicer sees the request. With TLS configured the
port is a TLS port (``client_ca``: clients must show a certificate, mTLS); without, it
listens in clear text, on 127.0.0.1 unless told otherwise. The server runs in the HTTP
server's event loop (started and stopped by its lifespan), so both bindings share the
service's state, its board lane and its push watch.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
import grpc.aio
from a2a.auth.user import UnauthenticatedUser, User
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.grpc_handler import (
    DefaultGrpcServerCallContextBuilder,
    GrpcHandler,
)
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import a2a_pb2_grpc
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import A2A_ERROR_REASONS, A2AError, InvalidParamsError
from a2a.utils.grpc_status import status_to_grpc
from google.protobuf import any_pb2  # type: ignore[import-untyped,unused-ignore]
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped,unused-ignore]

from .auth import REALM, TokenTable
from .convert import PROTOCOL_VERSION
from .errors import DOMAIN, spec_grpc_status

log = logging.getLogger("agap.a2a.grpc")

UNAUTHENTICATED = "a valid bearer token is required (metadata 'authorization: Bearer <token>')"
GRACE = 5.0  # seconds in-flight calls get when the server stops


def metadata_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` metadata entry, or None."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            scheme, _, token = text.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


def unsupported_version(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The call's ``a2a-version`` when it is not this server's major.minor, else "".

    No header is accepted (the SDK's clients always send one); the spec's gRPC mapping of
    VersionNotSupportedError is UNIMPLEMENTED.
    """
    for key, value in metadata or ():
        if key.lower() == "a2a-version":
            text = (value.decode("latin-1") if isinstance(value, bytes) else value).strip()
            if text and text.split(".")[:2] != PROTOCOL_VERSION.split(".")[:2]:
                return text
    return ""


class Caller(User):
    """The caller a bearer token named (every task is scoped to it)."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self._name


class BearerContext(DefaultGrpcServerCallContextBuilder):
    """The call context's user from the call's bearer token (the interceptor checked it)."""

    def __init__(self, tokens: TokenTable) -> None:
        self.tokens = tokens

    def build_user(self, context: grpc.aio.ServicerContext) -> User:  # type: ignore[type-arg]
        token = metadata_token(context.invocation_metadata())
        caller = self.tokens.caller_for(token) if token else None
        return Caller(caller) if caller else UnauthenticatedUser()


class _Malformed:
    """What a request that does not parse deserializes to (answered INVALID_ARGUMENT)."""

    def __init__(self, error: str) -> None:
        self.error = error


def _tolerant(parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if parse is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # the protobuf parser's DecodeError, whatever its module
            return _Malformed(str(exc))

    return deserialize


class BearerInterceptor(grpc.aio.ServerInterceptor):
    """Every call needs a valid bearer token, else ``UNAUTHENTICATED`` and nothing runs.

    A request that does not parse is ``INVALID_ARGUMENT`` with the parser's message
    (gRPC itself would answer UNKNOWN and log a traceback).
    """

    def __init__(self, tokens: TokenTable) -> None:
        self.tokens = tokens

    def refusal(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
        """Why the call is refused (no or an unknown token), or "" for a known caller."""
        token = metadata_token(metadata)
        if token and self.tokens.caller_for(token):
            return ""
        return UNAUTHENTICATED + ("" if token is None else ": this token is not known")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:  # an unknown method: gRPC answers UNIMPLEMENTED
            return handler
        refusal = self.refusal(handler_call_details.invocation_metadata)
        version = unsupported_version(handler_call_details.invocation_metadata)

        async def check(request: Any, context: Any) -> None:
            if refusal:
                context.set_trailing_metadata((("www-authenticate", f'Bearer realm="{REALM}"'),))
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal)
            if version:
                await context.abort(
                    grpc.StatusCode.UNIMPLEMENTED,
                    f"A2A-Version {version} is not supported: this server speaks {PROTOCOL_VERSION}",
                )
            if isinstance(request, _Malformed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.error}")

        des, ser = _tolerant(handler.request_deserializer), handler.response_serializer
        if handler.unary_stream:
            inner_stream: Any = handler.unary_stream

            async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
                await check(request, context)
                async for item in inner_stream(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=des, response_serializer=ser
            )
        inner: Any = handler.unary_unary

        async def unary(request: Any, context: Any) -> Any:
            await check(request, context)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(unary, request_deserializer=des, response_serializer=ser)


class SpecGrpcHandler(GrpcHandler):
    """The SDK's servicer, aborting with the spec's status where the SDK's differs
    (:mod:`.errors`: UNIMPLEMENTED, not FAILED_PRECONDITION, for an unsupported operation),
    with the same ``google.rpc.Status`` details (the reason the SDK's client reads)."""

    async def abort_context(self, error: A2AError, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        reason = A2A_ERROR_REASONS.get(type(error), "")
        name = spec_grpc_status(reason)
        if name is None:
            await super().abort_context(error, context)
            return
        code = grpc.StatusCode[name]
        status = status_pb2.Status(code=code.value[0], message=getattr(error, "message", None) or str(error))
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN))
        status.details.append(detail)
        rich = status_to_grpc(status)
        context.set_trailing_metadata((*(context.trailing_metadata() or ()), *rich.trailing_metadata))
        await context.abort(rich.code, rich.details)


class TenantRouter(RequestHandler):
    """The per-agent handlers behind one servicer: a request's ``tenant`` names its agent."""

    def __init__(self, handlers: Mapping[str, RequestHandler]) -> None:
        if not handlers:
            raise ValueError("no agent to route to")
        self.handlers = dict(handlers)

    def pick(self, tenant: str) -> RequestHandler:
        if not tenant and len(self.handlers) == 1:
            return next(iter(self.handlers.values()))
        handler = self.handlers.get(tenant)
        if handler is None:
            known = ", ".join(sorted(self.handlers))
            what = f"unknown tenant {tenant!r}" if tenant else "no tenant given"
            raise InvalidParamsError(
                message=f"{what}: set the request's tenant to the agent's id (one of {known})"
            )
        return handler

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        return await self.pick(params.tenant).on_get_task(params, context)

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        return await self.pick(params.tenant).on_list_tasks(params, context)

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        return await self.pick(params.tenant).on_cancel_task(params, context)

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        return await self.pick(params.tenant).on_message_send(params, context)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        async for event in self.pick(params.tenant).on_message_send_stream(params, context):
            yield event

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        return await self.pick(params.tenant).on_create_task_push_notification_config(params, context)

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        return await self.pick(params.tenant).on_get_task_push_notification_config(params, context)

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        async for event in self.pick(params.tenant).on_subscribe_to_task(params, context):
            yield event

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        return await self.pick(params.tenant).on_list_task_push_notification_configs(params, context)

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        await self.pick(params.tenant).on_delete_task_push_notification_config(params, context)

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        return await self.pick(params.tenant).on_get_extended_agent_card(params, context)


class GrpcListener:
    """The gRPC server of the A2A agents: created and bound at once, served by :meth:`start`.

    ``port`` 0 picks a free port (:attr:`port` says which). ``tls`` is
    ``(cert_pem, key_pem, client_ca_pem | None)`` as bytes; ``public`` is the target the
    cards name when clients reach the port by another address.
    """

    def __init__(
        self,
        tokens: TokenTable,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: tuple[bytes, bytes, bytes | None] | None = None,
        public: str = "",
    ) -> None:
        if len(tokens) == 0:
            raise ValueError("no tokens: the gRPC binding never listens unauthenticated")
        self.tokens = tokens
        self.host = host
        self._want = port
        self.tls = tls
        self.public = public  # the target the cards name, if not host:port (a proxy, NAT)
        self.port = 0
        self.server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        """``host:port`` as a gRPC target (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def start(self, handlers: Mapping[str, RequestHandler]) -> None:
        """Bind and serve ``handlers`` (agent id → handler); :attr:`port` is then the bound one."""
        server = grpc.aio.server(interceptors=[BearerInterceptor(self.tokens)])
        servicer = SpecGrpcHandler(TenantRouter(handlers), context_builder=BearerContext(self.tokens))
        a2a_pb2_grpc.add_A2AServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        host = f"[{self.host}]" if ":" in self.host else self.host
        target = f"{host}:{self._want}"
        if self.tls is None:
            port = server.add_insecure_port(target)
        else:
            cert, key, ca = self.tls
            creds = grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
            )
            port = server.add_secure_port(target, creds)
        if port == 0:
            raise OSError(f"the gRPC server could not bind {target}")
        self.port = port
        await server.start()
        self.server = server
        log.info("A2A gRPC on %s%s", self.address, " (TLS)" if self.tls else "")

    async def stop(self, grace: float = GRACE) -> None:
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None
