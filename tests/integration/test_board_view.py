"""The embedded board's read-only web page: auth, content, escaping, and a real browser.

The page is served by the board itself behind the API token. A board populated through
the fabric (submitted, claimed and parked work) must show every task with its state,
epoch, owner and priority, escape agent-written titles, and render in headless Chromium
(a screenshot that is the right size and not blank).
"""

from __future__ import annotations

import base64
import html
import os
import shutil
import struct
import subprocess
import time
import zlib
from pathlib import Path

import pytest
import requests

from fabric.apps.web import WebView
from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import Column
from fabric.settings.resolve import Settings
from tests.conftest import ROOT, make_fabric
from workers.queue import QueueReader

CHROMIUM = Path("/usr/bin/chromium")
EVIL = '<script>alert("x")</script> & <b>bold</b>'
WIDTH, HEIGHT = 1400, 900


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"jsonrpc:{token}".encode()).decode()}


def _page(board: EmbeddedBoard) -> str:
    return f"http://{board.host}:{board.port}/"


Viewed = tuple[EmbeddedBoard, Fabric, dict[str, int]]


@pytest.fixture
def viewed_board(embedded_board: EmbeddedBoard, cards: CardSet) -> Viewed:
    settings = Settings(
        board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=ROOT / "cards"
    )
    embedded_board.set_view(WebView(embedded_board.api, settings, refresh_seconds=30))
    fab = make_fabric(KanboardClient(embedded_board.url, embedded_board.token), cards, settings=settings)
    ids = {
        "plain": fab.submit("Summarise the week's notes", target="kimi").task_id,
        "urgent": fab.submit("Fix the backup alert", target="kimi", priority="urgent").task_id,
        "evil": fab.submit(EVIL, target="kimi", priority="high").task_id,
        "parked": fab.submit("Reflect on the garden bank", target="gemma-local").task_id,
    }
    lease = QueueReader.for_agent(fab, fab.cards.get("kimi")).claim_next("w1", lease_seconds=60)
    assert lease is not None
    ids["claimed"] = lease.task_id
    now = time.time()
    fab.board.publish_park(
        "gemma-local",
        {
            "queue": "gemma-local",
            "parked": True,
            "reason": "quota spent: 60 in 5h",
            "until": now + 7200,
            "since": now,
        },
    )
    return embedded_board, fab, ids


def test_page_needs_the_token(viewed_board: Viewed) -> None:
    board, _, _ = viewed_board
    bare = requests.get(_page(board), timeout=10)
    assert bare.status_code == 401
    assert bare.headers["WWW-Authenticate"] == 'Basic realm="JsonRPC"'
    assert requests.get(_page(board), headers=_auth("wrong"), timeout=10).status_code == 401
    assert requests.get(_page(board) + "board.json", timeout=10).status_code == 401


def test_page_shows_tasks_states_owners_and_parks(viewed_board: Viewed) -> None:
    board, fab, ids = viewed_board
    reply = requests.get(_page(board), headers=_auth(board.token), timeout=10)
    assert reply.status_code == 200
    assert reply.headers["Content-Type"].startswith("text/html")
    page = reply.text
    # Read-only and script-free: nothing to submit, nothing to run.
    assert "<form" not in page.lower() and "<script" not in page.lower()
    assert 'http-equiv="refresh"' in page
    # Agent-written text is escaped, never markup.
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in page
    for key in ("plain", "urgent", "parked"):
        assert html.escape(fab.show(ids[key]).row["title"]) in page
    claimed = fab.show(ids["claimed"])
    assert claimed.current is not None and claimed.current.state.value == "working"
    assert f'data-task="{ids["claimed"]}"' in page
    card = page.split(f'data-task="{ids["claimed"]}"', 1)[1].split('class="card ', 1)[0]
    assert "working" in card and f"epoch {claimed.epoch}" in card and "owner w1" in card
    queued = page.split(f'data-task="{ids["plain"]}"', 1)[1].split('class="card ', 1)[0]
    assert "queued" in queued and "epoch 0" in queued
    assert "urgent" in page
    for column in ("Queued", "Working", "Waiting on me", "Done", "Dead letter"):
        assert f"<th>{column}</th>" in page
    assert "Parked queues" in page and "gemma-local" in page and "quota spent: 60 in 5h" in page
    assert 'class="is-parked"' in page

    snap = requests.get(_page(board) + "board.json", headers=_auth(board.token), timeout=10).json()
    by_id = {t["id"]: t for t in snap["tasks"]}
    assert by_id[ids["claimed"]]["state"] == "working" and by_id[ids["claimed"]]["owner"] == "w1"
    assert by_id[ids["claimed"]]["epoch"] == 1 and by_id[ids["claimed"]]["column"] == "Working"
    assert by_id[ids["evil"]]["title"] == EVIL
    assert snap["parked"]["gemma-local"]["reason"] == "quota spent: 60 in 5h"
    assert {"kimi", "gemma-local"} <= set(snap["queues"])
    # A GET changed nothing on the board.
    assert fab.show(ids["claimed"]).epoch == claimed.epoch
    assert requests.get(_page(board) + "nope", headers=_auth(board.token), timeout=10).status_code == 404


