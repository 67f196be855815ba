"""Kanboard's webhook to the keeper's receiver: a person's gesture is acted on at once.

The embedded board calls its webhook as Kanboard does (the same payload, ``?token=``,
synchronously in the person's request); the keeper's receiver answers at once and pokes
the gesture job, whose own interval here is far too long to be what acted.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import requests

from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.errors import ConfigError
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.keeperstore import published_hooks
from fabric.kanboard.layout import META_HOOK, Column
from fabric.kanboard.principals import home_settings
from fabric.settings.keeper import KeeperConfig
from fabric.task import State
from keeper.daemon import Keeper
from keeper.hook import HomeRoutes, HookServer
from tests.helpers import wait_until

TOKEN = "hook-secret-1"
PASSWORD = "g-person-pass"


class Recorder:
    """Counts the keeper's pokes (the receiver calls it off the request)."""

    def __init__(self) -> None:
        self.pokes = 0

    def __call__(self) -> None:
        self.pokes += 1


class Capture(HookServer):
    """A receiver that keeps every payload it is sent, in ``seen``."""

    def __init__(self, seen: list[dict[str, Any]]) -> None:
        super().__init__(lambda: None, token=TOKEN)
        self.seen = seen

    def received(self, payload: Any) -> None:
        self.seen.append(payload)


def person(fab: Fabric, board: EmbeddedBoard, name: str) -> KanboardClient:
    """A project member signed in with a password: the board as Kanboard's UI shows it to them."""
    uid = fab.port.call("createUser", {"username": name, "password": PASSWORD, "name": name.title()})
    assert fab.port.call("addProjectUser", {"project_id": fab.board.layout.project_id, "user_id": uid})
    return KanboardClient(board.url, PASSWORD, user=name)


@pytest.fixture
def keeper_with_hook(
    http_fabric: Fabric, embedded_board: EmbeddedBoard
) -> Iterator[tuple[Keeper, HookServer]]:
    cfg = KeeperConfig()
    slow = {job: 3600.0 for job in cfg.intervals}  # no sweep will come in time: only a poke can
    keeper = Keeper.for_fabric(http_fabric, replace(cfg, intervals=slow, move_tolerance=5.0))
    stop = threading.Event()
    with HookServer(keeper.poke, token=TOKEN, ignore=["kimi"]) as hook:
        embedded_board.set_webhook(hook.url + "kanboard", TOKEN)
        t = threading.Thread(target=keeper.serve, args=(stop,), daemon=True)
        t.start()
        wait_until(lambda: keeper._sched is not None, timeout=10, what="the keeper's scheduler")
        yield keeper, hook
        stop.set()
        t.join(10)


def test_a_persons_move_is_acted_on_within_a_second(
    http_fabric: Fabric, embedded_board: EmbeddedBoard, keeper_with_hook: tuple[Keeper, HookServer]
) -> None:
    fab = http_fabric
    _, hook = keeper_with_hook
    tid = fab.submit("summarise the week", target="kimi").task_id
    lease = fab.ledger.claim(fab.board.read(tid), "w1", lease_seconds=300)
    fab.ledger.fail(lease, "it broke", poison=True)  # a dead letter: any person may revive it
    assert hook.events == 0, "the fabric's own calls (no author) poke nothing"
    g = person(fab, embedded_board, "g_person")
    layout = fab.board.layout
    assert g.call(
        "moveTaskPosition",
        {
            "project_id": layout.project_id,
            "task_id": tid,
            "column_id": layout.columns[Column.QUEUED],
            "position": 1,
            "swimlane_id": layout.swimlanes["kimi"],
        },
    )

    def revived() -> Any:
        cur = fab.board.read(tid).current
        return cur is not None and cur.state == State.QUEUED and cur.op == "revive"

    # Every sweep is an hour apart here, so only the webhook can have acted in time; how
    # fast it acts is measured in bench/gestures.py (about 20 ms), not asserted here.
    wait_until(revived, timeout=30, what="the keeper to revive the task")
    assert hook.events >= 1
    cur = fab.board.read(tid).current
    assert cur is not None and cur.by == "g_person"


