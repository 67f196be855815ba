"""``agap up`` starts the ops-agent only when Zabbix is configured (a loopback stand-in
speaking Zabbix's JSON-RPC here; tests/integration/test_zabbix_real.py runs the real one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.embedded.server import EmbeddedBoard
from tests.conftest import ROOT
from tests.fakes.zabbix_stub import ZabbixStub
from tests.helpers import Lines


def _up(tmp_path: Path, extra: dict[str, str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGAP_", "KANBOARD_"))}
    env |= {
        "AGAP_STATE_DIR": str(tmp_path / "var"),
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "AGAP_BOARD_PORT": "0",
        **extra,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "fabric.apps.cli", "up"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    finally:
        proc.kill()


def test_up_starts_agap_ops_when_zabbix_is_configured(tmp_path: Path) -> None:
    with ZabbixStub() as zbx:
        zbx.add_problem("77", "Queue kimi is backing up", {"agap.class": "backlog", "queue": "kimi"})
        extra = {"AGAP_ZABBIX_URL": zbx.url, "AGAP_ZABBIX_TOKEN": zbx.token, "AGAP_OPS_POLL_EVERY": "1s"}
        up = _up(tmp_path, extra)
        try:
            assert up.stdout is not None
            lines = Lines(up.stdout)
            lines.wait_for("Ctrl-C stops everything", timeout=90)
            assert "ops       running" in lines.text()
            deadline = time.monotonic() + 90
            while not zbx.acks and time.monotonic() < deadline:
                time.sleep(0.2)  # polling the stand-in's record of what it was sent, bounded
            assert [a["eventids"] for a in zbx.acks] == [["77"]], zbx.acks
            assert "filed task #" in zbx.acks[0]["message"]
        finally:
            _stop(up)


def test_up_without_zabbix_starts_no_ops_agent(tmp_path: Path) -> None:
    up = _up(tmp_path, {})
    try:
        assert up.stdout is not None
        lines = Lines(up.stdout)
        lines.wait_for("Ctrl-C stops everything", timeout=90)
        assert "ops       not started" in lines.text()
    finally:
        _stop(up)


def test_the_daemon_survives_an_unreadable_answer_and_says_it_in_one_line(tmp_path: Path) -> None:
    with ZabbixStub() as zbx, EmbeddedBoard(tmp_path / "board.sqlite3") as board:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGAP_", "KANBOARD_"))}
        env |= {
            "KANBOARD_URL": board.url,
            "KANBOARD_API_TOKEN": board.token,
            "AGAP_CARDS_DIR": str(ROOT / "cards"),
            "AGAP_STATE_DIR": str(tmp_path / "var"),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "AGAP_ZABBIX_URL": zbx.url,
            "AGAP_ZABBIX_TOKEN": zbx.token,
            "AGAP_OPS_POLL_EVERY": "0.2s",
        }
        assert CliRunner().invoke(main, ["init"], env=env).exit_code == 0
        zbx.raw = b"<html>502 Bad Gateway</html>"
        ops = subprocess.Popen(
            [sys.executable, "-m", "fabric.apps.cli", "ops"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert ops.stderr is not None
            errors = Lines(ops.stderr)
            errors.wait_for("not JSON", timeout=60)
            zbx.add_problem("9", "Queue kimi is backing up", {"agap.class": "backlog", "queue": "kimi"})
            deadline = time.monotonic() + 60
            while not zbx.acks and time.monotonic() < deadline:
                time.sleep(0.2)  # polling the stand-in's record, bounded
            assert [a["eventids"] for a in zbx.acks] == [["9"]]
            assert ops.poll() is None  # still running
        finally:
            ops.send_signal(signal.SIGTERM)
            ops.wait(30)
        text = errors.text()
        assert text.count("not JSON") == 1 and "Traceback" not in text, text
        assert ops.returncode == 0
