"""Privacy, tried as a hostile caller would: alvis's private text never reaches a prompt
meant for elizaveta's work, for torgash (sandboxed) or for the researcher (untrusted).

The project's own cards, with owner rules pointing at this test's directories; the
embedded board over HTTP; the real worker daemons in gateway mode against a model
stand-in that records every prompt. Each attempt asserts the refusal (the rule, the
exit code) and that the private marker is in no prompt. Submit-time refusals go through
the CLI; read-time refusals get past the submit (a swap after it, a task written without
the policy) and are caught where the worker reads.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from fabric.apps.a2a.auth import TokenTable
from fabric.apps.a2a.runner import Runner
from fabric.apps.a2a.server import ServerThread, make_service
from fabric.apps.a2a.service import ServiceConfig
from fabric.apps.cli import main
from fabric.cards import CardSet, load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.errors import EXIT_INVALID, EXIT_POLICY
from fabric.kanboard.client import KanboardClient
from fabric.refusals import PrivacyViolation
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import ROOT
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import acting_as, sign_in_people
from workers.assembly import build_worker
from workers.loop import card_policy, no_claim_policy

MARK = "ALVIS-DIARY-7f3a9c"  # in alvis's private files and in his own words on the board
SHARE = "ALVIS-SHOPPING-41be"  # in the one file alvis promotes
NOTE = "household wifi is on channel 6"  # shared
CONFINED = {"torgash": "torgash-board-password-1", "researcher": "researcher-board-password-1"}
_n = itertools.count()


@dataclass
class World:
    base: Path
    shared: Path
    alvis: Path
    liza: Path
    results: Path
    cards: CardSet
    settings: Settings
    fab: Fabric
    env: dict[str, str]
    stub: OpenAIStub

    @property
    def diary(self) -> Path:
        return self.alvis / "diary.md"

    def cli(self, *args: str, actor: str = "cli") -> Result:
        return CliRunner().invoke(
            main,
            list(args),
            env={**self.env, **acting_as(actor, self.settings.cards_dir)},
            catch_exceptions=False,
        )

    def submit(self, target: str, *refs: str, actor: str = "cli", parent: int | None = None) -> Result:
        args = ["submit", "--target", target, "--intent", f"summarise the context ({next(_n)})", "--json"]
        for r in refs:
            args += ["--ref", r]
        if parent is not None:
            args += ["--parent", str(parent)]
        return self.cli(*args, actor=actor)

    def drain(self, agent: str, *, claim_check: bool = True) -> None:
        """Run ``agent``'s real worker until its queue is empty (bounded)."""
        settings = self.settings
        if agent in CONFINED:  # a confined agent's worker signs in as its own board user
            settings = dataclasses.replace(
                settings, board_user=f"agap-{agent}", board_password=CONFINED[agent]
            )
        # Without the claim check, only the read-time guard stands in the way.
        policy = card_policy if claim_check else no_claim_policy
        worker = build_worker(agent, settings, self.cards, env=self.env, drain=True, claim_policy=policy)
        t = threading.Thread(target=worker.run, daemon=True)
        t.start()
        t.join(60)
        if t.is_alive():
            worker.stop.set()
            t.join(10)
            raise AssertionError(f"the {agent} worker did not drain its queue")

    def prompts(self) -> str:
        return "\n".join(json.dumps(r.body) for r in self.stub.chat_requests())

    def state(self, task_id: int) -> tuple[State | None, str]:
        cur = self.fab.board.read(task_id).current
        return (cur.state if cur else None), (cur.reason or "") if cur else ""

    def approve(self, task_id: int, person: str) -> None:
        """``person`` in the Kanboard UI: a comment as their own user, then the card to Done
        (the comment is what the UI binds to the logged-in user; Done is the keeper's record)."""
        user = self.fab.board.layout.users[person]
        self.fab.port.call("createComment", {"task_id": task_id, "user_id": user, "content": "approve"})
        lease = self.fab.ledger.claim(self.fab.board.read(task_id), "human (Kanboard UI)", lease_seconds=60)
        self.fab.ledger.complete(lease, "kanboard:approved")


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    # Echoes the whole prompt: whatever reached a model is in its result too.
    with OpenAIStub(reply=lambda body: json.dumps(body["messages"])) as s:
        yield s


