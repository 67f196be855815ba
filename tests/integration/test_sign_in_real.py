"""People signing in on a real Kanboard: the CLI's gestures, refused credentials, the lock.

Runs when AGAP_TEST_KANBOARD_URL and AGAP_TEST_KANBOARD_TOKEN name a scratch Kanboard
(skipped otherwise; tests/integration/test_sign_in.py and tests/unit/test_board_sign_in.py
make each of these on the embedded board). Its projects and users start with ``s_``.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fabric.apps.cli import main
from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.rpc import LOCKDOWN
from fabric.errors import EXIT_INVALID, EXIT_OK, EXIT_POLICY, EXIT_UNREACHABLE
from fabric.kanboard.client import KanboardClient
from fabric.kanboard.port import BoardAuthError
from fabric.kanboard.principals import sign_in
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import REAL_SKIP, ROOT, real_kanboard, scratch_board

PASSWORD = "s-real-sign-in"
pytestmark = pytest.mark.skipif(real_kanboard() is None, reason=REAL_SKIP)


@dataclass
class Real:
    url: str
    token: str
    env: dict[str, str]
    fab: Fabric
    users: dict[str, str]  # card id -> Kanboard username

    def run(self, *args: str, person: str | None = None, **more: str) -> Result:
        signed = {"AGAP_USER": self.users[person], "AGAP_USER_PASSWORD": PASSWORD} if person else {}
        return CliRunner().invoke(main, list(args), env={**self.env, **signed, **more})

    def gate(self, person: str) -> int:
        return self.fab.submit("approve the plan", target=person).task_id


@pytest.fixture
def real(tmp_path: Path) -> Iterator[Real]:
    found = real_kanboard()
    assert found is not None
    url, token = found
    scratch_board(url, token)
    tag = uuid.uuid4().hex[:8]
    cards_dir = tmp_path / "cards"
    shutil.copytree(ROOT / "cards", cards_dir)
    shutil.copytree(ROOT / "souls", tmp_path / "souls")
    users = {"alvis": f"s_{tag}_alvis", "elizaveta": f"s_{tag}_eliz"}
    for card, name in users.items():
        path = cards_dir / f"{card}.yaml"
        path.write_text(re.sub(r"username: \w+", f"username: {name}", path.read_text()))
    app = KanboardClient(url, token, timeout=30)
    for name in users.values():
        assert app.call("createUser", {"username": name, "password": PASSWORD, "name": name})
    project, locks = f"s_fabric_{tag}", f"s_locks_{tag}"
    env = {
        "KANBOARD_URL": url,
        "KANBOARD_API_TOKEN": token,
        "AGAP_CARDS_DIR": str(cards_dir),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "AGAP_PROJECT": project,
        "AGAP_LOCKS_PROJECT": locks,
        "AGAP_QUOTA_PROJECT": f"s_quotas_{tag}",
        "AGAP_ACTOR": "",
        "AGAP_USER": "",
    }
    init = CliRunner().invoke(main, ["init"], env=env)
    assert init.exit_code == 0, init.output
    settings = Settings(
        board_url=url, board_token=token, cards_dir=cards_dir, project=project, locks_project=locks
    )
    fab = Fabric.connect(settings, cards=load_cards(cards_dir, base_dir=tmp_path), port=app)
    yield Real(url, token, env, fab, users)
    app.close()


def test_a_person_signed_in_approves_theirs_and_only_theirs(real: Real) -> None:
    tid = real.gate("alvis")
    refused = real.run("approve", str(tid), AGAP_ACTOR="alvis")
    assert refused.exit_code == EXIT_INVALID and "AGAP_USER" in refused.output, refused.output
    other = real.run("approve", str(tid), person="elizaveta")
    assert other.exit_code == EXIT_POLICY and "only " in other.output, other.output
    done = real.run("approve", str(tid), person="alvis")
    assert done.exit_code == EXIT_OK, done.output
    cur = real.fab.show(tid).current
    assert cur is not None and (cur.state, cur.by) == (State.DONE, "alvis")


def test_a_wrong_password_exits_3(real: Real) -> None:
    tid = real.gate("alvis")
    wrong = real.run("approve", str(tid), AGAP_USER=real.users["alvis"], AGAP_USER_PASSWORD="not-it")
    assert wrong.exit_code == EXIT_UNREACHABLE and "refused the sign-in" in wrong.output, wrong.output
    cur = real.fab.show(tid).current
    assert cur is not None and cur.state == State.QUEUED


def test_real_kanboard_locks_a_user_after_the_seventh_failure_as_the_embedded_board_does(real: Real) -> None:
    name = f"{real.users['alvis']}_lock"
    app = KanboardClient(real.url, real.token, timeout=30)
    assert app.call("createUser", {"username": name, "password": PASSWORD})
    for _ in range(LOCKDOWN):
        with pytest.raises(BoardAuthError):
            sign_in(real.url, name, "wrong")
    assert sign_in(real.url, name, PASSWORD).username == name, "six failures do not lock"
    for _ in range(LOCKDOWN + 1):
        with pytest.raises(BoardAuthError):
            sign_in(real.url, name, "wrong")
    with pytest.raises(BoardAuthError):
        sign_in(real.url, name, PASSWORD)  # locked: the right password is refused too
    app.close()
