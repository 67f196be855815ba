"""`agap up` (what `make run` runs): board, init and workers from a fresh state, offline."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT
from tests.helpers import Lines, UpShell


def test_up_runs_the_fabric_offline_and_stops_cleanly(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "AGAP_STATE_DIR": str(tmp_path / "var"),
        "AGAP_BOARD_PORT": "0",
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "AGAP_POLL_SECONDS": "0.2",
    }
    env.pop("AGAP_MODEL_MODE", None)
    up = subprocess.Popen(
        [sys.executable, "-m", "fabric.apps.cli", "up"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert up.stdout is not None
        banner = ""
        deadline = time.monotonic() + 60
        while "Ctrl-C stops everything" not in banner and time.monotonic() < deadline:
            banner += up.stdout.readline()
        assert "model mode: demo" in banner
        shell = UpShell(banner, env)
        tid = shell.agap("submit", "--target", "kimi", "--intent", "hello from make run")["task_id"]
        shown = shell.until_state(tid, "done")
        assert shown["state"] == "done", shown
        assert str(shown["result_ref"]).startswith(f"kanboard://task/{tid}/file/")
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(60)
        finally:
            up.kill()
    assert up.returncode == 0


def _up(tmp_path: Path, *args: str, cards: Path = ROOT / "cards") -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGAP_", "KANBOARD_"))}
    env |= {
        "AGAP_STATE_DIR": str(tmp_path / "var"),
        "AGAP_CARDS_DIR": str(cards),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "fabric.apps.cli", "up", "--no-workers", *args],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _until_up(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    lines = Lines(proc.stdout)
    lines.wait_for("Ctrl-C stops everything", timeout=60)
    return lines.text()


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    finally:
        proc.kill()
    return proc.stderr.read() if proc.stderr else ""


def test_a_second_up_on_the_same_state_refuses_with_one_line(tmp_path: Path) -> None:
    first = _up(tmp_path, "--port", "0")
    try:
        banner = _until_up(first)
        second = _up(tmp_path, "--port", "0")
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2, err
        assert err.strip().count("\n") == 0 and f"another agap up is running on {tmp_path / 'var'}" in err
        assert f"(pid {first.pid})" in err
        # The paste block is kept in a file of its own: it stays true for a second shell.
        shell = (tmp_path / "var" / "shell.env").read_text()
        assert shell.splitlines()[0].startswith("cd ") and all(
            line.strip() in banner for line in shell.splitlines()
        )
    finally:
        _stop(first)


def _free_pair_below_ephemeral() -> int:
    """A port p with p and p + 1 free, below the kernel's ephemeral range: an outgoing
    connection of another test (which takes ephemeral ports) can never hold p + 1."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for p in random.Random().sample(range(20000, min(low, 32000) - 1, 2), 200):
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
            return p
    raise AssertionError("no two free ports side by side below the ephemeral range")


def test_reset_starts_over_and_the_stand_in_keeps_its_port(tmp_path: Path) -> None:
    port = _free_pair_below_ephemeral()
    first = _up(tmp_path, "--port", str(port))
    banner = _until_up(first)
    assert f"AGAP_HINDSIGHT_URL=http://127.0.0.1:{port + 1}" in banner, banner
    _stop(first)
    marker = tmp_path / "var" / "leftover.json"
    marker.write_text("{}")
    again = _up(tmp_path, "--port", str(port), "--reset")
    try:
        banner = _until_up(again)
        assert f"AGAP_HINDSIGHT_URL=http://127.0.0.1:{port + 1}" in banner  # the same as before
        assert not marker.exists(), "--reset deletes the old state"
    finally:
        _stop(again)


def test_a_bad_card_stops_only_itself_and_is_named(tmp_path: Path) -> None:
    cards = tmp_path / "cards"
    shutil.copytree(ROOT / "cards", cards)
    shutil.copytree(ROOT / "souls", tmp_path / "souls")
    (cards / "qwen-remote.yaml").write_text(
        (cards / "qwen-remote.yaml").read_text().replace("tier:", "tier: huge\n#")
    )
    up = _up(tmp_path, "--port", "0", cards=cards)
    try:
        _until_up(up)
    finally:
        err = _stop(up)
    named = [line for line in err.splitlines() if "qwen-remote.yaml" in line]
    assert named and "not started until it is fixed" in named[0], err
    assert "Traceback" not in err


def test_make_reset_empties_the_state_and_refuses_beside_a_running_fabric(tmp_path: Path) -> None:
    first = _up(tmp_path, "--port", "0")
    try:
        _until_up(first)
        busy = _up(tmp_path, "--reset", "--no-start")
        _, err = busy.communicate(timeout=60)
        assert busy.returncode == 2 and "another agap up is running" in err, err
        assert (tmp_path / "var" / "board.sqlite3").exists(), "a refused reset deletes nothing"
    finally:
        _stop(first)
    reset = _up(tmp_path, "--reset", "--no-start")
    out, err = reset.communicate(timeout=60)
    assert reset.returncode == 0, err
    assert "starts the demo afresh" in out
    assert sorted(p.name for p in (tmp_path / "var").iterdir()) == ["agap-up.lock"]
    alone = _up(tmp_path, "--no-start")
    _, err = alone.communicate(timeout=60)
    assert alone.returncode == 2 and "--no-start only goes with --reset" in err
