"""``agap doctor`` says which part is wrong, one line each, with the table's exit code.
(Every part answering, and one task end to end, is proven on the compose stack run as
host processes: tests/integration/test_compose_processes.py.)"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

import fabric.apps.cli.doctor_cmd  # noqa: F401  (registers `agap doctor`)
from fabric.apps.cli import main
from fabric.embedded.server import EmbeddedBoard
from fabric.errors import EXIT_FAILED, EXIT_UNREACHABLE
from tests.conftest import ROOT
from tests.stopping import free_port


def _doctor(env: dict[str, str], *args: str) -> tuple[int, list[str]]:
    res = CliRunner().invoke(main, ["doctor", *args], env=env)
    assert "Traceback" not in res.output
    return res.exit_code, res.output.splitlines()


def _env(url: str, token: str, tmp_path: Path) -> dict[str, str]:
    return {
        "KANBOARD_URL": url,
        "KANBOARD_API_TOKEN": token,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "AGAP_STATE_DIR": str(tmp_path / "var"),
        "AGAP_EVENTS_URL": "",
        "AGAP_MODEL_MODE": "demo",
    }


def test_a_board_that_is_not_there_is_exit_3_and_nothing_is_sent(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/jsonrpc.php"
    code, lines = _doctor(_env(url, "x" * 20, tmp_path), "--no-keeper", "--agent", "kimi")
    assert code == EXIT_UNREACHABLE, lines
    assert lines[0].startswith("FAIL board ") and url in lines[0]
    assert lines[-1] == "skip task    not sent: fix the parts above first"


def test_a_wrong_token_and_a_board_without_the_layout_each_name_the_fix(tmp_path: Path) -> None:
    with EmbeddedBoard(tmp_path / "b.sqlite3") as board:
        code, lines = _doctor(_env(board.url, "wrong-token-wrong-token", tmp_path), "--no-keeper")
        assert code == EXIT_UNREACHABLE and lines[0].startswith("FAIL board "), lines
        code, lines = _doctor(_env(board.url, board.token, tmp_path), "--no-keeper")
        assert code == EXIT_FAILED, lines
        assert lines[0].startswith("ok   board ") and "API token accepted" in lines[0]
        assert lines[1].startswith("FAIL layout ") and "run `agap init` first" in lines[1], lines
        assert "skip models  AGAP_MODEL_MODE=demo" in lines[2]
        assert lines[3].startswith("skip events  AGAP_EVENTS_URL is not set")
        keeper = f"http://127.0.0.1:{free_port()}/metrics.json"
        code, lines = _doctor(_env(board.url, board.token, tmp_path), "--keeper", keeper)
        assert code == EXIT_UNREACHABLE and any(ln.startswith("FAIL keeper ") for ln in lines), lines
