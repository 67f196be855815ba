"""Small helpers shared by the integration tests."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.embedded.store import hash_password
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.layout import Column
from fabric.people import find_person
from workers.loop import Worker

CARDS = Path(__file__).resolve().parents[1] / "cards"
#: The Kanboard password :func:`signed_in` gives a test's people.
PERSON_PASSWORD = "a-person-signs-in"


def wait_until(
    check: Callable[[], Any],
    timeout: float = 20.0,
    what: str = "",
    ignoring: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``check`` until it returns something truthy (returned), or fail after ``timeout``.

    Exceptions listed in ``ignoring`` count as "not yet" (e.g. a board that is down).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except ignoring:
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or check}")


class Lines:
    """A subprocess's output read line by line in a thread: wait on what it says, never on time.

    Readiness signals ("subscribed", "waiting for the board") are lines; :meth:`wait_for`
    waits (bounded) until one appears. Read stdout and stderr each with their own.
    """

    def __init__(self, stream: IO[str] | None) -> None:
        assert stream is not None, "start the process with this stream piped"
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._lock:
                self.lines.append(line)

    def matching(self, text: str) -> list[str]:
        with self._lock:
            return [line for line in self.lines if text in line]

    def wait_for(self, text: str, timeout: float = 30.0, count: int = 1) -> list[str]:
        """The lines containing ``text`` once there are ``count`` of them (fails after ``timeout``)."""
        try:
            found: list[str] = wait_until(
                lambda: (m := self.matching(text)) and len(m) >= count and m,
                timeout,
                f"{count} line(s) with {text!r}",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the process said:\n{self.text()[-3000:]}") from None
        return found

    def text(self) -> str:
        with self._lock:
            return "".join(self.lines)

    def close(self, timeout: float = 10.0) -> str:
        """Everything read, once the stream ended (call after the process exited)."""
        self._thread.join(timeout)
        return self.text()


class Running:
    """A worker running in a thread for the duration of a ``with`` block."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *exc: object) -> None:
        self.worker.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the worker did not stop"


def drain(worker: Worker, timeout: float = 60.0) -> None:
    """Run a worker built with ``drain=True`` until its queue is empty (bounded)."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        worker.stop.set()
        thread.join(10)
        raise AssertionError(f"the worker of {worker.config.queue} did not drain its queue")


def board_env(url: str, token: str, cards_dir: Path, state_dir: Path, **more: str) -> dict[str, str]:
    """The settings a CLI call or a worker needs for one test's board, cards and state
    (results in files under the state directory), plus ``more``."""
    return {
        "KANBOARD_URL": url,
        "KANBOARD_API_TOKEN": token,
        "AGAP_CARDS_DIR": str(cards_dir),
        "AGAP_STATE_DIR": str(state_dir),
        "XDG_CACHE_HOME": str(state_dir / "cache"),
        "AGAP_RESULT_STORE": "dir",
        "AGAP_RESULT_DIR": str(state_dir / "results"),
        "AGAP_POLL_SECONDS": "0.05",
        **more,
    }


def cli_env(url: str, token: str, tmp: Path, cards_dir: Path, **more: str) -> dict[str, str]:
    """The settings an ``agap`` call needs for one test's board: its URL and token, the
    cards, a cache of its own, plus ``more`` (``AGAP_ACTOR``, …)."""
    return {
        "KANBOARD_URL": url,
        "KANBOARD_API_TOKEN": token,
        "AGAP_CARDS_DIR": str(cards_dir),
        "XDG_CACHE_HOME": str(tmp / "cache"),
        **more,
    }


def signed_in(board: EmbeddedBoard, person: str = "alvis", cards_dir: Path = CARDS) -> dict[str, str]:
    """``AGAP_USER`` and ``AGAP_USER_PASSWORD`` that sign ``person`` (a human card id) in on
    ``board``: their Kanboard user is made with :data:`PERSON_PASSWORD` (``agap init`` then
    adopts it), or given that password if it exists (as an admin does in Kanboard's UI)."""
    card = find_person(load_cards(cards_dir, base_dir=CARDS.parent), person)
    assert card is not None and card.human is not None, f"{person} is no person of {cards_dir}"
    username = card.human.username
    with board.store.write() as db:
        found = db.execute(
            "UPDATE users SET password = ? WHERE username = ?", (hash_password(PERSON_PASSWORD), username)
        ).rowcount
    if not found:
        app = KanboardClient(board.url, board.token)
        try:
            assert app.call(
                "createUser", {"username": username, "password": PERSON_PASSWORD, "name": username}
            )
        finally:
            app.close()
    return {"AGAP_USER": username, "AGAP_USER_PASSWORD": PERSON_PASSWORD}


def sign_in_people(board: EmbeddedBoard, cards_dir: Path = CARDS) -> None:
    """Give every person of ``cards_dir`` a Kanboard user on ``board`` with
    :data:`PERSON_PASSWORD` (:func:`signed_in`), so that :func:`acting_as` signs them in."""
    for card in load_cards(cards_dir, base_dir=CARDS.parent).humans():
        signed_in(board, card.id, cards_dir)


def acting_as(actor: str, cards_dir: Path = CARDS) -> dict[str, str]:
    """The settings a CLI call by ``actor`` needs: ``AGAP_ACTOR``, and for a person their
    sign-in with :data:`PERSON_PASSWORD` (see :func:`sign_in_people`); an agent keeps its
    card identity."""
    card = find_person(load_cards(cards_dir, base_dir=CARDS.parent), actor)
    if card is None or card.human is None:
        return {"AGAP_ACTOR": actor, "AGAP_USER": ""}
    return {"AGAP_ACTOR": actor, "AGAP_USER": card.human.username, "AGAP_USER_PASSWORD": PERSON_PASSWORD}


class UpShell:
    """The second shell the `agap up` banner sets up: its KANBOARD_URL and token, and
    `agap … --json` run there (what the tour's reader types)."""

    def __init__(self, banner: str, env: dict[str, str]) -> None:
        url = re.search(r"export KANBOARD_URL=(\S+)", banner)
        token = re.search(r"export KANBOARD_API_TOKEN=(\S+)", banner)
        assert url and token, banner
        self.env = {**env, "KANBOARD_URL": url.group(1), "KANBOARD_API_TOKEN": token.group(1)}

    def agap(self, *args: str) -> dict[str, object]:
        out = subprocess.run(
            [sys.executable, "-m", "fabric.apps.cli", *args, "--json"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    def until_state(self, task_id: object, state: str, timeout: float = 60.0) -> dict[str, object]:
        """``agap show`` of the task once it is in ``state`` (its last view if it never is)."""
        shown: dict[str, object] = {}

        def there() -> bool:
            shown.clear()
            shown.update(self.agap("show", str(task_id)))
            return shown.get("state") == state

        with contextlib.suppress(AssertionError):
            wait_until(there, timeout, f"task {task_id} to be {state}")
        return shown


def card_row(fab: Fabric, tid: int) -> dict[str, Any]:
    """A card's row as Kanboard answers ``getTask``."""
    r = fab.port.call("getTask", {"task_id": tid})
    assert isinstance(r, dict)
    return r


def card_column(fab: Fabric, tid: int) -> Column:
    """The fabric column a card sits in."""
    cid = int(card_row(fab, tid)["column_id"])
    return next(c for c, i in fab.board.layout.columns.items() if i == cid)
