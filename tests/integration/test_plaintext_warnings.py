"""Commands that reach a board or broker without TLS off loopback say so once, first.

The hosts are named by a name the fabric does not take for loopback (it judges names as
written, never resolving them) but that resolves to 127.0.0.1 here, so every byte stays
on this machine.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fabric.core import Fabric
from tests.integration.test_events_helpers import QUEUE, Broker, free_port

pytest_plugins = ["tests.integration.test_events_helpers"]  # the fixtures

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def loopback_name() -> str:
    """This machine's host name, when it resolves to a loopback address only."""
    name = socket.gethostname()
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except OSError:
        addrs = set()
    if name == "localhost" or not addrs or not all(ipaddress.ip_address(a).is_loopback for a in addrs):
        pytest.skip(
            f"the host name {name!r} does not resolve to loopback only here, so no plaintext "
            "non-loopback URL can stay on this machine; tests/unit/test_config.py checks the "
            "warnings themselves without a network"
        )
    return name


@pytest.fixture(scope="module")
def only_env_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An empty env file: named, it is the only file, so no .agap.env around adds settings."""
    path = tmp_path_factory.mktemp("env") / "empty.env"
    path.write_text("")
    return str(path)


def agap(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric.apps.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def warnings_in(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("agap: warning:")]


def test_submit_warns_once_for_the_board_and_the_broker(
    loopback_name: str, fab: Fabric, shared_broker: Broker, only_env_file: str
) -> None:
    board = fab.settings.board_url.replace("127.0.0.1", loopback_name)
    assert board != fab.settings.board_url
    env = {
        "AGAP_ENV_FILE": only_env_file,
        **shared_broker.env(),
        "AGAP_EVENTS_URL": f"{shared_broker.kind}://{loopback_name}:{shared_broker.port}",
        "KANBOARD_URL": board,
        "KANBOARD_API_TOKEN": fab.settings.board_token,
        "AGAP_CARDS_DIR": str(fab.settings.cards_dir),
    }
    done = agap(env, "submit", "--target", QUEUE, "--intent", "over a plaintext network", "--json")
    assert done.returncode == 0, done.stderr
    scheme = shared_broker.kind
    assert warnings_in(done.stderr) == [
        f"agap: warning: the board at http://{loopback_name}:{board.split(':')[2].split('/')[0]} is"
        " reached without TLS, so tokens and tasks cross the network in clear text; use an https:// URL",
        f"agap: warning: the events broker at {scheme}://{loopback_name}:{shared_broker.port} is"
        " reached without TLS, so tokens and tasks cross the network in clear text; use"
        f" {'mqtts://' if scheme == 'mqtt' else 'tls://'} (or set AGAP_EVENTS_TLS=1)",
    ]


def test_a_command_that_cannot_connect_has_warned_first(loopback_name: str, only_env_file: str) -> None:
    closed = free_port()  # nothing listens there: every connection is refused at once
    env = {
        "AGAP_ENV_FILE": only_env_file,
        "KANBOARD_URL": f"http://{loopback_name}:{closed}/jsonrpc.php",
        "KANBOARD_API_TOKEN": "some-token",
        "AGAP_EVENTS_URL": f"mqtt://{loopback_name}:{closed}",
        "AGAP_EVENTS_SECRET": "s" * 16,
    }
    watched = agap(env, "watch", "1", "--timeout", "30")
    assert watched.returncode == 3, watched.stderr  # neither the broker nor the board answers
    got = warnings_in(watched.stderr)
    assert [line.split(" is reached")[0] for line in got] == [
        f"agap: warning: the events broker at mqtt://{loopback_name}:{closed}",
        f"agap: warning: the board at http://{loopback_name}:{closed}",
    ], watched.stderr
    first_error = watched.stderr.index("agap watch:")
    assert all(watched.stderr.index(line) < first_error for line in got)  # before any failure
    # the same board, from a command that goes straight to it
    shown = agap(env, "show", "1")
    assert shown.returncode == 3 and len(warnings_in(shown.stderr)) == 1, shown.stderr
    assert shown.stderr.index("agap: warning: the board") < shown.stderr.index("agap: error")
