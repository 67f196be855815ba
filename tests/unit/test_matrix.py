"""The Matrix channel against a loopback homeserver that checks the real request."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import pytest

from fabric.cards import CardSet
from fabric.cards import MatrixChannel as MatrixSpec
from fabric.cards.schema import Channel as ChannelSpec
from fabric.errors import ConfigError
from keeper.matrix import MatrixNotifier, MatrixSendError
from keeper.notify import Channel

ROOM = "!alvis-inbox:matrix.home.arpa"
TOKEN = "syt_test_token"  # test value, not a secret


class Homeserver:
    """Records every request; answers from a script of (status, body), then 200."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: list[tuple[int, dict[str, Any]]] = []
        home = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                home.requests.append(
                    {
                        "method": "PUT",
                        "path": self.path,
                        "auth": self.headers.get("Authorization"),
                        "type": self.headers.get("Content-Type"),
                        "json": json.loads(body),
                    }
                )
                status, reply = (
                    home.script.pop(0) if home.script else (200, {"event_id": f"$ev{len(home.requests)}"})
                )
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def homeserver() -> Iterator[Homeserver]:
    hs = Homeserver()
    yield hs
    hs.close()


def test_it_has_the_keepers_channel_shape() -> None:
    ch: Channel = MatrixNotifier("https://matrix.example", ROOM, TOKEN)
    assert callable(ch.send)


def channel(hs: Homeserver, **kw: Any) -> MatrixNotifier:
    sleeps: list[float] = []
    ch = MatrixNotifier(hs.url, ROOM, TOKEN, sleep=sleeps.append, **kw)
    ch.sleeps = sleeps  # type: ignore[attr-defined]
    return ch


PREFIX = "/_matrix/client/v3/rooms/%21alvis-inbox%3Amatrix.home.arpa/send/m.room.message/"


def test_a_message_is_one_put_with_the_bearer_token_and_an_m_text_body(homeserver: Homeserver) -> None:
    ch = channel(homeserver)
    ch.send("Gate: approve tainted input", "researcher's notes → adolf", urgent=True, ref="task:42")
    assert ch.last_event_id == "$ev1"
    [req] = homeserver.requests
    assert req["method"] == "PUT" and req["path"].startswith(PREFIX)
    txn = unquote(req["path"][len(PREFIX) :])
    assert txn and "/" not in txn
    assert req["auth"] == f"Bearer {TOKEN}" and req["type"] == "application/json"
    body = req["json"]
    assert body["msgtype"] == "m.text"
    assert body["body"] == "[urgent] Gate: approve tainted input\n\nresearcher's notes → adolf\n\ntask:42"
    assert body["format"] == "org.matrix.custom.html"
    assert body["formatted_body"].startswith("<b>[urgent] Gate: approve tainted input</b>")
    assert "researcher&#x27;s notes" in body["formatted_body"]


def test_each_message_has_its_own_txn_id_and_a_retry_keeps_it(homeserver: Homeserver) -> None:
    ch = channel(homeserver)
    ch.send("one", "", urgent=False, ref=None)
    ch.send("two", "", urgent=False, ref=None)
    first, second = (r["path"] for r in homeserver.requests)
    assert first != second
    homeserver.requests.clear()
    homeserver.script = [(502, {}), (429, {"errcode": "M_LIMIT_EXCEEDED", "retry_after_ms": 1500})]
    ch.send("three", "body", urgent=False, ref=None)
    assert ch.last_event_id == "$ev3"
    paths = {r["path"] for r in homeserver.requests}
    assert len(homeserver.requests) == 3 and len(paths) == 1, "the same txn id on every retry"
    assert ch.sleeps[-1] >= 1.5  # type: ignore[attr-defined]  # honours retry_after_ms
    assert all(s <= 5.0 for s in ch.sleeps)  # type: ignore[attr-defined]  # bounded


def test_a_refusal_is_final_and_retries_are_bounded(homeserver: Homeserver) -> None:
    ch = channel(homeserver)
    homeserver.script = [(403, {"errcode": "M_FORBIDDEN", "error": "not in room"})]
    with pytest.raises(MatrixSendError, match="HTTP 403 M_FORBIDDEN"):
        ch.send("x", "", urgent=False, ref=None)
    assert len(homeserver.requests) == 1
    homeserver.requests.clear()
    homeserver.script = [(500, {})] * 10
    with pytest.raises(MatrixSendError, match="HTTP 500"):
        ch.send("x", "", urgent=False, ref=None)
    assert len(homeserver.requests) == 4 and len({r["path"] for r in homeserver.requests}) == 1


def test_an_unreachable_homeserver_fails_after_the_retries() -> None:
    ch = MatrixNotifier("http://127.0.0.1:9", ROOM, TOKEN, sleep=lambda s: None, attempts=2, timeout=0.5)
    with pytest.raises(MatrixSendError, match="ConnectionError"):
        ch.send("x", "", urgent=False, ref=None)


def test_the_channel_comes_from_a_human_card_and_its_token_env(
    cards: CardSet, homeserver: Homeserver
) -> None:
    human = cards.get("alvis").human
    assert human is not None
    spec = next(c for c in human.channels if isinstance(c, MatrixSpec))
    with pytest.raises(ConfigError, match="AGAP_MATRIX_TOKEN is not set"):
        MatrixNotifier.from_spec(spec, env={})
    ch = MatrixNotifier.from_spec(spec, env={"AGAP_MATRIX_TOKEN": TOKEN})
    assert ch.room == ROOM and ch.homeserver == "https://matrix.home.arpa" and ch.token == TOKEN
    assert TOKEN not in repr(ch)
    local = MatrixNotifier.from_spec(
        replace(spec, homeserver=homeserver.url),
        env={"AGAP_MATRIX_TOKEN": TOKEN},
        sleep=lambda s: None,
    )
    local.send("hello", "", urgent=False, ref=None)
    assert homeserver.requests[0]["auth"] == f"Bearer {TOKEN}"


def test_the_keeper_notifies_a_human_over_matrix(cards: CardSet, homeserver: Homeserver) -> None:
    from fabric.cards import CardSet as Cards
    from keeper.notify import Notifier

    alvis = cards.get("alvis")
    assert alvis.human is not None
    matrix: list[ChannelSpec] = [
        replace(c, homeserver=homeserver.url) for c in alvis.human.channels if isinstance(c, MatrixSpec)
    ]
    local = replace(alvis, human=replace(alvis.human, channels=matrix))
    notifier = Notifier(
        Cards([local, *[c for c in cards if c.id != "alvis"]]), env={"AGAP_MATRIX_TOKEN": TOKEN}
    )
    assert notifier.notify("alvis", "Gate waiting", "Approve the purchase?", urgent=True, ref="task:12")
    (req,) = homeserver.requests
    assert req["auth"] == f"Bearer {TOKEN}" and req["json"]["msgtype"] == "m.text"
    assert req["json"]["body"].startswith("[urgent] Gate waiting")
    # Without the token the channel is skipped with a warning, not a crash.
    quiet = Notifier(Cards([local]), env={})
    assert not quiet.notify("alvis", "x", "y", urgent=False)
