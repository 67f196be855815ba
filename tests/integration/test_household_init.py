"""`agap household init`: a household of your own from a few questions, checked, runnable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml
from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.cards import load_cards
from tests.helpers import Lines, UpShell

# One answer per prompt, in the order they are asked ("" takes the default).
ANSWERS = [
    "sam, alex",  # the people
    "",  # sam's display name: Sam
    "Mars/Base",  # not a time zone: asked again
    "Europe/London",
    "7 to 11",  # not hours: asked again
    "07:00-23:30",
    "matrix",
    "!sam:matrix.example.org",
    "https://matrix.example.org",
    "Alex Doe",
    "",  # time zone: the host's
    "",  # hours: 08:00-23:00
    "webhook",
    "http://127.0.0.1:8787/notify/alex",
    # endpoints
    "",  # cloud
    "kimi",
    "openai/kimi-k2",
    "",  # large
    "60/5h",
    "",  # private? no (a cloud model)
    "y",
    "",  # local
    "gemma",
    "",  # ollama/gemma3:4b
    "",  # small
    "",  # http://127.0.0.1:11434
    "3300",
    "",  # private? yes (in the house)
    "y",
    "remote",
    "qwen",
    "",
    "medium",
    "http://192.168.1.20:8081/v1",
    "http://192.168.1.20:8081/health",
    "",  # no wake command
    "n",
    "",  # no more endpoints
    # assistants
    "",  # add one: yes
    "ada",
    "",  # Ada
    "",  # all
    "",  # the strongest it may think with: small (only gemma sees private context)
    "y",
    "scout",
    "",
    "none",
    "large",
    "",  # no more
    "alex",  # gates
    "",  # GPU memory 8192
]


def _init(tmp_path: Path, *args: str, answers: list[str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(
        main, ["household", "init", *args], input="\n".join(answers or []) + "\n", catch_exceptions=False
    )
    return result.exit_code, result.output


def _card(folder: Path, name: str) -> dict[str, object]:
    return yaml.safe_load((folder / "cards" / f"{name}.yaml").read_text())  # type: ignore[no-any-return]


def test_the_questions_write_a_household_whose_cards_check(tmp_path: Path) -> None:
    home = tmp_path / "home"
    code, out = _init(tmp_path, str(home), answers=ANSWERS)
    assert code == 0, out
    # A wrong answer is refused with what to write, and asked again.
    assert "Error: 'Mars/Base' is not an IANA time zone" in out
    assert "Error: '7 to 11' is not waking hours: write HH:MM-HH:MM" in out
    cards = load_cards(home / "cards")
    assert sorted(c.id for c in cards) == ["ada", "alex", "gemma", "kimi", "qwen", "router", "sam", "scout"]
    # Privacy: what leaves the house sees only what is shared; the house's own model sees all.
    assert cards.get("kimi").privacy_domains == ["shared"]
    assert cards.get("gemma").privacy_domains == ["shared", "private:sam", "private:alex"]
    assert cards.get("ada").privacy_domains == ["shared", "private:sam", "private:alex"]
    assert cards.get("scout").privacy_domains == ["shared"]
    assert cards.get("kimi").shapes == ["quota"] and cards.get("qwen").shapes == ["on_demand"]
    assert cards.get("gemma").gpu is not None and (home / "cards" / "_gpu.yaml").is_file()
    sam = cards.get("sam")
    assert sam.human is not None and [c.type for c in sam.human.channels] == ["matrix"]
    assert yaml.safe_load((home / "cards" / "_policy.yaml").read_text())["gate_to"] == "alex"
    assert (home / "souls" / "ada.md").read_text().startswith("# Ada")
    assert "AGAP_MATRIX_TOKEN=" in (home / "env.example").read_text()
    # The same answers from the file they were saved to write the same household.
    again = tmp_path / "again"
    code, out = _init(tmp_path, str(again), "--from", str(home / "household.yaml"))
    assert code == 0, out
    written = {p.relative_to(home): p.read_text() for p in home.rglob("*") if p.is_file()}
    assert written == {p.relative_to(again): p.read_text() for p in again.rglob("*") if p.is_file()}


def test_a_folder_that_holds_files_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    code, out = _init(tmp_path, str(tmp_path / "home"), answers=ANSWERS)
    assert code == 2 and "already holds files" in out and out.count("\n") == 1
    assert [p.name for p in (tmp_path / "home").iterdir()] == ["notes.txt"]


def test_bad_answers_in_a_file_are_each_named_and_nothing_is_written(tmp_path: Path) -> None:
    answers = tmp_path / "household.yaml"
    answers.write_text(
        yaml.safe_dump(
            {
                "people": [{"username": "sam", "name": "Sam", "hours": "late"}],
                "endpoints": [{"id": "cloud", "where": "cloud", "model": "openai/x", "tier": "small"}],
                "assistants": [{"id": "ada", "name": "Ada", "tier": "large"}],
                "gate_to": "nobody",
            }
        )
    )
    code, out = _init(tmp_path, str(tmp_path / "home"), "--from", str(answers))
    assert code == 2, out
    assert "hours" in out and "HH:MM-HH:MM" in out
    assert "Traceback" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["household.yaml"]
    # Consistency across answers: gates to a stranger, an assistant stronger than any model.
    answers.write_text(answers.read_text().replace("hours: late", "hours: 08:00-22:00"))
    code, out = _init(tmp_path, str(tmp_path / "home"), "--from", str(answers))
    assert code == 2 and "'nobody' is not one of the people" in out
    assert "no endpoint is large or stronger" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["household.yaml"]


def test_the_household_runs_under_agap_up(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert _init(tmp_path, str(home), answers=ANSWERS)[0] == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGAP_", "KANBOARD_"))}
    env |= {
        "AGAP_STATE_DIR": str(tmp_path / "var"),
        "AGAP_CARDS_DIR": str(home / "cards"),
        "AGAP_BOARD_PORT": "0",
        "AGAP_POLL_SECONDS": "0.2",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    up = subprocess.Popen(
        [sys.executable, "-m", "fabric.apps.cli", "up"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert up.stdout is not None
        lines = Lines(up.stdout)
        lines.wait_for("Ctrl-C stops everything", timeout=60)
        banner = lines.text()
        shell = UpShell(banner, env)
        tid = shell.agap("submit", "--target", "ada", "--intent", "What is on today?")["task_id"]
        shown = shell.until_state(tid, "done")
        assert shown["state"] == "done", shown
    finally:
        up.send_signal(signal.SIGINT)
        try:
            _, err = up.communicate(timeout=60)
        finally:
            up.kill()
    assert up.returncode == 0, err