@pytest.fixture
def world(embedded_board: EmbeddedBoard, tmp_path: Path, stub: OpenAIStub) -> World:
    base = tmp_path / "srv"
    shared, alvis, liza, results = (
        base / "shared",
        base / "private/alvis",
        base / "private/elizaveta",
        base / "results",
    )
    for d in (shared, alvis, liza, results):
        d.mkdir(parents=True)
    (alvis / "diary.md").write_text(f"dear diary: {MARK}\n")
    (alvis / "shopping.md").write_text(f"shopping list: {SHARE}\n")
    (liza / "trip.md").write_text("elizaveta's trip plans\n")
    (shared / "notes.md").write_text(NOTE + "\n")
    cards_dir = tmp_path / "cards"
    cards_dir.mkdir()
    for f in (ROOT / "cards").glob("*.yaml"):
        if f.name != "_policy.yaml":
            shutil.copy(f, cards_dir / f.name)
    # Personas and golden sets are relative to the folder above the cards.
    (tmp_path / "souls").symlink_to(ROOT / "souls", target_is_directory=True)
    (cards_dir / "golden").symlink_to(ROOT / "cards" / "golden", target_is_directory=True)
    (cards_dir / "_policy.yaml").write_text(
        "gate_to: alvis\n"
        "domains:\n"
        f"  'file://{alvis}/': private:alvis\n"
        f"  'file://{liza}/': private:elizaveta\n"
        "  'hindsight://adolf-alvis/': private:alvis\n"
        f"tainted:\n  'file://{base}/agents/researcher/': researcher\n"
        f"promote_to: 'file://{shared}/promoted/'\n"
    )
    cards = load_cards(cards_dir)
    settings = Settings(
        board_url=embedded_board.url,
        board_token=embedded_board.token,
        cards_dir=cards_dir,
        state_dir=tmp_path / "state",
    )
    env = {
        "KANBOARD_URL": embedded_board.url,
        "KANBOARD_API_TOKEN": embedded_board.token,
        "AGAP_CARDS_DIR": str(cards_dir),
        "AGAP_STATE_DIR": str(tmp_path / "state"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "AGAP_REF_ROOTS": str(base),
        "AGAP_RESULT_STORE": "dir",
        "AGAP_RESULT_DIR": str(results),
        "AGAP_MODEL_MODE": "gateway",
        "AGAP_LITELLM_URL": stub.url,
        "AGAP_LITELLM_KEY": stub.api_key,
        "AGAP_POLL_SECONDS": "0.05",
        **{f"AGAP_BOARD_PASSWORD_{a.upper()}": pw for a, pw in CONFINED.items()},
    }
    w = World(base, shared, alvis, liza, results, cards, settings, None, env, stub)  # type: ignore[arg-type]
    sign_in_people(embedded_board, cards_dir)
    assert w.cli("init").exit_code == 0
    w.fab = Fabric.connect(
        settings, cards=cards, port=KanboardClient(embedded_board.url, embedded_board.token)
    )
    return w


def written(w: World) -> int:
    """Tasks on the board that a submit of this test made (the work project and the homes)."""
    boards = [w.fab.board, *(w.fab.board_for(w.cards.get(a)) for a in CONFINED)]
    return sum(len(b.search("desc:summarise")) for b in boards)


def refused(res: Result, rule: str) -> None:
    assert res.exit_code == EXIT_POLICY, res.output
    line = res.output.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert f"PRIVACY [{rule}" in line, line


def alvis_task(w: World) -> int:
    """A task alvis submitted in his own words, worked by adolf on his diary: its result
    lands in the shared result directory."""
    res = w.cli(
        "submit",
        "--target",
        "adolf",
        "--intent",
        f"my secret is {MARK}",
        "--ref",
        w.diary.as_uri(),
        "--json",
        actor="alvis",
    )
    assert res.exit_code == 0, res.output
    tid = int(json.loads(res.output)["task_id"])
    w.drain("adolf")
    assert w.state(tid)[0] == State.DONE
    w.stub.reset()  # adolf legitimately read it for alvis; every prompt from here on is checked
    return tid


# -- labels and path tricks: refused at submit -----------------------------------------------


def path_tricks(w: World) -> list[str]:
    a, s = w.alvis, w.shared
    rel = a.relative_to(w.base)
    return [
        f"file://{s}/../{rel}/diary.md",
        f"file://{s}/%2e%2e/{rel}/diary.md",
        f"file://{s}/%2E%2E/{rel}/diary.md",
        f"file://{a.parent}/%61lvis/diary.md",
        f"file://{a.parent}%2Falvis%2Fdiary.md",
        f"file://{a.parent}//alvis//diary.md",
        f"file://{a}/./diary.md",
        f"file://localhost{a}/diary.md",
        f"file://LocalHost{a}/diary.md",
        f"file:{a}/diary.md",
        f"file:////{str(a).lstrip('/')}/diary.md",
        f"file://{a}",
        f"file://{a}/",
    ]


@pytest.mark.parametrize("target,actor", [("torgash", "cli"), ("researcher", "cli"), ("adolf", "elizaveta")])
def test_labels_and_path_tricks_are_refused_at_submit(world: World, target: str, actor: str) -> None:
    w = world
    for label in (
        "#domain=shared",
        "#domain=private:elizaveta",
        "#Domain=shared",
        "#x=1&domain=shared",
        "#%64omain=shared",
    ):
        refused(w.submit(target, w.diary.as_uri() + label, actor=actor), "privacy.label")
    rule = "privacy.interlocutor" if actor == "elizaveta" else "privacy.sandboxed"
    for ref in path_tricks(w):
        refused(w.submit(target, ref, actor=actor), rule)
    # Another bank (ids are case-sensitive), whose owner no rule names: unknown, refused too.
    refused(w.submit(target, "hindsight://ADOLF-alvis//facts", actor=actor), "privacy.unknown")
    refused(w.submit(target, "hindsight://adolf-%61lvis/facts", actor=actor), rule)
    # A service on this machine (a memory bank's API, the board) has no owner but by a rule.
    for local in ("http://127.0.0.1:8888/v1/banks/adolf-alvis", "http://LOCALHOST./x", "https://[::1]/y"):
        refused(w.submit(target, local, actor=actor), "privacy.unknown")
    for upper in (f"FILE://LOCALHOST{w.alvis}/diary.md", f"File://{w.alvis}/diary.md"):
        res = w.submit(target, upper, actor=actor)  # not even a URI to the submit
        assert res.exit_code == 2 and "is not a URI" in res.output, res.output
    assert written(w) == 0, "nothing was written"
    assert MARK not in w.prompts()


def test_symlinks_and_hard_links_into_a_private_root_are_refused(world: World) -> None:
    w = world
    (w.shared / "link.md").symlink_to(w.diary)
    (w.shared / "dir").symlink_to(w.alvis, target_is_directory=True)
    (w.shared / "chain.md").symlink_to(w.shared / "link.md")
    (w.alvis / "old.md").write_text(f"old diary: {MARK}\n")
    os.link(w.alvis / "old.md", w.shared / "hard.md")
    for ref in ("link.md", "dir/diary.md", "chain.md"):
        refused(w.submit("torgash", f"file://{w.shared}/{ref}"), "privacy.sandboxed")
    refused(w.submit("torgash", f"file://{w.shared}/hard.md"), "privacy.hard-link")
    refused(
        w.submit("adolf", f"file://{w.shared}/hard.md"), "privacy.hard-link"
    )  # its other name is anyone's
    assert MARK not in w.prompts()


# -- tasks and results inherit what they point to ----------------------------------------------


def test_task_and_result_refs_inherit_the_domain_of_what_they_point_to(world: World) -> None:
    w = world
    tid = alvis_task(w)
    view = w.fab.board.read(tid)
    assert view.current is not None and view.current.result_ref and view.uid
    result = view.current.result_ref
    assert result.startswith(f"file://{w.results}/") and MARK in Path(result[7:]).read_text()
    refs = [
        f"task:{tid}",
        f"task:#{tid}",
        f"kanboard://task/{tid}",
        f"kanboard://TASK/{tid}/",
        f"task:%{ord(str(tid)[0]):x}{str(tid)[1:]}",
    ]
    refs += [
        f"kanboard://task/{tid}/file/result-e1.md",
        result,
        result.replace("/results/", "/shared/../results/"),
    ]
    (w.shared / "result.md").symlink_to(Path(result[7:]))
    refs.append(f"file://{w.shared}/result.md")
    for ref in refs:
        refused(w.submit("torgash", ref), "privacy.sandboxed")
        refused(w.submit("researcher", ref), "privacy.sandboxed")
        refused(w.submit("adolf", ref, actor="elizaveta"), "privacy.interlocutor")
        refused(w.submit("qwen-remote", ref), "privacy.card-domains")  # trusted, but shared only
    # Transitively: a cli task that cites alvis's task is alvis's too; a cycle ends.
    via = json.loads(w.submit("adolf", f"task:{tid}").output)["task_id"]
    refused(w.submit("torgash", f"task:{via}"), "privacy.sandboxed")
    refused(w.submit("torgash", f"task:{via + 999}"), "privacy.unknown")  # not (yet) there
    w.fab.policies = []  # a cycle can only be written past the policy: a -> b -> a
    a = w.fab.submit("a", target="adolf", refs=[f"task:{via + 2}"]).task_id
    b = w.fab.submit("b", target="adolf", refs=[f"task:{a}"], actor="alvis").task_id
    assert b == via + 2
    for ref in (f"task:{a}", f"task:{b}"):  # entered from either end, the cycle is whole
        refused(w.submit("torgash", ref), "privacy.sandboxed")
    # Elizaveta's own task is hers: alvis's assistant may not cite it either.
    mine = json.loads(w.submit("adolf", w.liza.joinpath("trip.md").as_uri(), actor="elizaveta").output)[
        "task_id"
    ]
    refused(w.submit("adolf", f"task:{mine}", actor="alvis"), "privacy.interlocutor")
    w.drain("torgash")
    w.drain("researcher")
    assert MARK not in w.prompts()


def test_a_task_the_fabric_did_not_write_has_no_known_domain(world: World) -> None:
    w = world
    layout = w.fab.board.layout
    raw = w.fab.port.call(
        "createTask",
        {
            "project_id": layout.project_id,
            "title": f"note: {MARK}",
            "description": MARK,
            "column_id": next(iter(layout.columns.values())),
        },
    )
    refused(w.submit("torgash", f"task:{raw}"), "privacy.unknown")
    refused(w.submit("adolf", f"task:{raw}", actor="alvis"), "privacy.unknown")


# -- the chain: what an agent read travels with its child tasks ----------------------------


def test_child_tasks_of_work_that_read_private_context_stay_private(world: World) -> None:
    w = world
    parent = alvis_task(w)
    refused(w.submit("torgash", actor="adolf", parent=parent), "privacy.sandboxed")
    child = json.loads(w.submit("kimi", actor="adolf", parent=parent).output)[
        "task_id"
    ]  # kimi may see alvis's
    refused(w.submit("torgash", actor="kimi", parent=child), "privacy.sandboxed")  # the grandparent read it
    refused(w.submit("researcher", actor="kimi", parent=child), "privacy.sandboxed")
    refused(
        w.submit("kimi", w.liza.joinpath("trip.md").as_uri(), actor="kimi", parent=child),
        "privacy.interlocutor",
    )
    assert "--parent" in w.submit("torgash", actor="adolf", parent=parent).output
    w.drain("torgash")
    assert MARK not in w.prompts()


def test_cron_tasks_are_judged_like_any_other(world: World, tmp_path: Path) -> None:
    w = world
    sched = tmp_path / "schedules.yaml"
    sched.write_text(
        "schedules:\n"
        "  - {name: leak, every: 1h, target: torgash, intent: prices, refs: ['" + w.diary.as_uri() + "']}\n"
        "  - {name: label, every: 1h, target: torgash, intent: prices, refs: ['"
        + w.diary.as_uri()
        + "#domain=shared']}\n"
        "  - {name: digest, every: 1h, target: adolf, intent: digest, refs: ['" + w.diary.as_uri() + "']}\n"
    )
    for name, rule in (("leak", "privacy.sandboxed"), ("label", "privacy.label")):
        res = w.cli("cron", "--file", str(sched), "--once", name)
        assert f"PRIVACY [{rule}" in res.output, res.output
    res = w.cli("cron", "--file", str(sched), "--once", "digest")
    assert "created" in res.output, res.output
    digest = int(res.output.split("task:")[1].split()[0])
    refused(w.submit("torgash", f"task:{digest}"), "privacy.sandboxed")
    refused(w.submit("adolf", f"task:{digest}", actor="elizaveta"), "privacy.interlocutor")
    w.drain("torgash")
    assert MARK not in w.prompts()


# -- A2A calls on a person's behalf -------------------------------------------------------------


def test_a2a_sync_calls_are_checked_where_the_refs_are_read(world: World) -> None:
    w = world
    runner = Runner(w.cards, w.env)
    for agent, caller, ref in (
        ("adolf", "elizaveta", w.diary.as_uri()),
        ("adolf", "elizaveta", f"file://{w.shared}/../{w.alvis.relative_to(w.base)}/diary.md"),
        ("torgash", "cli", w.diary.as_uri()),
        ("researcher", "alvis", w.diary.as_uri()),
        ("adolf", "alvis", w.diary.as_uri() + "#domain=shared"),
        ("adolf", "elizaveta", "task:1"),  # no board here: a task's domain is unknown
    ):
        answer = runner.run(agent, "what does it say?", [ref], key=f"k-{agent}-{caller}", caller=caller)
        assert answer.kind == "failed" and "PRIVACY [" in answer.text, answer
    ok = runner.run("adolf", "what does it say?", [w.diary.as_uri()], key="k-ok", caller="alvis")
    assert ok.kind == "done" and MARK in ok.text  # alvis's own assistant, for alvis
    w.stub.reset()
    ok = runner.run("adolf", "and this?", [f"file://{w.shared}/notes.md"], key="k-ok2", caller="elizaveta")
    assert ok.kind == "done" and NOTE in ok.text
    assert MARK not in w.prompts()


def test_a2a_async_calls_submit_as_the_caller(world: World) -> None:
    w = world
    # The A2A server submits an async call as "a2a:<caller>" (in-process, after its token
    # named the caller); a shell cannot claim that name: it names a person.
    with pytest.raises(PrivacyViolation) as exc:
        w.fab.submit("summarise the context", target="adolf", refs=[w.diary.as_uri()], actor="a2a:elizaveta")
    assert exc.value.rule == "privacy.interlocutor"
    assert w.fab.submit("summarise it", target="adolf", refs=[w.diary.as_uri()], actor="a2a:alvis").created
    res = CliRunner().invoke(
        main, ["submit", "--target", "adolf", "--intent", "x"], env={**w.env, "AGAP_ACTOR": "a2a:alvis"}
    )
    assert res.exit_code == EXIT_INVALID and "AGAP_ACTOR names alvis, a person" in res.output, res.output


def test_a2a_server_calls_on_elizavetas_behalf_never_reach_alvis_s_text(world: World) -> None:
    w = world
    liza, alvis = "elizaveta-token-" + "e" * 24, "alvis-token-" + "a" * 24
    tokens = TokenTable.from_pairs([("elizaveta", liza), ("alvis", alvis)], where="test")

    def connect() -> Fabric:
        return Fabric.connect(
            w.settings, cards=w.cards, port=KanboardClient(w.env["KANBOARD_URL"], w.env["KANBOARD_API_TOKEN"])
        )

    service = make_service(
        w.settings, w.cards, w.env, connect=connect, config=ServiceConfig(watch_seconds=0.1)
    )
    server = ServerThread(service, ["adolf", "torgash"], tokens).start()
    try:
        for agent, token, mode in (("adolf", liza, []), ("torgash", alvis, []), ("adolf", liza, ["--async"])):
            res = w.cli(
                "a2a",
                "call",
                f"{server.url}/{agent}",
                "what does it say?",
                "--ref",
                w.diary.as_uri(),
                "--token",
                token,
                *mode,
            )
            assert res.exit_code == 1 and "PRIVACY [privacy." in res.output, res.output
        res = w.cli(
            "a2a",
            "call",
            f"{server.url}/adolf",
            "what does it say?",
            "--ref",
            w.diary.as_uri(),
            "--token",
            alvis,
        )
        assert res.exit_code == 0 and MARK in res.output  # his own assistant, for him
    finally:
        server.stop()
    w.stub.reset()
    w.drain("adolf")  # nothing of the refused async call was queued
    assert MARK not in w.prompts()


# -- read time: past the submit, caught where the worker reads ---------------------------------


def test_a_file_swapped_after_the_submit_is_refused_where_it_is_read(world: World) -> None:
    w = world
    (w.shared / "box").mkdir()
    (w.shared / "box" / "diary.md").write_text("nothing here\n")
    first = json.loads(w.submit("torgash", f"file://{w.shared}/notes.md").output)["task_id"]
    second = json.loads(w.submit("torgash", f"file://{w.shared}/box/diary.md").output)["task_id"]
    (w.shared / "notes.md").unlink()
    (w.shared / "notes.md").symlink_to(w.diary)  # the file swapped for a link
    shutil.rmtree(w.shared / "box")
    (w.shared / "box").symlink_to(w.alvis, target_is_directory=True)  # the folder swapped
    w.drain("torgash")
    for tid in (first, second):
        state, reason = w.state(tid)
        assert state == State.DEAD and "PRIVACY [privacy.sandboxed" in reason, reason
    assert MARK not in w.prompts()


def test_tasks_written_past_the_policy_are_refused_at_claim_and_at_read(world: World) -> None:
    w = world
    tid = alvis_task(w)
    w.fab.policies = []  # a task on the board that no policy saw (an old version, a raw write)
    leaks = [
        w.fab.submit("go", target="torgash", refs=[r]).task_id for r in (f"task:{tid}", w.diary.as_uri())
    ]
    w.drain("torgash")  # the claim check
    for t in leaks:
        state, reason = w.state(t)
        assert state == State.DEAD and "PRIVACY [privacy." in reason, reason
    more = [
        w.fab.submit("again", target="torgash", refs=[r]).task_id for r in (f"task:{tid}", w.diary.as_uri())
    ]
    w.drain("torgash", claim_check=False)  # only the read-time guard left
    for t in more:
        state, reason = w.state(t)
        assert state == State.DEAD and "PRIVACY [privacy." in reason, reason
    assert MARK not in w.prompts()


# -- promotion: only the owner, only the object ------------------------------------------------


def promote(w: World, ref: str, owner: str = "alvis") -> dict[str, Any]:
    res = w.cli("promote", ref, "--owner", owner, "--json")
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.output)
    return out


