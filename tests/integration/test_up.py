"""`agap up` (what `make run` runs): board, init and workers from a fresh state, offline."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT


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
        url = re.search(r"export KANBOARD_URL=(\S+)", banner)
        token = re.search(r"export KANBOARD_API_TOKEN=(\S+)", banner)
        assert url and token, banner
        assert "model mode: demo" in banner
        cli = {**env, "KANBOARD_URL": url.group(1), "KANBOARD_API_TOKEN": token.group(1)}

        def agap(*args: str) -> dict[str, object]:
            out = subprocess.run(
                [sys.executable, "-m", "fabric.apps.cli", *args, "--json"],
                env=cli,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            return json.loads(out.stdout)  # type: ignore[no-any-return]

        tid = agap("submit", "--target", "kimi", "--intent", "hello from make run")["task_id"]
        deadline = time.monotonic() + 60
        shown: dict[str, object] = {}
        while time.monotonic() < deadline:
            shown = agap("show", str(tid))
            if shown["state"] == "done":
                break
            time.sleep(0.3)
        assert shown["state"] == "done", shown
        assert str(shown["result_ref"]).startswith(f"kanboard://task/{tid}/file/")
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(60)
        finally:
            up.kill()
    assert up.returncode == 0
