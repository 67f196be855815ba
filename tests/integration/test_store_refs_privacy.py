"""The context stores (``hindsight://`` banks, ``git+file://`` repositories), tried as a
hostile caller would: a bank or a repository of alvis's never reaches a prompt for
elizaveta's work or for torgash (sandboxed), however the ref is written, and a bank or
repository nobody owns is refused, not treated as shared.

The project's cards with owner rules for this test's directories and banks; the embedded
board over HTTP; the Hindsight stand-in holding alvis's marker; the real torgash worker in
gateway mode against a model stand-in that echoes (and records) every prompt.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fabric.apps.cli import main
from fabric.cards import load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.errors import EXIT_POLICY
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import ROOT
from tests.fakes.hindsight_stub import HindsightStub, Memory
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import acting_as, board_env, drain, sign_in_people
from workers.assembly import build_worker
from workers.loop import card_policy, no_claim_policy

MARK = "ALVIS-BANK-c41d"  # in alvis's bank and in his private repository
SHARED_FACT = "the recycling goes out on Tuesday"
TORGASH_PASSWORD = "torgash-board-test-password"


@dataclass
class Stores:
    base: Path
    env: dict[str, str]
    fab: Fabric
    settings: Settings
    model: OpenAIStub
    memory: HindsightStub

    @property
    def private_repo(self) -> Path:
        return self.base / "private/alvis/notes"

    @property
    def shared(self) -> Path:
        return self.base / "shared"

    def submit(self, target: str, ref: str, actor: str = "cli") -> Result:
        args = ["submit", "--target", target, "--intent", "what do the stores say", "--ref", ref, "--json"]
        return CliRunner().invoke(
            main, args, env={**self.env, **acting_as(actor, self.settings.cards_dir)}, catch_exceptions=False
        )

    def drain_torgash(self, *, claim_check: bool = True) -> None:
        settings = dataclasses.replace(
            self.settings, board_user="agap-torgash", board_password=TORGASH_PASSWORD
        )
        # Without the claim check, only the read-time guard stands in the way.
        worker = build_worker(
            "torgash",
            settings,
            load_cards(self.settings.cards_dir),
            env=self.env,
            drain=True,
            claim_policy=card_policy if claim_check else no_claim_policy,
        )
        drain(worker)

    def state(self, task_id: int) -> tuple[State | None, str]:
        cur = self.fab.board.read(task_id).current
        return (cur.state if cur else None), ((cur.reason or "") if cur else "")

    def prompts(self) -> str:
        return "\n".join(json.dumps(r.body) for r in self.model.chat_requests())


def git(cwd: Path, *args: str) -> None:
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "init.defaultBranch=main"]
    subprocess.run(["git", *ident, *args], cwd=cwd, check=True, capture_output=True)


def repo(path: Path, text: str) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q")
    (path / "notes.md").write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "notes")
    return path


@pytest.fixture
def stores(embedded_board: EmbeddedBoard, tmp_path: Path) -> Iterator[Stores]:
    base = tmp_path / "srv"
    repo(base / "private/alvis/notes", f"alvis's notes: {MARK}\n")
    repo(base / "shared/house", "the house repository\n")
    cards_dir = tmp_path / "cards"
    shutil.copytree(ROOT / "cards", cards_dir, ignore=shutil.ignore_patterns("_policy.yaml", "golden"))
    (tmp_path / "souls").symlink_to(ROOT / "souls", target_is_directory=True)
    (cards_dir / "golden").symlink_to(ROOT / "cards" / "golden", target_is_directory=True)
    (cards_dir / "_policy.yaml").write_text(
        "gate_to: alvis\ndomains:\n"
        f"  'file://{base}/private/alvis/': private:alvis\n"
        "  'hindsight://adolf-alvis/': private:alvis\n"
        "  'hindsight://household/': shared\n"
    )
    banks = {
        "adolf-alvis": [Memory("a1", f"alvis's secret {MARK}, recycling tuesday")],
        "household": [Memory("h1", SHARED_FACT)],
        "nobody": [Memory("n1", f"an unowned bank that also says {MARK}")],
    }
    with (
        HindsightStub(banks, api_key="hs-key") as memory,
        OpenAIStub(reply=lambda body: json.dumps(body["messages"])) as model,
    ):
        settings = Settings(
            board_url=embedded_board.url,
            board_token=embedded_board.token,
            cards_dir=cards_dir,
            state_dir=tmp_path / "state",
        )
        env = board_env(
            embedded_board.url,
            embedded_board.token,
            cards_dir,
            settings.state_dir,
            AGAP_REF_ROOTS=str(base),
            AGAP_MODEL_MODE="gateway",
            AGAP_LITELLM_URL=model.url,
            AGAP_LITELLM_KEY=model.api_key,
            AGAP_HINDSIGHT_URL=memory.url,
            AGAP_HINDSIGHT_KEY="hs-key",
            AGAP_BOARD_PASSWORD_TORGASH=TORGASH_PASSWORD,
            AGAP_BOARD_PASSWORD_RESEARCHER="researcher-board-test-password",
        )
        sign_in_people(embedded_board, cards_dir)
        res = CliRunner().invoke(main, ["init"], env=env, catch_exceptions=False)
        assert res.exit_code == 0, res.output
        fab = Fabric.connect(
            settings,
            cards=load_cards(cards_dir),
            port=KanboardClient(embedded_board.url, embedded_board.token),
        )
        yield Stores(base, env, fab, settings, model, memory)


def refused(res: Result, rule: str) -> None:
    assert res.exit_code == EXIT_POLICY, res.output
    line = res.output.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert f"PRIVACY [{rule}" in line, line


def bank_tricks() -> list[str]:
    return [
        "hindsight://adolf-alvis/diary",
        "hindsight://adolf%2Dalvis/diary",
        "hindsight://adolf-%61lvis/diary",
        "hindsight://adolf-alvis/../household/x",
        "hindsight://adolf-alvis/%2E%2E/household/x",
        "hindsight://adolf-alvis/q?budget=low&max_tokens=50",
    ]


def repo_tricks(s: Stores) -> list[str]:
    rel = s.private_repo.relative_to(s.base)
    return [
        f"git+file://{s.private_repo}#main:notes.md",
        f"git+file://{s.shared}/../{rel}#main:notes.md",
        f"git+file://{s.shared}/%2e%2e/{rel}#main:notes.md",
        f"git+file://{s.shared}%2F..%2F{str(rel).replace('/', '%2F')}#main:notes.md",
        f"git+file://localhost{s.private_repo}#main:notes.md",
        f"git+file://{s.base}/private/%61%6c%76%69%73/notes#main:notes.md",
        f"git+file://{s.base}/PRIVATE/../private/alvis/notes#main:notes.md",
        f"git+file://{s.private_repo}/.git#main:notes.md",
        f"git+file://{s.private_repo}",  # the repository itself, as a workspace ref
    ]


@pytest.mark.parametrize(
    ("target", "actor"), [("torgash", "cli"), ("researcher", "cli"), ("adolf", "elizaveta")]
)
def test_private_banks_and_repositories_are_refused_at_submit(
    stores: Stores, target: str, actor: str
) -> None:
    s = stores
    rule = "privacy.interlocutor" if actor == "elizaveta" else "privacy.sandboxed"
    (s.shared / "alias").symlink_to(s.private_repo, target_is_directory=True)
    for ref in [*bank_tricks(), *repo_tricks(s), f"git+file://{s.shared}/alias#main:notes.md"]:
        refused(s.submit(target, ref, actor=actor), rule)
    for label in ("#domain=shared", "#main:notes.md&domain=shared", "#%64omain=shared"):
        refused(s.submit(target, f"git+file://{s.private_repo}{label}", actor=actor), "privacy.label")
    refused(s.submit(target, "hindsight://adolf-alvis/q#domain=shared", actor=actor), "privacy.label")
    for slash in ("hindsight://adolf-alvis%2F..%2Fhousehold/x", "hindsight://household%2F..%2Fadolf-alvis/x"):
        refused(s.submit(target, slash, actor=actor), "privacy.ref")  # an encoded slash in the bank
    assert s.memory.recalls == [], "nothing was recalled for a refused submit"
    assert MARK not in s.prompts()


@pytest.mark.parametrize(
    "ref",
    [
        "hindsight://nobody/q",
        "hindsight://NOBODY/q",
        "hindsight://Adolf-Alvis/q",  # bank ids are case-sensitive: not alvis's bank
        "hindsight://%41DOLF-ALVIS/q",
        "hindsight://adolf-alvis::x/q",
        "hindsight://household.evil/q",
        "hindsight://x@household/q",
        "hindsight://household:8888/q",
        "hindsight:///household/q",
    ],
)
def test_a_bank_no_rule_names_is_unknown_not_shared(stores: Stores, ref: str) -> None:
    for target, actor in (("torgash", "cli"), ("adolf", "alvis")):
        refused(stores.submit(target, ref, actor=actor), "privacy.unknown")
    assert stores.memory.recalls == []


def test_a_shared_bank_and_repository_are_read(stores: Stores) -> None:
    s = stores
    tasks = [
        json.loads(s.submit("torgash", ref).output)["task_id"]
        for ref in (
            "hindsight://household/recycling?budget=low",
            f"git+file://{s.shared}/house#main:notes.md",
        )
    ]
    s.drain_torgash()
    for tid in tasks:
        assert s.state(tid)[0] == State.DONE, s.state(tid)
    assert SHARED_FACT in s.prompts() and "the house repository" in s.prompts()
    assert s.memory.recalls == [{"query": "recycling", "budget": "low", "max_tokens": 4096}]
    assert s.memory.requests[-1].authorization == "Bearer hs-key"
    assert MARK not in s.prompts()


def test_a_repository_swapped_after_the_submit_is_refused_where_it_is_read(stores: Stores) -> None:
    s = stores
    box = s.shared / "box"
    repo(box, "harmless\n")
    gitfile = s.shared / "worktree"
    repo(gitfile, "harmless too\n")
    swapped = json.loads(s.submit("torgash", f"git+file://{box}#main:notes.md").output)["task_id"]
    linked = json.loads(s.submit("torgash", f"git+file://{gitfile}#main:notes.md").output)["task_id"]
    shutil.rmtree(box)
    box.symlink_to(s.private_repo, target_is_directory=True)  # the repository swapped for a link
    shutil.rmtree(gitfile / ".git")
    (gitfile / ".git").write_text(f"gitdir: {s.private_repo}/.git\n")  # objects from elsewhere
    s.drain_torgash()
    state, reason = s.state(swapped)
    assert state == State.DEAD and "PRIVACY [privacy.sandboxed" in reason, reason
    state, reason = s.state(linked)
    assert state == State.DEAD and "not followed" in reason, reason
    assert MARK not in s.prompts()


def test_store_refs_written_past_the_policy_are_refused_where_they_are_read(stores: Stores) -> None:
    s = stores
    s.fab.policies = []  # tasks no submit-time policy saw
    refs = ["hindsight://adolf-alvis/q", "hindsight://nobody/q", f"git+file://{s.private_repo}#main:notes.md"]
    tasks = [s.fab.submit("go", target="torgash", refs=[r]).task_id for r in refs]
    s.drain_torgash(claim_check=False)  # only the read-time guard left
    for tid in tasks:
        state, reason = s.state(tid)
        assert state == State.DEAD and "PRIVACY [privacy." in reason, reason
    assert s.memory.recalls == [], "a refused bank is never asked"
    assert MARK not in s.prompts()
