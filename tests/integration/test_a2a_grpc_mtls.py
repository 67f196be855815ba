"""The A2A gRPC binding over mTLS: the server requires a client certificate from its CA.

As test_a2a_mtls.py does for JSON-RPC: the test makes its own PKI with ``cryptography``
(a CA, a server certificate for 127.0.0.1, a client certificate from the CA, a
self-signed one, and one from another CA); the server is the real one (the HTTP listener
and the gRPC listener with the same TLS files, as ``agap a2a serve --tls-cert --tls-key
--tls-client-ca --grpc-port`` builds them); the clients are ``grpcio`` itself and the
SDK's gRPC client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from a2a.types import a2a_pb2_grpc
from a2a.types.a2a_pb2 import ListTasksRequest, SendMessageRequest, TaskState
from cryptography.hazmat.primitives.asymmetric import ec

from fabric.apps.a2a.client import FabricA2AClient, task_text, text_message, tls_context
from fabric.apps.a2a.grpc_server import GrpcListener
from fabric.apps.a2a.server import ServerThread, TlsConfig, grpc_tls, make_service
from fabric.apps.a2a.service import ServiceConfig
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from tests.fakes.openai_stub import OpenAIStub
from tests.integration.test_a2a_interop import ALICE, TOKENS, reply, run, setup_env
from tests.integration.test_a2a_mtls import Pki, _cert, _write, make_pki

BEARER = (("authorization", f"Bearer {ALICE}"),)


@dataclass
class GrpcMtls:
    server: ServerThread
    grpc: GrpcListener
    pki: Pki
    other_cert: Path  # a client certificate from another CA
    other_key: Path
    stub: OpenAIStub
    fab: Fabric

    def credentials(self, who: str = "client") -> Any:
        """A channel's TLS: trusts the server's CA; presents ``who``'s certificate (or none)."""
        p = self.pki
        pair = {
            "client": (p.client_cert, p.client_key),
            "self-signed": (p.rogue_cert, p.rogue_key),
            "other CA": (self.other_cert, self.other_key),
        }.get(who)
        ca = p.ca.read_bytes()
        if pair is None:
            return grpc.ssl_channel_credentials(root_certificates=ca)
        cert, key = pair
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key.read_bytes(), certificate_chain=cert.read_bytes()
        )

    def stub_for(self, who: str = "client") -> tuple[Any, Any]:
        channel = grpc.secure_channel(self.grpc.address, self.credentials(who))
        return channel, a2a_pb2_grpc.A2AServiceStub(channel)  # type: ignore[no-untyped-call]

    def open_tasks(self) -> int:
        return len(self.fab.board.search('status:open swimlane:"helper"'))


def _other_ca(d: Path) -> tuple[Path, Path]:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    return _write(d / "eve", _cert("eve", key, ("other CA", ca_key)), key)


@pytest.fixture
def mtls(embedded_board: EmbeddedBoard, tmp_path: Path) -> Iterator[GrpcMtls]:
    pki = make_pki(tmp_path)
    other = _other_ca(tmp_path)
    with OpenAIStub(reply=reply) as stub:
        settings, cards, env, fab = setup_env(embedded_board, tmp_path, stub)

        def connect() -> Fabric:
            return Fabric.connect(
                settings, cards=cards, port=KanboardClient(embedded_board.url, embedded_board.token)
            )

        service = make_service(settings, cards, env, connect=connect, config=ServiceConfig())
        tls = TlsConfig(pki.server_cert, pki.server_key, client_ca=pki.ca)
        listener = GrpcListener(TOKENS, host="127.0.0.1", port=0, tls=grpc_tls(tls))
        server = ServerThread(service, ["helper"], TOKENS, tls=tls, grpc=listener).start()
        try:
            yield GrpcMtls(server, listener, pki, *other, stub, fab)
        finally:
            server.stop()


def test_a_client_certificate_from_the_ca_plus_a_token_gets_through(mtls: GrpcMtls) -> None:
    channel, stub = mtls.stub_for("client")
    with channel:
        listed = stub.ListTasks(ListTasksRequest(tenant="helper"), metadata=BEARER, timeout=20)
        sent = stub.SendMessage(
            SendMessageRequest(tenant="helper", message=text_message("over gRPC and mTLS")),
            metadata=BEARER,
            timeout=60,
        )
    assert list(listed.tasks) == []
    assert sent.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task_text(sent.task).startswith("stub reply to: over gRPC and mTLS")

    creds = mtls.credentials("client")

    async def sdk() -> str:
        async with await FabricA2AClient.open(
            f"{mtls.server.url}/helper",
            ALICE,
            timeout=30,
            verify=_tls_context(mtls.pki),
            binding="GRPC",
            grpc_channel=lambda target: grpc.aio.secure_channel(target, creds),
        ) as c:
            return task_text(await c.send(text_message("the SDK over gRPC")))

    assert run(sdk()).startswith("stub reply to: the SDK over gRPC")


def _tls_context(p: Pki) -> Any:
    return tls_context(str(p.ca), str(p.client_cert), str(p.client_key))


@pytest.mark.parametrize("who", ["none", "self-signed", "other CA"])
def test_without_a_certificate_from_the_ca_nothing_runs(mtls: GrpcMtls, who: str) -> None:
    """The TLS handshake fails: UNAVAILABLE, before any interceptor or servicer — even with
    a valid bearer token, no task is made and no model is asked."""
    before = mtls.open_tasks()
    channel, stub = mtls.stub_for(who)
    with channel:
        calls: list[Callable[[], Any]] = [
            lambda: stub.ListTasks(ListTasksRequest(tenant="helper"), metadata=BEARER, timeout=10),
            lambda: stub.SendMessage(
                SendMessageRequest(tenant="helper", message=text_message("let me in")),
                metadata=BEARER,
                timeout=10,
            ),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value
    assert mtls.stub.chat_requests() == [] and mtls.open_tasks() == before


def test_a_verified_certificate_still_needs_the_bearer_token(mtls: GrpcMtls) -> None:
    before = mtls.open_tasks()
    channel, stub = mtls.stub_for("client")
    with channel:
        for metadata in ((), (("authorization", "Bearer not-a-valid-token-at-all"),)):
            with pytest.raises(grpc.RpcError) as err:
                stub.SendMessage(
                    SendMessageRequest(tenant="helper", message=text_message("hi")),
                    metadata=metadata,
                    timeout=10,
                )
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "bearer token" in str(err.value.details())
            trailing: Any = err.value.trailing_metadata() or ()
            challenge = [str(v) for k, v in trailing if k == "www-authenticate"]
            assert challenge and challenge[0].startswith('Bearer realm="agap"')
    assert mtls.stub.chat_requests() == [] and mtls.open_tasks() == before
