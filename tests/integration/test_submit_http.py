"""Submit over HTTP: the round-trip budget and concurrent duplicate submits."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from fabric.cards import CardSet, load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from tests.conftest import ROOT, make_fabric


def _submit_same_key(url: str, token: str, cache: str, barrier: object, out: object) -> None:
    import os

    os.environ["XDG_CACHE_HOME"] = cache
    settings = Settings(board_url=url, board_token=token, cards_dir=ROOT / "cards")
    fab = Fabric.connect(
        settings, cards=load_cards(ROOT / "cards", base_dir=ROOT), port=KanboardClient(url, token)
    )
    barrier.wait()  # type: ignore[attr-defined]
    r = fab.submit("morning briefing", target="kimi", key="cron:briefing:2026-11-30")
    out.put((r.task_id, r.created))  # type: ignore[attr-defined]


def test_two_cron_firings_at_once_make_one_task(
    embedded_board: EmbeddedBoard, cards: CardSet, tmp_path: Path
) -> None:
    fab = make_fabric(KanboardClient(embedded_board.url, embedded_board.token), cards)
    ctx = mp.get_context("spawn")
    for trial in range(3):
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [
            ctx.Process(
                target=_submit_same_key,
                args=(embedded_board.url, embedded_board.token, str(tmp_path / f"c{trial}{i}"), barrier, out),
            )
            for i in range(4)
        ]
        for p in procs:
            p.start()
        results = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        ids = {tid for tid, _ in results}
        assert len(ids) == 1, results
        # The first trial creates exactly one task; later trials reuse the key, and the
        # receipt holds across time too: nobody creates.
        assert sum(created for _, created in results) == (1 if trial == 0 else 0)
    assert len(fab.listing()) == 1


def test_submit_costs_two_round_trips_over_http(http_fabric: Fabric) -> None:
    http_fabric.port.stats.reset()
    http_fabric.submit("count my trips", target="kimi")
    assert http_fabric.port.stats.trips == 2
    http_fabric.port.stats.reset()
    http_fabric.submit("count my trips with a key", target="kimi", key="k-1")
    assert http_fabric.port.stats.trips == 2
