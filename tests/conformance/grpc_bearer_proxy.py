"""A loopback gRPC proxy that adds ``authorization: Bearer <token>`` to every call.

The A2A TCK's gRPC client cannot send a token and ``agap a2a serve --grpc-port`` refuses
every call without one: the suite talks to this proxy, the proxy to the server. Requests
and answers pass as raw bytes (nothing is parsed); an error comes back with its code, its
message and its trailing metadata (the A2A error details), as the server sent them.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

#: The A2A service's server-streaming methods; every other one is unary.
STREAMING = frozenset({"SendStreamingMessage", "SubscribeToTask"})


class GrpcBearerProxy:
    """``with GrpcBearerProxy("127.0.0.1:8701", token) as proxy: proxy.address``."""

    def __init__(self, upstream: str, token: str) -> None:
        self.channel = grpc.insecure_channel(upstream)
        self.token = token
        self.forwarded = 0
        self.server = grpc.server(ThreadPoolExecutor(max_workers=128))
        self.server.add_generic_rpc_handlers((_Handler(self),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"

    def metadata(self, context: grpc.ServicerContext) -> list[tuple[str, str | bytes]]:
        md = [(k, v) for k, v in context.invocation_metadata() if k.lower() != "authorization"]
        return [*md, ("authorization", f"Bearer {self.token}")]

    def __enter__(self) -> GrpcBearerProxy:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(1).wait()
        self.channel.close()


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, proxy: GrpcBearerProxy) -> None:
        self.proxy = proxy

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = str(handler_call_details.method)
        proxy = self.proxy

        def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
            call: Any = proxy.channel.unary_unary(method)
            proxy.forwarded += 1
            try:
                return bytes(call(request, metadata=proxy.metadata(context), timeout=_timeout(context)))
            except grpc.RpcError as exc:
                _relay(exc, context)
                raise

        def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            call: Any = proxy.channel.unary_stream(method)
            proxy.forwarded += 1
            try:
                yield from call(request, metadata=proxy.metadata(context), timeout=_timeout(context))
            except grpc.RpcError as exc:
                _relay(exc, context)
                raise

        if method.rsplit("/", 1)[-1] in STREAMING:
            return grpc.unary_stream_rpc_method_handler(stream)
        return grpc.unary_unary_rpc_method_handler(unary)


def _relay(exc: grpc.RpcError, context: grpc.ServicerContext) -> None:
    err: Any = exc
    trailing = err.trailing_metadata() or ()
    context.set_trailing_metadata(tuple((k, v) for k, v in trailing))
    context.abort(err.code(), err.details() or "")


def _timeout(context: grpc.ServicerContext) -> float:
    """The caller's deadline, else five minutes (without one gRPC reports a far future
    that, passed on as a timeout, overflows into an already exceeded deadline)."""
    left = context.time_remaining()
    return min(left, 300.0) if left is not None else 300.0
