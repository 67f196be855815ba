"""Fixtures shared by the unit, integration and contract suites."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from fabric.cards import CardSet, load_cards
from fabric.core import Fabric
from fabric.embedded.local import LocalPort
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.bootstrap import init_board
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.port import RpcPort
from fabric.kanboard.taskboard import TaskBoard
from fabric.kanboard.weblinks import links_for
from fabric.ledger import Ledger
from fabric.settings.resolve import Settings

ROOT = Path(__file__).resolve().parent.parent

# Property tests judge what an example does, never how long it took: a per-example
# deadline fails on a busy machine (`make test-stress`), so there is none. A test's own
# @settings still narrows the rest.
settings.register_profile("agap", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("agap")


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# A test reads its own variables, never the fabric's: a shell that points KANBOARD_URL at a
# household's Kanboard (as the README's tour does) must not send a single test there.
TEST_VARS = "AGAP_TEST_"
REAL_URL = "AGAP_TEST_KANBOARD_URL"  # the .../jsonrpc.php URL of a scratch Kanboard
REAL_TOKEN = "AGAP_TEST_KANBOARD_TOKEN"  # its application token
REAL_FLAVOUR = "AGAP_TEST_KANBOARD_FLAVOUR"  # its database: sqlite, postgres or mysql
# The project a real board must hold (or be empty) before a test writes to it.
SCRATCH_MARK = "agap-tests scratch board"


def pytest_configure(config: pytest.Config) -> None:
    # Nothing of the caller's fabric settings reaches a test or the processes it starts:
    # KANBOARD_* and AGAP_* (but AGAP_TEST_*) go, and no .agap.env is read.
    for key in list(os.environ):
        if key.startswith(("KANBOARD_", "AGAP_")) and not key.startswith(TEST_VARS):
            del os.environ[key]
    empty = Path(tempfile.gettempdir()) / "agap-tests-empty.env"
    empty.touch()
    os.environ["AGAP_ENV_FILE"] = str(empty)  # named, it is the only env file


def pytest_sessionstart(session: pytest.Session) -> None:
    # The NATS streams earlier runs left are deleted once, by the process that starts the
    # run: under pytest-xdist that is the controller, before any worker runs a test (a
    # worker sweeping would delete the live streams of another worker's tests).
    if hasattr(session.config, "workerinput"):
        return
    # Imported here: only a run that starts sessions needs the broker helpers (nats).
    from tests.integration.test_events_helpers import sweep_before_the_session

    sweep_before_the_session()


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # The layout cache lives under XDG_CACHE_HOME: never share it between tests.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def cards_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the repository's cards folder (souls beside it), with a cache of its own
    at ``tmp_path/cache`` (where fabric.cardcache keeps its snapshot)."""
    shutil.copytree(ROOT / "cards", tmp_path / "repo" / "cards")
    shutil.copytree(ROOT / "souls", tmp_path / "repo" / "souls")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "repo" / "cards"


@pytest.fixture(scope="session")
def cards() -> CardSet:
    return load_cards(ROOT / "cards", base_dir=ROOT)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_fabric(
    port: RpcPort, cards: CardSet, clock: Callable[[], float] | None = None, settings: Settings | None = None
) -> Fabric:
    """Bootstrap a board through ``port`` and return a connected :class:`Fabric`."""
    settings = settings or Settings(cards_dir=ROOT / "cards", board_url="local://", board_token="x")
    report = init_board(port, settings, cards)
    assert report.layout is not None
    clk = clock or time.time
    links = links_for(settings.board_url, settings.web_url)
    board = TaskBoard(port, report.layout, clock=clk, secret=settings.board_token, links=links)
    return Fabric(settings, cards, port, board, Ledger(board, clock=clk), clk)


@pytest.fixture
def local_fabric(cards: CardSet, clock: FakeClock) -> Fabric:
    """A fabric over the in-process board (no socket), on a fake clock."""
    return make_fabric(LocalPort(clock=clock), cards, clock)


@pytest.fixture
def embedded_board(tmp_path: Path) -> Iterator[EmbeddedBoard]:
    """The embedded board over real HTTP on an ephemeral loopback port."""
    with EmbeddedBoard(tmp_path / "board.sqlite3") as board:
        yield board


@pytest.fixture
def http_fabric(embedded_board: EmbeddedBoard, cards: CardSet) -> Fabric:
    """A fabric talking HTTP to the embedded board, on the real clock."""
    settings = Settings(
        board_url=embedded_board.url, board_token=embedded_board.token, cards_dir=ROOT / "cards"
    )
    return make_fabric(KanboardClient(embedded_board.url, embedded_board.token), cards, settings=settings)


def real_kanboard() -> tuple[str, str] | None:
    """(url, token) of the scratch Kanboard named by AGAP_TEST_KANBOARD_URL and _TOKEN."""
    url, token = os.environ.get(REAL_URL), os.environ.get(REAL_TOKEN)
    return (url, token) if url and token else None


REAL_SKIP = (
    f"{REAL_URL} / {REAL_TOKEN} not set: name a scratch Kanboard with them to run this on a "
    "real one (KANBOARD_URL is never used by a test)"
)


def scratch_board(url: str, token: str) -> None:
    """Refuse a real Kanboard that holds projects the tests did not make.

    A board is a test's to write on when it is empty (it is marked then) or carries the
    mark; anything else fails the test with one line, having written nothing.
    """
    client = KanboardClient(url, token, timeout=30)
    try:
        names = sorted(str(p.get("name", "")) for p in client.call("getAllProjects") or [])
        if SCRATCH_MARK in names:
            return
        if names:
            shown = ", ".join(names[:5]) + (" …" if len(names) > 5 else "")
            pytest.fail(
                f"{url} holds projects the tests did not make ({shown}): the tests write only "
                f"to an empty Kanboard or one they marked; point {REAL_URL} at a scratch one",
                pytrace=False,
            )
        client.call("createProject", {"name": SCRATCH_MARK})
    finally:
        client.close()