def test_the_receiver_refuses_a_request_without_the_token() -> None:
    pokes = Recorder()
    with HookServer(pokes, token=TOKEN) as hook:
        assert hook.url.startswith("http://127.0.0.1:"), "loopback unless told otherwise"
        body = {"event_name": "task.close", "event_data": {}, "event_author": "alvis"}
        for url in (hook.url, hook.url + "?token=wrong"):
            assert requests.post(url, json=body, timeout=5).status_code == 401
        assert pokes.pokes == 0 and hook.events + hook.ignored == 0, "refused before the body is read"
        ok = requests.post(hook.url + "?token=" + TOKEN, data=json.dumps(body), timeout=5)
        assert ok.status_code == 200
        # The receiver answers first and handles the event after: wait for it to be counted.
        wait_until(lambda: hook.events + hook.ignored == 1, timeout=10, what="the event handled")
        assert pokes.pokes == 1
        unsigned = dict(body, event_author=None)  # the application token: nobody's gesture
        assert requests.post(hook.url + "?token=" + TOKEN, json=unsigned, timeout=5).status_code == 200
        wait_until(lambda: hook.events + hook.ignored == 2, timeout=10, what="the second event handled")
        assert pokes.pokes == 1 and hook.ignored == 1


def test_the_receiver_will_not_start_without_a_token() -> None:
    with pytest.raises(ConfigError, match="needs a token"):
        HookServer(Recorder(), token="")


def test_the_embedded_board_posts_what_kanboard_posts(
    http_fabric: Fabric, embedded_board: EmbeddedBoard
) -> None:
    seen: list[dict[str, Any]] = []
    with Capture(seen) as hook:
        # A URL with a query already: Kanboard appends "&token=", and the receiver checks it.
        embedded_board.set_webhook(hook.url + "hook?x=1", TOKEN)
        g = person(http_fabric, embedded_board, "g_poster")
        tid = http_fabric.submit("a card to close", target="kimi").task_id
        assert g.call("closeTask", {"task_id": tid})
    names = [p["event_name"] for p in seen]
    assert "task.create" in names and "task.close" in names
    close = next(p for p in seen if p["event_name"] == "task.close")
    assert set(close) == {"event_name", "event_data", "event_author"}
    assert close["event_author"] == "g_poster"
    assert close["event_data"]["task_id"] == tid and close["event_data"]["task"]["id"] == tid
    create = next(p for p in seen if p["event_name"] == "task.create")
    assert create["event_author"] is None, "the application token has no author"


def test_a_home_projects_gesture_is_forwarded_to_its_keeper_and_acted_on_at_once(
    http_fabric: Fabric, embedded_board: EmbeddedBoard
) -> None:
    """Kanboard has one webhook URL: the main keeper's receiver. A person's move on a card
    in torgash's home is forwarded to the home's keeper (at the receiver it published),
    whose sweeps are an hour apart here: only the forward can have acted in time."""
    fab = http_fabric
    card = fab.cards.get("torgash")
    cfg = KeeperConfig()
    slow = replace(cfg, intervals={job: 3600.0 for job in cfg.intervals}, move_tolerance=5.0)
    home_fab = Fabric.connect(home_settings(fab.settings, card), cards=fab.cards)
    home_keeper = Keeper(slow, lambda: home_fab)
    main_keeper = Keeper.for_fabric(fab, slow)
    main_pokes = Recorder()
    lookups: list[int] = []

    def lookup() -> dict[int, str]:
        lookups.append(1)
        return published_hooks(KanboardClient(embedded_board.url, embedded_board.token), fab.board.layout)

    routes = HomeRoutes(lookup, token=TOKEN, main_project=lambda: fab.board.layout.project_id, refresh=0.0)
    stop = threading.Event()
    with (
        HookServer(home_keeper.poke, token=TOKEN) as home_hook,
        HookServer(main_pokes, token=TOKEN, route=routes) as main_hook,
    ):
        home_keeper.hook_url = home_hook.url
        embedded_board.set_webhook(main_hook.url, TOKEN)
        t = threading.Thread(target=home_keeper.serve, args=(stop,), daemon=True)
        t.start()
        try:
            wait_until(lambda: home_keeper._sched is not None, timeout=10, what="the home keeper's scheduler")
            assert home_fab.board.project_meta().get(META_HOOK) == home_hook.url, "published"
            tid = fab.submit("price a kettle", target="torgash").task_id
            lease = home_fab.ledger.claim(home_fab.board.read(tid), "w1", lease_seconds=300)
            home_fab.ledger.fail(lease, "it broke", poison=True)
            home = fab.board.layout.homes["torgash"]
            g = person(fab, embedded_board, "g_home")
            assert fab.port.call(
                "addProjectUser", {"project_id": home.project_id, "user_id": g.call("getMe")["id"]}
            )
            assert g.call(
                "moveTaskPosition",
                {
                    "project_id": home.project_id,
                    "task_id": tid,
                    "column_id": home.columns[Column.QUEUED],
                    "position": 1,
                    "swimlane_id": home.swimlanes["torgash"],
                },
            )

            def revived() -> Any:
                cur = fab.board.read(tid).current
                return cur is not None and cur.state == State.QUEUED and cur.op == "revive"

            wait_until(revived, timeout=30, what="the home's keeper to revive the task")
            assert main_hook.forwarded >= 1 and home_hook.events >= 1
            assert main_pokes.pokes == 0, "the main keeper was not woken for a home's card"
            cur = fab.board.read(tid).current
            assert cur is not None and cur.by == "g_home"
            # A card of the work project still pokes the main keeper, and looks nothing up.
            seen = len(lookups)
            other = fab.submit("summarise the week", target="kimi").task_id
            fab.port.call(
                "addProjectUser",
                {"project_id": fab.board.layout.project_id, "user_id": g.call("getMe")["id"]},
            )
            assert g.call("closeTask", {"task_id": other})
            wait_until(lambda: main_pokes.pokes >= 1, timeout=10, what="the main keeper poked")
            assert len(lookups) == seen
        finally:
            stop.set()
            t.join(10)
    del main_keeper


