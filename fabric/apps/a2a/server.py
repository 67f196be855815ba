"""The A2A server: the SDK's Starlette routes per agent, behind the bearer gate, on uvicorn.

Layout, for each exposed agent ``<id>``:

* ``GET  /<id>/.well-known/agent-card.json`` — the Agent Card (public: it declares the
  bearer scheme clients must use);
* ``POST /<id>`` — A2A v1.0 JSON-RPC (``SendMessage``, ``SendStreamingMessage``,
  ``GetTask``, ``ListTasks``, ``CancelTask``, ``SubscribeToTask``, push-config methods);
* ``/<id>/message:send``, ``/<id>/message:stream``, ``/<id>/tasks[/{task}[:cancel|:subscribe]]``,
  ``/<id>/tasks/{task}/pushNotificationConfigs[/{config}]`` — the HTTP+JSON (REST) binding;
* with a gRPC port (:class:`~fabric.apps.a2a.grpc_server.GrpcListener`), the gRPC binding,
  the agent named by the request's ``tenant``.

Every binding goes through the same :class:`FabricRequestHandler` (the same caller
scoping, board, push watch) and the same tokens: the HTTP bindings behind
:class:`BearerGate` (401), gRPC behind its interceptor (``UNAUTHENTICATED``).
With a single agent its card is also served at ``/.well-known/agent-card.json``.
The listeners bind 127.0.0.1 unless told otherwise, and never start without tokens.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount

from fabric.apps import asgi
from fabric.apps.asgi import GRACEFUL
from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.errors import ConfigError
from fabric.kanboard.quotas import QuotaStore
from fabric.settings import registry
from fabric.settings.resolve import Settings
from workers.shared_quota import Across

from . import convert as cv
from .auth import BearerGate, TokenTable
from .checks import CardLastModified, EnumGuard
from .errors import SpecErrorStatus
from .handler import FabricRequestHandler
from .runner import Runner
from .service import A2AService, ServiceConfig
from .store import CallStore

if TYPE_CHECKING:
    from .grpc_server import GrpcListener

log = logging.getLogger("agap.a2a")

# A card changes only when its fabric card does (a restart): five minutes of caching costs
# a client little staleness, and the SDK's ETag makes every revalidation a 304.
CARD_CACHE = "public, max-age=300"


def fabric_version() -> str:
    try:
        return metadata.version("agap-fabric")
    except metadata.PackageNotFoundError:
        return "0.0.0"


@dataclass(frozen=True)
class TlsConfig:
    """TLS for the listener; with ``client_ca`` every client must show a certificate.

    mTLS is a gate in front of the bearer gate, not a replacement: a connection without a
    certificate signed by ``client_ca`` fails in the TLS handshake and never reaches the
    app, and a request on a verified connection still needs its caller's bearer token.
    The token names the caller (every task is scoped to it); uvicorn does not hand the
    peer certificate to the app, so the certificate cannot (A2A.md: "bearer identity on
    top of mTLS").
    """

    cert: Path
    key: Path
    client_ca: Path | None = None


def build_app(
    service: A2AService,
    agents: Sequence[str],
    tokens: TokenTable,
    base_url: str,
    *,
    mtls: bool = False,
    grpc: GrpcListener | None = None,
) -> Starlette:
    """The Starlette app serving ``agents`` through ``service`` (and ``grpc``, from its lifespan)."""
    if not agents:
        raise ConfigError("no agent to expose", where="--agent")
    if len(tokens) == 0:
        raise ConfigError("no A2A client tokens are configured", where="AGAP_A2A_TOKENS")
    routes: list[BaseRoute] = []
    public: list[str] = []
    version = fabric_version()
    cards = {}
    handlers: dict[str, FabricRequestHandler] = {}
    for agent in agents:
        card = service.cards.get(agent)
        service.runner.prepare(agent)
        a2a_card = cv.agent_card(
            card,
            base_url,
            version=version,
            mtls=mtls,
            grpc="" if grpc is None else grpc.public or grpc.address,
        )
        cards[agent] = a2a_card
        handler = handlers[agent] = FabricRequestHandler(service, agent, a2a_card)
        path = f"/{agent}{AGENT_CARD_WELL_KNOWN_PATH}"
        routes += create_agent_card_routes(a2a_card, card_url=path, cache_control=CARD_CACHE)
        # Clients that join the interface URL with "/" (the TCK does) post to "/<id>/":
        # answer there too rather than with a redirect that a POST does not follow.
        for rpc_url in (f"/{agent}", f"/{agent}/"):
            routes += create_jsonrpc_routes(handler, rpc_url=rpc_url)
        # HTTP+JSON under the same URL. The SDK also mounts every route again under
        # "/{tenant}"; the agent is already in the path, and that catch-all mount would
        # shadow the other agents' routes, so it is left out.
        rest = create_rest_routes(handler, path_prefix=f"/{agent}")
        routes += [r for r in rest if not isinstance(r, Mount)]
        public.append(path)
    if len(agents) == 1:
        routes += create_agent_card_routes(cards[agents[0]], cache_control=CARD_CACHE)
        public.append(AGENT_CARD_WELL_KNOWN_PATH)

    @asynccontextmanager
    async def lifespan(app: object) -> AsyncIterator[None]:
        async with service.lifespan(app):
            if grpc is None:
                yield
                return
            await grpc.start(handlers)
            for a2a_card in cards.values():
                cv.set_grpc_address(a2a_card, grpc.public or grpc.address)
            try:
                yield
            finally:
                await grpc.stop()

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(CardLastModified, paths=public, since=time.time()),
            Middleware(SpecErrorStatus),
            Middleware(BearerGate, tokens=tokens, public_paths=public),
            Middleware(EnumGuard),
        ],
    )
    app.state.a2a_cards = cards
    app.state.a2a_service = service
    return app


def make_service(
    settings: Settings,
    cards: CardSet,
    env: Mapping[str, str],
    *,
    connect: Callable[[], Fabric] | None = None,
    config: ServiceConfig | None = None,
    state_path: Path | None = None,
) -> A2AService:
    """An :class:`A2AService` over the board the settings name."""
    if connect is None:

        def connect() -> Fabric:
            return Fabric.connect(settings, cards=cards)

    path = state_path or (settings.state_dir / "a2a.sqlite3")
    # Sync calls count against quotas kept across hosts as the workers do, over a
    # connection of their own (made at the first such call; none for local quotas).
    across = Across(
        lambda: QuotaStore(connect().port, settings.quota_project),
        refresh=registry.get_duration("AGAP_QUOTA_REFRESH", env),
    )
    return A2AService(
        cards=cards,
        store=CallStore(path),
        runner=Runner(cards, env, state_dir=settings.state_dir, across=across),
        connect=connect,
        env=env,
        config=config or ServiceConfig(),
    )


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0 picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP,
    # and accepted sockets inherit it (without it every reply waits ~40 ms for an ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def uvicorn_config(
    app: Starlette, sock: socket.socket, *, tls: TlsConfig | None, log_level: str = "warning"
) -> uvicorn.Config:
    kw: dict[str, Any] = {}
    if tls is not None:
        kw.update(ssl_certfile=str(tls.cert), ssl_keyfile=str(tls.key))
        if tls.client_ca is not None:
            kw.update(ssl_ca_certs=str(tls.client_ca), ssl_cert_reqs=ssl.CERT_REQUIRED)
    host, port = sock.getsockname()[:2]
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL,
        **kw,
    )


class ServerThread:
    """The A2A server on a loopback port in a background thread (tests, benchmarks)."""

    def __init__(
        self,
        service: A2AService,
        agents: Sequence[str],
        tokens: TokenTable,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: TlsConfig | None = None,
        grpc: GrpcListener | None = None,
    ) -> None:
        self.sock = bind(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        self.url = f"{'https' if tls else 'http'}://{self.host}:{self.port}"
        self.service = service
        self.grpc = grpc
        self.app = build_app(service, agents, tokens, self.url, mtls=bool(tls and tls.client_ca), grpc=grpc)
        self.server = uvicorn.Server(uvicorn_config(self.app, self.sock, tls=tls))
        self.thread = threading.Thread(target=self._run, name="a2a-server", daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self, timeout: float = 20.0) -> ServerThread:
        self.thread.start()
        ready = threading.Event()

        def check() -> None:
            while not self.server.started and self.thread.is_alive():
                threading.Event().wait(0.02)
            ready.set()

        threading.Thread(target=check, daemon=True).start()
        if not ready.wait(timeout) or not self.server.started:
            raise RuntimeError("the A2A server did not start")
        return self

    def stop(self, timeout: float = 20.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    service: A2AService,
    agents: Sequence[str],
    tokens: TokenTable,
    *,
    host: str,
    port: int,
    public_url: str | None = None,
    tls: TlsConfig | None = None,
    grpc: GrpcListener | None = None,
    log_level: str = "info",
) -> None:
    """Run the server in the foreground until SIGINT/SIGTERM (with ``grpc``, that one too)."""
    sock = bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    scheme = "https" if tls else "http"
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    base = (public_url or f"{scheme}://{shown}:{bound_port}").rstrip("/")
    app = build_app(service, agents, tokens, base, mtls=bool(tls and tls.client_ca), grpc=grpc)
    if grpc is not None and grpc.tls is None and not _loopback(grpc.host):
        log.warning(
            "A2A gRPC listening on %s without TLS: bearer tokens cross the network in clear text",
            grpc.host,
        )
    if tls is None and not _loopback(bound_host):
        log.warning(
            "A2A listening on %s without TLS: bearer tokens cross the network in "
            "clear text (use --tls-cert/--tls-key)",
            bound_host,
        )
    for agent in agents:
        log.info("A2A agent %s: %s/%s/.well-known/agent-card.json", agent, base, agent)
    asgi.serve(uvicorn_config(app, sock, tls=tls, log_level=log_level), [sock])


def grpc_tls(tls: TlsConfig | None) -> tuple[bytes, bytes, bytes | None] | None:
    """The gRPC server's TLS material: the HTTP listener's certificate, key and client CA."""
    if tls is None:
        return None
    ca = tls.client_ca.read_bytes() if tls.client_ca else None
    return tls.cert.read_bytes(), tls.key.read_bytes(), ca


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