def test_promotion_shares_exactly_the_approved_copy_and_only_on_the_owners_approval(world: World) -> None:
    w = world
    shopping = (w.alvis / "shopping.md").as_uri()
    refused(w.submit("torgash", shopping), "privacy.sandboxed")
    refused(w.cli("promote", shopping, "--owner", "elizaveta"), "privacy.promote")  # not hers
    res = w.cli("promote", f"file://{w.shared}/notes.md", "--owner", "alvis")
    assert res.exit_code == 2 and "already in the shared domain" in res.output
    ask = promote(w, f"file://{w.shared}/../{w.alvis.relative_to(w.base)}/shopping.md")
    assert ask["state"] == "asked" and ask["object"] == shopping and ask["shared_ref"] is None
    tid = ask["task_id"]
    view = w.fab.board.read(tid)
    assert view.current is not None and view.current.assignee == "alvis"  # in his inbox
    assert promote(w, shopping) == {**ask, "state": "waiting"}  # one task per object and content
    # Approval by anyone but the owner does not count: elizaveta, or the app token.
    w.approve(tid, "elizaveta")
    assert promote(w, shopping)["state"] == "waiting"
    w.fab.port.call("createComment", {"task_id": tid, "user_id": 0, "content": "approve"})
    assert promote(w, shopping)["state"] == "waiting"
    assert not (w.shared / "promoted").exists()
    refused(w.submit("torgash", shopping), "privacy.sandboxed")
    # The owner's own comment is what counts: exactly that content is copied, and shared.
    alvis = w.fab.board.layout.users["alvis"]
    w.fab.port.call("createComment", {"task_id": tid, "user_id": alvis, "content": "Approve."})
    done = promote(w, shopping)
    assert done["state"] == "shared" and done["shared_ref"].startswith(f"file://{w.shared}/promoted/alvis/")
    copy = Path(done["shared_ref"].removeprefix("file://"))
    assert copy.read_text() == (w.alvis / "shopping.md").read_text()
    assert any("Promoted: " in c.text for c in w.fab.board.comments(tid)), "recorded on the board"
    assert w.submit("torgash", done["shared_ref"]).exit_code == 0
    w.drain("torgash")
    assert SHARE in w.prompts()
    # Nothing else: the original, the diary next to it, the same file edited later.
    refused(w.submit("torgash", shopping), "privacy.sandboxed")
    refused(w.submit("torgash", w.diary.as_uri()), "privacy.sandboxed")
    (w.alvis / "shopping.md").write_text(f"shopping list: {SHARE}\nand {MARK}\n")
    later = promote(w, shopping)
    assert later["state"] == "asked" and later["task_id"] != tid  # new content, new approval
    assert MARK not in copy.read_text()
    diary = promote(w, w.diary.as_uri())
    w.approve(diary["task_id"], "elizaveta")
    assert promote(w, w.diary.as_uri())["state"] == "waiting"
    assert MARK not in w.prompts()
