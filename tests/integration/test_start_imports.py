"""What `agap claim`, `agap heartbeat` and a worker import when they run, against a board:
neither pydantic nor yaml once a first call has checked the cards and remembered them
(fabric.cardcache; `agap up` does it before it starts its workers). Checking card files is
what imports both. Each run is a process of its own, as a shell loop's call is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fabric.cards import CardSet
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import ROOT, make_fabric
from tests.helpers import board_env

_PROBE = """
import json, sys
from fabric.apps.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("pydantic", "yaml"))))
"""


def _run(env: dict[str, str], *args: str) -> tuple[list[str], set[str]]:
    """``agap ARGS`` in a process of its own: its output lines, and the heavy modules it imported."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    *out, mods = done.stdout.strip().splitlines()
    return out, set(json.loads(mods))


def test_claim_heartbeat_and_a_worker_import_neither_pydantic_nor_yaml(
    embedded_board: EmbeddedBoard, cards: CardSet, tmp_path: Path
) -> None:
    board = embedded_board
    env = {**os.environ, **board_env(board.url, board.token, ROOT / "cards", tmp_path, AGAP_WORKER_ID="loop")}
    env.pop("AGAP_EVENTS_URL", None)
    _run(env, "init")
    out, checked = _run(env, "claim", "--agent", "claude-coder", "--json")
    assert json.loads("\n".join(out))["task_id"] is None
    assert {"pydantic", "yaml"} <= checked  # the loop's first call checked the cards, and remembered them
    settings = Settings(board_url=board.url, board_token=board.token, cards_dir=ROOT / "cards")
    fab = make_fabric(KanboardClient(board.url, board.token), cards, settings=settings)

    held = fab.submit("held by a shell loop", target="claude-coder").task_id
    out, mods = _run(env, "claim", "--agent", "claude-coder", "--json")
    assert not mods, mods
    claimed = json.loads("\n".join(out))
    assert claimed["task_id"] == held
    _, mods = _run(env, "heartbeat", str(held), "--epoch", str(claimed["epoch"]))
    assert not mods, mods

    done = fab.submit("answered by a worker", target="kimi").task_id  # kimi's runtime: demo
    _, mods = _run(env, "worker", "--agent", "kimi", "--drain")
    assert not mods, mods
    current = fab.board.read(done).current
    assert current is not None and current.state == State.DONE