def test_a_forward_to_a_home_keeper_that_is_gone_pokes_the_main_keeper() -> None:
    pokes = Recorder()
    dead = "http://127.0.0.1:9/"  # nothing listens on the discard port
    routes = HomeRoutes(lambda: {7: dead}, token=TOKEN, main_project=lambda: 1, timeout=1.0, refresh=0.0)
    with HookServer(pokes, token=TOKEN, route=routes) as hook:
        body = {
            "event_name": "task.close",
            "event_data": {"task": {"project_id": 7}},
            "event_author": "alvis",
        }
        assert requests.post(hook.url + "?token=" + TOKEN, json=body, timeout=5).status_code == 200
        wait_until(lambda: pokes.pokes == 1, timeout=10, what="the main keeper poked instead")
        assert hook.forwarded == 0


def test_a_persons_edit_is_put_back_at_once(
    http_fabric: Fabric, embedded_board: EmbeddedBoard, keeper_with_hook: tuple[Keeper, HookServer]
) -> None:
    """An edit fires task.update with what changed; the receiver pokes, the keeper acts."""
    fab = http_fabric
    _, hook = keeper_with_hook
    tid = fab.submit("summarise the week", target="kimi", actor="alvis").task_id
    drawn = fab.board.read(tid).task.title
    g = person(fab, embedded_board, "g_editor")
    assert g.call("updateTask", {"id": tid, "title": "summarise the year"})
    wait_until(lambda: fab.board.read(tid).task.title == drawn, timeout=30, what="the title put back")
    assert hook.events >= 1
    lines = [c.text for c in fab.board.comments(tid) if c.user_id == 0 and "summarise the year" in c.text]
    assert len(lines) == 1 and lines[0].startswith("g_editor changed its title")


def test_the_embedded_board_posts_an_edit_with_what_changed(
    http_fabric: Fabric, embedded_board: EmbeddedBoard
) -> None:
    seen: list[dict[str, Any]] = []
    with Capture(seen) as hook:
        embedded_board.set_webhook(hook.url, TOKEN)
        g = person(http_fabric, embedded_board, "g_changer")
        tid = http_fabric.submit("a card to edit", target="kimi").task_id
        assert g.call("updateTask", {"id": tid, "priority": 3})
        me = g.call("getMe")["id"]
        assert g.call("updateTask", {"id": tid, "owner_id": me})
    mine = [p for p in seen if p["event_author"] == "g_changer"]
    assert [p["event_name"] for p in mine] == ["task.update", "task.assignee_change"]
    assert mine[0]["event_data"]["changes"] == {"priority": 3}
    assert mine[1]["event_data"]["changes"] == {"owner_id": me}
    assert mine[1]["event_data"]["task"]["assignee_username"] == "g_changer"


def test_a_move_to_another_project_pokes_the_main_keeper_and_names_the_card() -> None:
    """The event names the project the card landed in; a home's keeper is told (forwarded),
    and so is the main keeper, which may be the one whose card left."""
    pokes, moved = Recorder(), list[int]()
    with HookServer(pokes, token=TOKEN, route=lambda payload: True, moved=moved.append) as hook:
        body = {
            "event_name": "task.move.project",
            "event_data": {"task_id": 42, "task": {"id": 42, "project_id": 7}, "changes": []},
            "event_author": "alvis",
        }
        assert requests.post(hook.url + "?token=" + TOKEN, json=body, timeout=5).status_code == 200
        wait_until(lambda: pokes.pokes == 1, timeout=10, what="the main keeper poked")
        assert moved == [42] and hook.forwarded == 1
        close = dict(body, event_name="task.close")
        assert requests.post(hook.url + "?token=" + TOKEN, json=close, timeout=5).status_code == 200
        wait_until(lambda: hook.forwarded == 2, timeout=10, what="the close forwarded")
        assert pokes.pokes == 1 and moved == [42], "any other forwarded event pokes only its home"