def test_a_card_waiting_on_a_person_is_no_false_alarm(viewed_board: Viewed) -> None:
    """A keeper gate or decision card is queued for a person and shown in Waiting on me:
    its column agrees with its record, so the view flags nothing; a card a person really
    moved is still flagged."""
    board, fab, _ = viewed_board
    gate = fab.submit("Approve the purchase of a new router", target="alvis", actor="keeper").task_id
    moved = fab.submit("Summarise the garden log", target="kimi").task_id
    fab.board.port.call(
        "moveTaskPosition",
        {
            "project_id": fab.board.layout.project_id,
            "task_id": moved,
            "column_id": fab.board.layout.columns[Column.DONE],
            "position": 1,
            "swimlane_id": fab.show(moved).task.swimlane_id,
        },
    )
    # A queued card the keeper moved to Backlog (the overflow of a long queue) is in place.
    later = fab.submit("Sort the photo archive", target="kimi").task_id
    fab.board.move_cards([(later, Column.BACKLOG, fab.show(later).task.swimlane_id)])
    snap = requests.get(_page(board) + "board.json", headers=_auth(board.token), timeout=10).json()
    by_id = {t["id"]: t for t in snap["tasks"]}
    assert by_id[gate]["column"] == "Waiting on me" and by_id[gate]["moved"] is False
    assert by_id[later]["column"] == "Backlog" and by_id[later]["moved"] is False
    assert by_id[moved]["moved"] is True
    page = requests.get(_page(board), headers=_auth(board.token), timeout=10).text
    gate_card = page.split(f'data-task="{gate}"', 1)[1].split('class="card ', 1)[0]
    assert "moved by hand" not in gate_card
    assert "moved by hand" in page.split(f'data-task="{moved}"', 1)[1].split('class="card ', 1)[0]


def test_page_before_init_says_what_to_do(tmp_path: Path) -> None:
    with EmbeddedBoard(tmp_path / "fresh.sqlite3") as board:
        board.set_view(WebView(board.api, Settings()))
        reply = requests.get(_page(board), headers=_auth(board.token), timeout=10)
        assert reply.status_code == 200
        assert "agap init" in reply.text and "Agent Fabric" in reply.text


# -- the browser -----------------------------------------------------------------------


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode_png(data: bytes) -> tuple[int, int, list[bytes], int]:
    """(width, height, rows of raw pixel bytes, bytes per pixel) of an 8-bit RGB(A) PNG."""
    width, height, bpp, idat = _png_chunks(data)
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        line = _unfilter(raw[start], bytearray(raw[start + 1 : start + 1 + stride]), prev, bpp, stride)
        rows.append(bytes(line))
        prev = line
    return width, height, rows, bpp


def _png_chunks(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, bytes per pixel, the IDAT data) of an 8-bit RGB(A) PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, bpp = 8, b"", 0, 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    return width, height, bpp, idat


def _unfilter(ftype: int, line: bytearray, prev: bytearray, bpp: int, stride: int) -> bytearray:
    """One scanline with its PNG filter (none, sub, up, average, Paeth) undone."""
    if ftype == 1:
        for i in range(bpp, stride):
            line[i] = (line[i] + line[i - bpp]) & 0xFF
    elif ftype == 2:
        line = bytearray((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
    elif ftype == 3:
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
    elif ftype == 4:
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            upleft = prev[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + _paeth(left, prev[i], upleft)) & 0xFF
    return line


def test_headless_chromium_renders_the_board(viewed_board: Viewed, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        print("SKIP reason: /usr/bin/chromium is missing (CI installs it: apt-get install -y chromium)")
        pytest.skip("/usr/bin/chromium is missing; install it with `apt-get install -y chromium`")
    board, _, _ = viewed_board
    shot = tmp_path / "board.png"
    # Credentials in the URL: headless Chromium answers the 401 challenge with them.
    url = f"http://jsonrpc:{board.token}@{board.host}:{board.port}/"
    argv = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        f"--window-size={WIDTH},{HEIGHT}",
        url,
    ]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    keep = os.environ.get("AGAP_SCREENSHOT_DIR")
    if keep:  # for a human look at the page
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "board-view.png")
    width, height, rows, bpp = decode_png(shot.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    colours: set[bytes] = set()
    for row in rows[::3]:
        colours.update(row[i : i + 3] for i in range(0, len(row), bpp * 2))
    # A blank page or an error page has a handful of colours; the board has many
    # (badges, text antialiasing, the parked banner).
    assert len(colours) > 200, len(colours)
    # The parked banner's amber background (#fff4e5) and a working badge (#0065ff) are there.
    assert b"\xff\xf4\xe5" in colours
    assert b"\x00\x65\xff" in colours
