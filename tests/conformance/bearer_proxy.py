"""A loopback HTTP proxy that adds ``Authorization: Bearer <token>`` to every request.

The MCP conformance suite cannot send a bearer token, and ``agap mcp serve`` refuses every
request without one: the suite talks to this proxy, the proxy to the server. Everything
else passes through as sent (the Host and Origin headers included, which the
DNS-rebinding scenario depends on), and responses stream back as they come (SSE).

The A2A TCK reads the interfaces' URLs from the Agent Card, so with ``rewrite``
(``{server's text: proxy's text}``) an agent card's body has them replaced: the suite
then reaches every binding through a proxy (gRPC through :mod:`.grpc_bearer_proxy`).
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization"}
_OWN = {"date", "server"}  # the proxy's own response says these


class BearerProxy:
    """``with BearerProxy(upstream, token) as proxy: proxy.url`` (the upstream's path kept)."""

    def __init__(self, upstream: str, token: str, rewrite: dict[str, str] | None = None) -> None:
        parts = urlsplit(upstream)
        host, port, path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/"
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection does (SSE)

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                headers["Authorization"] = f"Bearer {token}"
                conn = http.client.HTTPConnection(host, port, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    if owner.rewrite and self.path.endswith("agent-card.json") and resp.status == 200:
                        self._card(resp)
                        return
                    self.send_response(resp.status)
                    for k, v in _kept(resp.getheaders()):
                        self.send_header(k, v)
                    self.end_headers()
                    while chunk := resp.read1(65536):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (OSError, http.client.HTTPException):
                    pass  # either side went away: nothing more to pass on
                finally:
                    conn.close()
                    owner.forwarded += 1

            def _card(self, resp: http.client.HTTPResponse) -> None:
                body = _replace(resp.read().decode(), owner.rewrite).encode()
                self.send_response(resp.status)
                for k, v in _kept(resp.getheaders(), {"content-length"}):
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _forward

        self.forwarded = 0
        self.rewrite = dict(rewrite or {})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}{path}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> BearerProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _kept(headers: list[tuple[str, str]], drop: set[str] | None = None) -> list[tuple[str, str]]:
    """The response headers the proxy passes on (its own and the hop-by-hop ones dropped)."""
    gone = _HOP | _OWN | (drop or set())
    return [(k, v) for k, v in headers if k.lower() not in gone]


def _replace(text: str, table: dict[str, str]) -> str:
    for old, new in table.items():
        text = text.replace(old, new)
    return text
