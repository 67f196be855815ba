"""Submit policy: each rule refuses with a typed error naming it and its limit, and accepts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.embedded.local import LocalPort
from fabric.errors import ConfigError
from fabric.kanboard.layout import Column
from fabric.policy import (
    ClaimRefused,
    CycleDetected,
    DepthExceeded,
    PrivacyViolation,
    QuotaExceeded,
    TaintGated,
    TaintRefused,
    TrustViolation,
    check_claim,
    check_claim_on_board,
    recall_scope,
    ref_domain,
)
from fabric.policy_file import PolicyConfig, load_policy_config
from fabric.settings.resolve import Settings
from fabric.taint import GATE_ACTOR, task_of_ref
from fabric.task import State
from keeper.decisions import escalate_dead_letter
from tests.conftest import ROOT, FakeClock, make_fabric

ALVIS_NOTE = "file:///srv/agap/private/alvis/diary.md"
LIZA_NOTE = "file:///srv/agap/private/elizaveta/trip.md"


@pytest.fixture
def strict_fabric(cards: CardSet, clock: FakeClock, tmp_path: Path) -> Fabric:
    """A fabric whose policy file has small limits."""
    (tmp_path / "_policy.yaml").write_text(
        "quota:\n  default: {limit: 3, window: 1h}\n  agents:\n    adolf: {limit: 5, window: 10m}\n"
        "max_depth: 2\ngate_to: elizaveta\n"
        "domains:\n  'file:///srv/agap/private/alvis/': private:alvis\n"
        "tainted:\n  'file:///srv/agap/agents/researcher/': researcher\n"
    )
    (tmp_path / "_router.yaml").write_text((ROOT / "cards" / "_router.yaml").read_text())
    settings = Settings(cards_dir=tmp_path, board_url="local://", board_token="x")
    return make_fabric(LocalPort(clock=clock), cards, clock, settings)


def approve(fab: Fabric, task_id: int, human: str = "alvis") -> None:
    """What the keeper does when a human drags a gate to Done."""
    lease = fab.ledger.claim(fab.show(task_id), human, lease_seconds=60)
    fab.ledger.complete(lease, "kanboard:approved")


# -- configuration and refs ---------------------------------------------------------------


def test_the_shipped_policy_file_loads() -> None:
    cfg = load_policy_config(ROOT / "cards" / "_policy.yaml")
    assert cfg.max_depth == 8 and cfg.quota.limit == 60 and cfg.quota_for("researcher").limit == 20
    assert cfg.gate_to == "alvis"


def test_an_empty_policy_file_reads_as_no_file(tmp_path: Path) -> None:
    # The file's schema (fabric.policy_models) and PolicyConfig spell the defaults apart.
    p = tmp_path / "_policy.yaml"
    p.write_text("# nothing said\n")
    assert load_policy_config(p) == replace(PolicyConfig(), source=str(p))
    assert load_policy_config(tmp_path / "absent.yaml") == PolicyConfig()


def test_policy_files_are_checked(tmp_path: Path) -> None:
    p = tmp_path / "_policy.yaml"
    p.write_text("domains: {'file:///x/': private}\n")
    with pytest.raises(ConfigError, match="not a privacy domain"):
        load_policy_config(p)
    p.write_text("quota: {default: {limit: 3, window: soon}}\n")
    with pytest.raises(ConfigError, match=r"quota\.default\.window"):
        load_policy_config(p)
    p.write_text("max_depht: 3\n")
    with pytest.raises(ConfigError, match="max_depht"):
        load_policy_config(p)


def test_ref_domains_come_from_what_the_ref_resolves_to_never_a_label() -> None:
    cfg = load_policy_config(ROOT / "cards" / "_policy.yaml")
    assert ref_domain(ALVIS_NOTE, cfg) == "private:alvis"
    assert ref_domain(LIZA_NOTE, cfg) == "private:elizaveta"
    assert ref_domain("file:///srv/agap/shared/../private/%61lvis//x.md", cfg) == "private:alvis"
    assert ref_domain("FILE://LOCALHOST/srv/agap/private%2Falvis/x.md", cfg) == "private:alvis"
    assert ref_domain("hindsight://adolf-%61lvis//notes", cfg) == "private:alvis"
    # Bank ids are case-sensitive (as Hindsight's): another bank, whose owner no rule names.
    assert ref_domain("hindsight://ADOLF-alvis//notes", cfg) == "unknown"
    assert ref_domain("file:///srv/agap/private/alvisx/y.md", cfg) == "shared"  # whole segments
    assert ref_domain("https://example.org/page", cfg) == "shared"
    assert ref_domain("git+file:///srv/agap/private/alvis/notes.git#main", cfg) == "private:alvis"
    assert (
        ref_domain("file:///srv/agap/shared/x.md#feature/domain-model", cfg) == "shared"
    )  # a branch, no label
    for labelled in ("file:///srv/agap/private/alvis/x#domain=shared", "file:///x#%64omain=private:alvis"):
        with pytest.raises(PrivacyViolation, match=r"privacy\.label") as err:
            ref_domain(labelled, cfg)
        assert err.value.exit_code == 6
    assert task_of_ref("task:12") == ("id", 12)
    assert task_of_ref("kanboard://task/7/file/result-e1.md") == ("id", 7)
    assert task_of_ref("file:///results/0123456789abcdef/result-e1.md") == ("uid", "0123456789abcdef")
    assert task_of_ref("https://example.org") is None


def test_recall_for_a_human_is_their_private_domain_plus_shared(cards: CardSet) -> None:
    assert recall_scope(cards, "alvis") == {"private:alvis", "shared"}
    assert recall_scope(cards, "elizaveta") == {"private:elizaveta", "shared"}


# -- creation quota ------------------------------------------------------------------------


def test_an_agent_over_its_creation_quota_is_refused(strict_fabric: Fabric, clock: FakeClock) -> None:
    fab = strict_fabric
    for i in range(3):
        fab.submit(f"lookup {i}", target="gemma-local", actor="torgash", key=f"k{i}")
    with pytest.raises(QuotaExceeded) as err:
        fab.submit("lookup 3", target="gemma-local", actor="torgash")
    e = err.value
    assert (e.code, e.rule, e.limit) == ("QUOTA_EXCEEDED", "creation-quota", "3 per 1h")
    assert "QUOTA_EXCEEDED [creation-quota, limit: 3 per 1h]: agent 'torgash' created 3 tasks" in e.line()
    assert e.exit_code == 6
    # An idempotent replay of a task that exists is not a new task: it is answered.
    again = fab.submit("lookup 0", target="gemma-local", actor="torgash", key="k0")
    assert not again.created
    # Humans and non-agent actors (cli, cron, keeper) have no quota; other agents their own.
    fab.submit("lookup 4", target="gemma-local", actor="alvis")
    fab.submit("lookup 5", target="gemma-local", actor="cron")
    for i in range(5):
        fab.submit(f"adolf {i}", target="gemma-local", actor="adolf")
    with pytest.raises(QuotaExceeded, match="5 per 10m"):
        fab.submit("adolf 5", target="gemma-local", actor="adolf")
    # The window rolls.
    clock.advance(3601)
    assert fab.submit("lookup 3", target="gemma-local", actor="torgash").created


def test_no_policy_costs_a_round_trip_for_a_plain_cli_submit(local_fabric: Fabric) -> None:
    local_fabric.port.stats.reset()
    local_fabric.submit("x", target="kimi", refs=["file:///notes/a.md"])
    assert local_fabric.port.stats.trips == 2


# -- depth cap and cycles ------------------------------------------------------------------


def test_a_chain_deeper_than_the_cap_is_refused(strict_fabric: Fabric) -> None:
    fab = strict_fabric
    root = fab.submit("plan the week", target="adolf")
    c1 = fab.submit("find free slots", target="gemma-local", parent=root.task_id)
    c2 = fab.submit("check the calendar", target="qwen-remote", parent=c1.task_id)
    assert fab.show(c2.task_id).spec.ancestry == (root.uid, c1.uid)  # type: ignore[union-attr]
    with pytest.raises(DepthExceeded) as err:
        fab.submit("and again", target="kimi", parent=c2.task_id)
    assert (err.value.rule, err.value.limit) == ("ancestry-depth", "2")
    assert "would be at depth 3" in err.value.line()


def test_a_task_repeating_an_ancestors_target_and_intent_is_a_cycle(local_fabric: Fabric) -> None:
    fab = local_fabric
    root = fab.submit("Summarise the inbox", target="kimi", key="root")
    child = fab.submit("classify the mails", target="gemma-local", parent=root.task_id)
    with pytest.raises(CycleDetected) as err:  # found through the grandparent lookup
        fab.submit("  summarise   the INBOX ", target="kimi", parent=child.task_id)
    assert err.value.code == "CYCLE" and err.value.rule == "provenance-cycle"
    assert f"ancestor #{root.task_id} already asked 'kimi'" in err.value.line()
    with pytest.raises(CycleDetected):  # the direct parent
        fab.submit("classify the mails", target="gemma-local", parent=child.task_id)
    # The same intent elsewhere, or another intent for the same agent, is fine.
    assert fab.submit("Summarise the inbox", target="qwen-remote", parent=child.task_id).created
    assert fab.submit("Summarise the outbox", target="kimi", parent=child.task_id).created


# -- privacy -------------------------------------------------------------------------------


def test_a_sandboxed_agent_never_receives_a_private_ref(local_fabric: Fabric) -> None:
    with pytest.raises(PrivacyViolation) as err:
        local_fabric.submit("price this", target="torgash", refs=[ALVIS_NOTE])
    assert (err.value.rule, err.value.limit) == ("privacy.sandboxed", "shared domains only")
    assert local_fabric.submit(
        "price this", target="torgash", refs=["file:///srv/agap/shared/list.md"]
    ).created


def test_an_agent_may_only_see_the_domains_on_its_card(local_fabric: Fabric) -> None:
    with pytest.raises(PrivacyViolation) as err:
        local_fabric.submit("plan", target="qwen-remote", refs=[LIZA_NOTE], actor="elizaveta")
    assert err.value.rule == "privacy.card-domains" and err.value.limit == "shared"
    assert local_fabric.submit("plan", target="kimi", refs=[LIZA_NOTE], actor="elizaveta").created
    # A constraint target routes around the agents that may not see the refs.
    r = local_fabric.submit("plan", constraints="cap=tools", refs=[LIZA_NOTE], actor="elizaveta")
    assert r.queue in ("adolf", "kimi")


def test_work_for_one_human_never_references_anothers_private_domain(local_fabric: Fabric) -> None:
    fab = local_fabric
    with pytest.raises(PrivacyViolation) as err:
        fab.submit("remind me", target="adolf", refs=[LIZA_NOTE], actor="alvis")
    assert err.value.rule == "privacy.interlocutor"
    assert "work for alvis may not reference private:elizaveta" in err.value.line()
    assert fab.submit("remind me", target="adolf", refs=[ALVIS_NOTE], actor="alvis").created
    # Down the chain too: adolf working for alvis may not pull elizaveta's notes in.
    root = fab.submit("plan my week", target="adolf", actor="alvis")
    child = fab.submit("look at calendars", target="kimi", actor="adolf", parent=root.task_id)
    with pytest.raises(PrivacyViolation, match=r"privacy\.interlocutor"):
        fab.submit("merge plans", target="kimi", refs=[LIZA_NOTE], actor="adolf", parent=child.task_id)
    assert fab.submit(
        "merge plans", target="kimi", refs=[ALVIS_NOTE], actor="adolf", parent=child.task_id
    ).created


# -- taint ---------------------------------------------------------------------------------


def test_tainted_output_into_a_trusted_agent_creates_a_gate_and_is_refused(strict_fabric: Fabric) -> None:
    fab = strict_fabric
    research = fab.submit("find reviews of the heat pump", target="researcher")
    with pytest.raises(TaintGated) as err:
        fab.submit("remember the best heat pump", target="adolf", refs=[research.ref], actor="cli")
    e = err.value
    assert (e.code, e.rule) == ("TAINT_GATED", "taint.promotion")
    assert e.limit == "tainted output stays in its producer's own context"
    assert e.human == "elizaveta"  # gate_to: the submitter is not a human
    gate = fab.show(e.gate.task_id)
    assert gate.spec is not None and gate.spec.actor == GATE_ACTOR and gate.spec.target == "elizaveta"
    assert gate.spec.refs == (research.ref,) and gate.spec.priority == 2
    assert gate.row["column_id"] == fab.board.layout.columns[Column.WAITING]
    assert gate.row["owner_id"] == fab.board.layout.users["elizaveta"]
    assert gate.row["title"].startswith("Approve tainted input for adolf?")
    # Asking again does not pile up gates.
    with pytest.raises(TaintGated) as again:
        fab.submit("remember the best heat pump", target="adolf", refs=[research.ref], actor="cli")
    assert again.value.gate.task_id == e.gate.task_id and not again.value.gate.created
    # An unapproved gate cited as a ref does not open the way.
    with pytest.raises(TaintGated):
        fab.submit(
            "remember the best heat pump", target="adolf", refs=[research.ref, e.gate.ref], actor="cli"
        )
    approve(fab, e.gate.task_id, "elizaveta")
    ok = fab.submit(
        "remember the best heat pump", target="adolf", refs=[research.ref, e.gate.ref], actor="cli"
    )
    assert ok.created
    # The approval covers these refs into adolf only.
    with pytest.raises(TaintGated):
        fab.submit("remember the best heat pump", target="kimi", refs=[research.ref, e.gate.ref], actor="cli")


def test_tainted_output_may_go_back_to_its_producer_or_to_a_human(local_fabric: Fabric) -> None:
    fab = local_fabric
    research = fab.submit("find reviews", target="researcher")
    assert fab.submit("dig deeper", target="researcher", refs=[research.ref]).created
    assert fab.submit("look at this", target="alvis", refs=[research.ref]).created
    # The gate goes to the human who submitted.
    with pytest.raises(TaintGated) as err:
        fab.submit("store it", target="kimi", refs=[research.ref], actor="alvis")
    assert err.value.human == "alvis"


def test_taint_is_found_through_result_files_and_configured_prefixes(strict_fabric: Fabric) -> None:
    fab = strict_fabric
    research = fab.submit("find reviews", target="researcher")
    result = f"file:///var/agap/results/{research.uid}/result-e1.md"
    with pytest.raises(TaintGated):
        fab.submit("summarise", target="kimi", refs=[result])
    with pytest.raises(TaintGated):
        fab.submit("summarise", target="kimi", refs=["file:///srv/agap/agents/researcher/n.md"])
    trusted = fab.submit("find reviews", target="qwen-remote")
    assert fab.submit(
        "summarise", target="kimi", refs=[trusted.ref, f"file:///var/agap/results/{trusted.uid}/result-e1.md"]
    ).created


# -- at claim ------------------------------------------------------------------------------


def test_check_claim_refuses_what_the_card_may_not_take(local_fabric: Fabric, cards: CardSet) -> None:
    fab = local_fabric
    cfg = load_policy_config(ROOT / "cards" / "_policy.yaml")
    spec = fab.show(fab.submit("plan", target="kimi", refs=[ALVIS_NOTE]).task_id).spec
    assert spec is not None
    check_claim(cards.get("kimi"), spec, cfg)  # accepted
    sandboxed = replace(cards.get("torgash"), queue="kimi")
    with pytest.raises(PrivacyViolation, match=r"privacy\.sandboxed"):
        check_claim(sandboxed, spec, cfg)
    with pytest.raises(ClaimRefused) as err:
        check_claim(cards.get("qwen-remote"), spec, cfg)
    assert err.value.rule == "claim.queue" and err.value.code == "CLAIM_REFUSED"
    routed = fab.show(fab.submit("x", constraints="tier>=large,trust>=trusted").task_id).spec
    assert routed is not None
    demoted = replace(cards.get("kimi"), trust="sandboxed", privacy_domains=["shared"])
    with pytest.raises(TrustViolation, match=r"trust\.floor"):
        check_claim(demoted, routed, PolicyConfig())
    check_claim(cards.get("kimi"), routed)


def test_claim_refuses_tainted_refs_that_bypassed_the_submit_policy(
    local_fabric: Fabric, cards: CardSet
) -> None:
    fab = local_fabric
    research = fab.submit("find reviews", target="researcher")
    fab.policies = []  # a task written without the policy (an old client, a hand edit)
    sneaky = fab.show(fab.submit("store it", target="kimi", refs=[research.ref]).task_id).spec
    assert sneaky is not None
    with pytest.raises(TaintRefused) as err:
        check_claim_on_board(fab.policy_context(), cards.get("kimi"), sneaky)
    assert (err.value.code, err.value.rule) == ("TAINTED", "taint.claim")
    own = fab.show(fab.submit("dig", target="researcher", refs=[research.ref]).task_id).spec
    assert own is not None
    check_claim_on_board(fab.policy_context(), cards.get("researcher"), own)  # its own output: accepted


# -- escalation: always ask ----------------------------------------------------------------


def test_a_dead_letter_becomes_a_decision_for_a_human(local_fabric: Fabric) -> None:
    fab = local_fabric
    r = fab.submit("parse the invoices", target="gemma-local", actor="alvis")
    assert escalate_dead_letter(fab, fab.show(r.task_id)) is None  # not dead
    fab.ledger.dead_letter(r.task_id, "worker-1", "poison: the model refuses the format")
    dead = fab.show(r.task_id)
    decision = escalate_dead_letter(fab, dead)
    assert decision is not None and decision.created and decision.queue == "alvis"
    d = fab.show(decision.task_id)
    assert d.spec is not None and d.spec.refs == (f"task:{r.task_id}",) and d.spec.priority == 2
    assert d.spec.actor == "keeper" and d.row["title"] == f"Decide: task #{r.task_id} died on gemma-local"
    assert "dead-lettered on gemma-local (tier small): poison" in d.spec.intent
    assert "does not retry it on a bigger model" in d.spec.intent
    assert d.current is not None and d.current.assignee == "alvis"
    # Idempotent per dead epoch; the decision itself is never escalated.
    again = escalate_dead_letter(fab, dead)
    assert again is not None and again.task_id == decision.task_id and not again.created
    fab.ledger.dead_letter(decision.task_id, "x", "test")
    assert escalate_dead_letter(fab, fab.show(decision.task_id)) is None
    # The decision goes to the policy's human when nobody human submitted the task.
    r2 = fab.submit("parse more", target="gemma-local", actor="cron")
    fab.ledger.dead_letter(r2.task_id, "worker-1", "attempts exhausted")
    d2 = escalate_dead_letter(fab, fab.show(r2.task_id))
    assert d2 is not None and d2.queue == "alvis"
    assert fab.show(r2.task_id).current.state == State.DEAD  # type: ignore[union-attr]
