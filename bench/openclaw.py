"""A real OpenClaw gateway's cron firing → a task queued on the board, beside a shell.

The gateway (``openclaw gateway run``, the version ``integrations/openclaw/package.json``
pins, Node from the ``openclaw`` extra) runs a command automation on ``* * * * *``
(``--exact``: no stagger): ``integrations/openclaw/agap-slot``, which runs ``agap submit``
with the slot. One firing's latency is the task's first record (the fabric's clock at
submit) minus the planned minute. The baseline, in the same run: the same wrapper and
task from a shell (``sh -lc``, as OpenClaw runs it), its latency the first record minus
the moment the shell was started. What is left between the two is OpenClaw's own part
(its scheduler, its process handling).

Setup is :mod:`tests.openclaw_gateway`'s, shared with the OpenClaw tests: an embedded
board over loopback, the gateway in a home of its own, its settings in
``~/.config/agap/env``. Without Node or OpenClaw installed (the OpenClaw tests install
it into ``var/openclaw``) the section is skipped with the reason printed.
Run alone: ``python -m bench.openclaw [--quick]`` (quick: one firing; else three, one a
minute).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.settings.resolve import Settings
from fabric.slots import KEY_TIME
from tests.conftest import ROOT
from tests.openclaw_gateway import (
    WRAPPER,
    Gateway,
    GatewayFailed,
    Missing,
    Model,
    openclaw_command,
    prepare_home,
)

INTENT = "Water the plants"
TITLE = "OpenClaw cron firing → task queued (real gateway, loopback)"
FIRING_WAIT = 150.0  # seconds: a minute's firing, and OpenClaw's own start-up of the run


def _command(name: str) -> str:
    return f"{WRAPPER} {name} '* * * * *' UTC --target adolf --intent '{INTENT}'"


def _tasks(fab: Fabric, prefix: str) -> dict[str, float]:
    """Action id -> the time of the task's first record, for the keys under ``prefix``."""
    out: dict[str, float] = {}
    for row in fab.listing(include_closed=True):
        view = fab.show(int(row["id"]))
        spec, cur = view.spec, view.current
        if spec is not None and cur is not None and spec.action_id and spec.action_id.startswith(prefix):
            out[spec.action_id] = cur.at
    return out


def _planned(action_id: str) -> float:
    return datetime.strptime(action_id.rsplit("/", 1)[1], KEY_TIME).replace(tzinfo=UTC).timestamp()


def _firings(gw: Gateway, fab: Fabric, n: int) -> list[float]:
    """``n`` scheduled firings of one enabled job: each one's task minus its planned minute."""
    gw.cli("cron", "add", "--name", "bench-cron", "--cron", "* * * * *", "--tz", "UTC", "--exact",
           "--no-deliver", "--command", _command("bench-cron"))  # fmt: skip
    seen: dict[str, float] = {}
    deadline = time.monotonic() + FIRING_WAIT * n
    while len(seen) < n and time.monotonic() < deadline:
        time.sleep(0.5)  # a poll of the board, the measured value is the task's own record time
        seen.update(_tasks(fab, "openclaw/bench-cron/"))
    return [at - _planned(key) for key, at in sorted(seen.items())][:n]


def _shell(gw: Gateway, fab: Fabric, n: int) -> list[float]:
    """The same wrapper and task from a shell, ``n`` times: its task minus the shell's start."""
    out = []
    for i in range(n):
        name = f"bench-shell-{i}"
        start = time.time()
        subprocess.run(
            ["sh", "-lc", _command(name)], env=gw.env, cwd=gw.home, capture_output=True, check=True
        )
        (at,) = _tasks(fab, f"openclaw/{name}/").values()
        out.append(at - start)
    return out


def _ms(xs: list[float]) -> dict[str, Any]:
    return {
        "n": len(xs),
        "p50_ms": round(statistics.median(xs) * 1000, 1) if xs else None,
        "max_ms": round(max(xs) * 1000, 1) if xs else None,
    }


def run(quick: bool) -> dict[str, Any]:
    n = 1 if quick else 3
    try:
        cmd = openclaw_command(install=False)
    except Missing as exc:
        print(f"bench.openclaw: skipped: {exc}", flush=True)
        return {"title": TITLE, "rows": [["skipped", str(exc)]], "data": {}}
    with (
        tempfile.TemporaryDirectory(prefix="agap-bench-openclaw-") as tmp,
        EmbeddedBoard(Path(tmp) / "board.sqlite3") as board,
    ):
        model = Model({}).start()
        gw = prepare_home(cmd, board.url, board.token, Path(tmp), model.url)
        settings = Settings(board_url=board.url, board_token=board.token, cards_dir=ROOT / "cards")
        fab = Fabric.connect(settings, cards=load_cards(ROOT / "cards", base_dir=ROOT))
        try:
            started = time.monotonic()
            gw.start()
            ready = time.monotonic() - started
            shell = _shell(gw, fab, max(n, 3))
            cron = _firings(gw, fab, n)
        except GatewayFailed as exc:
            return {
                "title": "OpenClaw cron firing → task queued",
                "rows": [["failed", str(exc)[:300]]],
                "data": {},
            }
        finally:
            gw.stop()
            model.stop()
    data: dict[str, Any] = {
        "gateway_ready_s": round(ready, 1),
        "cron": _ms(cron),
        "shell": _ms(shell),
        "firings": n,
    }
    rows: list[list[Any]] = [
        ["gateway start to ready (s)", data["gateway_ready_s"]],
        ["OpenClaw cron firing → task queued, p50 / max ms (firings)",
         f"{data['cron']['p50_ms']} / {data['cron']['max_ms']} ({len(cron)} of {n})"],
        ["baseline: the same wrapper from a shell → task queued, p50 / max ms (runs)",
         f"{data['shell']['p50_ms']} / {data['shell']['max_ms']} ({len(shell)})"],
    ]  # fmt: skip
    return {
        "title": "OpenClaw cron firing → task queued (real gateway, loopback)",
        "rows": rows,
        "data": data,
    }


__all__ = ["run"]

if __name__ == "__main__":
    result = run("--quick" in sys.argv)
    print(json.dumps(result["data"], indent=2))
    for row in result["rows"]:
        print(" | ".join(str(x) for x in row))
