"""mTLS both ways: the server requires a client certificate, the client presents one.

The test makes its own CA, server certificate (for 127.0.0.1) and client certificates
(one from the CA, one self-signed) with ``cryptography``; the server is the real one on
loopback with TLS; the clients are the SDK client, ``agap a2a call`` and raw httpx.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import fabric.apps.cli.a2a_cmd  # noqa: F401  (registers `agap a2a` until COMMAND_MODULES lists it)
from fabric.apps.a2a.client import FabricA2AClient, task_text, text_message, tls_context
from fabric.apps.a2a.server import ServerThread, TlsConfig, make_service
from fabric.apps.a2a.service import ServiceConfig
from fabric.apps.cli import main
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from tests.fakes.openai_stub import OpenAIStub
from tests.integration.test_a2a_interop import ALICE, TOKENS, reply, run, setup_env


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path
    rogue_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    issuer_name, issuer_key = issuer or (subject, key)
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        b = b.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        b = b.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return b.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return path.with_suffix(".crt"), path.with_suffix(".key")


def make_pki(d: Path) -> Pki:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test CA", ca_key, None, ca=True)
    ca_path, _ = _write(d / "ca", ca, ca_key)
    keys = {n: ec.generate_private_key(ec.SECP256R1()) for n in ("server", "client", "rogue")}
    server = _write(
        d / "server", _cert("127.0.0.1", keys["server"], ("test CA", ca_key), server=True), keys["server"]
    )
    client = _write(d / "client", _cert("alice", keys["client"], ("test CA", ca_key)), keys["client"])
    rogue = _write(d / "rogue", _cert("mallory", keys["rogue"], None), keys["rogue"])
    return Pki(ca_path, *server, *client, *rogue)


@dataclass
class MtlsEnv:
    server: ServerThread
    pki: Pki

    @property
    def url(self) -> str:
        return f"{self.server.url}/helper"


@pytest.fixture
def mtls(embedded_board: EmbeddedBoard, tmp_path: Path) -> Iterator[MtlsEnv]:
    pki = make_pki(tmp_path)
    with OpenAIStub(reply=reply) as stub:
        settings, cards, env, _ = setup_env(embedded_board, tmp_path, stub)

        def connect() -> Fabric:
            return Fabric.connect(
                settings, cards=cards, port=KanboardClient(embedded_board.url, embedded_board.token)
            )

        service = make_service(settings, cards, env, connect=connect, config=ServiceConfig())
        tls = TlsConfig(pki.server_cert, pki.server_key, client_ca=pki.ca)
        server = ServerThread(service, ["helper"], TOKENS, tls=tls).start()
        try:
            yield MtlsEnv(server, pki)
        finally:
            server.stop()


LIST = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}


def _post(url: str, verify: ssl.SSLContext, token: str | None = ALICE) -> httpx.Response:
    headers = {"A2A-Version": "1.0", **({"Authorization": f"Bearer {token}"} if token else {})}
    with httpx.Client(verify=verify, timeout=10) as http:
        return http.post(url, json=LIST, headers=headers)


def test_a_client_certificate_from_the_ca_plus_a_token_gets_through(mtls: MtlsEnv) -> None:
    p = mtls.pki
    r = _post(mtls.url, tls_context(str(p.ca), str(p.client_cert), str(p.client_key)))
    assert r.status_code == 200 and "result" in r.json()

    async def go() -> str:
        ctx = tls_context(str(p.ca), str(p.client_cert), str(p.client_key))
        async with await FabricA2AClient.open(mtls.url, ALICE, timeout=30, verify=ctx) as c:
            assert "mtls" in c.card.security_schemes and "mtls" in c.card.security_requirements[0].schemes
            return task_text(await c.send(text_message("over mTLS")))

    assert run(go()).startswith("stub reply to: over mTLS")


@pytest.mark.parametrize("who", ["none", "self-signed"])
def test_without_a_certificate_from_the_ca_the_handshake_fails(mtls: MtlsEnv, who: str) -> None:
    p = mtls.pki
    ctx = (
        tls_context(str(p.ca))
        if who == "none"
        else tls_context(str(p.ca), str(p.rogue_cert), str(p.rogue_key))
    )
    # TLS 1.3 reports a refused client certificate on the first read: a connect or read error.
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        _post(mtls.url, ctx)


def test_a_verified_certificate_still_needs_the_bearer_token(mtls: MtlsEnv) -> None:
    p = mtls.pki
    ctx = tls_context(str(p.ca), str(p.client_cert), str(p.client_key))
    for token in (None, "not-a-valid-token-at-all"):
        r = _post(mtls.url, ctx, token)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith('Bearer realm="agap"')


def test_agap_a2a_call_presents_the_client_certificate(mtls: MtlsEnv) -> None:
    p = mtls.pki
    runner = CliRunner()
    tls = ["--cacert", str(p.ca), "--client-cert", str(p.client_cert), "--client-key", str(p.client_key)]
    ok = runner.invoke(main, ["a2a", "call", mtls.url, "Say hi", "--token", ALICE, *tls])
    assert ok.exit_code == 0, ok.output
    assert "stub reply to: Say hi" in ok.output
    refused = runner.invoke(
        main, ["a2a", "call", mtls.url, "Say hi", "--token", ALICE, "--cacert", str(p.ca)]
    )
    # the handshake is refused: exit 3 (refused credentials), one line, no traceback, and the
    # hint names the certificate the server asked for
    assert refused.exit_code == 3, refused.output
    assert refused.output.startswith("agap: error: ") and len(refused.output.strip().splitlines()) == 1
    assert "--client-cert" in refused.output
    bad = runner.invoke(
        main, ["a2a", "call", mtls.url, "x", "--token", ALICE, "--client-key", str(p.client_key)]
    )
    assert bad.exit_code == 2 and "needs its certificate" in bad.output
