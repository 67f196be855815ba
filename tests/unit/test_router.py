"""Routing: constraint sets over available agents, max cost, privacy, auto rules, re-routing."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric.cards import CardSet
from fabric.constraints import Constraints, constraints_from_dict, parse_constraints
from fabric.core import Fabric
from fabric.embedded.local import LocalPort
from fabric.errors import ConfigError, InvalidInput
from fabric.router import RULE, choose
from fabric.router_rules import load_router_policy
from fabric.settings.resolve import Settings
from fabric.task import State
from keeper.decisions import reroute_parked
from tests.conftest import FakeClock, make_fabric


def park(fab: Fabric, queue: str, reason: str = "quota window spent", until: float | None = None) -> None:
    fab.board.publish_park(queue, {"parked": True, "reason": reason, "until": until})


def unpark(fab: Fabric, queue: str) -> None:
    fab.board.publish_park(queue, {"parked": False, "reason": "", "until": None})


# -- constraint sets -------------------------------------------------------------------


def test_choose_is_backwards_compatible_and_deterministic(cards: CardSet) -> None:
    choice = choose(cards, parse_constraints("cap=code,trust>=trusted"))
    assert choice.card.id == "qwen-remote"  # free beats standard (kimi) and premium (coder)
    assert choice.reasons["kimi"].startswith("qualifies, ranked 2: costs more")
    assert choice.reasons["claude-coder"].startswith("qualifies, ranked 3")
    assert choice.reasons["torgash"].startswith("no: lacks code")
    assert choice.reasons["alvis"] == "no: is a human; lacks code"
    assert all(
        choose(cards, parse_constraints("cap=code,trust>=trusted")).card.id == "qwen-remote" for _ in range(5)
    )


def test_a_parked_agent_is_passed_over_while_another_qualifies(cards: CardSet) -> None:
    parks = {"qwen-remote": {"parked": True, "reason": "node asleep", "until": None}}
    choice = choose(cards, parse_constraints("cap=code,trust>=trusted"), parks=parks, now=0)
    assert choice.card.id == "kimi" and not choice.waiting
    assert choice.reasons["qwen-remote"] == "qualifies but parked: node asleep"
    # A park whose `until` has passed no longer counts.
    stale = {"qwen-remote": {"parked": True, "reason": "x", "until": 100.0}}
    assert choose(cards, parse_constraints("cap=code"), parks=stale, now=200).card.id == "qwen-remote"


def test_when_every_qualifier_is_parked_the_first_to_resume_is_chosen(cards: CardSet) -> None:
    parks = {
        "qwen-remote": {"parked": True, "reason": "node asleep", "until": None},
        "kimi": {"parked": True, "reason": "quota", "until": 5000.0},
        "claude-coder": {"parked": True, "reason": "budget", "until": 9000.0},
    }
    choice = choose(cards, parse_constraints("cap=code,trust>=trusted"), parks=parks, now=0)
    assert choice.card.id == "kimi" and choice.waiting
    assert choice.reasons["kimi"].startswith("chosen: every qualifying agent is parked")
    assert "resumes first" in choice.why()


def test_the_governors_reserve_is_open_to_interactive_tasks_only(local_fabric: Fabric) -> None:
    fab = local_fabric
    park(
        fab, "kimi", "reserved for interactive work: 12 of 60 left in the 5h window", until=fab.clock() + 3600
    )
    background = fab.route(intent="x", constraints="tier>=large", priority="low")
    assert background.waiting and background.reasons["kimi"].startswith(
        "chosen: every qualifying agent is parked"
    )
    interactive = fab.route(intent="x", constraints="tier>=large", priority="high")
    assert not interactive.waiting and interactive.reasons["kimi"].startswith("chosen: available")
    # A background task on the reserved queue moves if another agent is free; an
    # interactive one stays.
    r = fab.submit("write code", constraints="cap=code,trust>=trusted,tier>=large", priority="high")
    assert r.queue == "kimi" and reroute_parked(fab, fab.show(r.task_id)) is None


def test_max_cost_uses_the_cards_per_task_cap(cards: CardSet) -> None:
    c = parse_constraints("cap=code,max_cost<=1")
    assert c.max_cost_usd == 1.0 and c.text() == "cap=code,max_cost<=1"
    parks = {"qwen-remote": {"parked": True, "reason": "asleep", "until": None}}
    choice = choose(cards, c, parks=parks, now=0)
    assert choice.card.id == "kimi"  # $0.50 per task
    assert choice.reasons["claude-coder"] == "no: max cost $2 > $1"
    tight = choose(cards, parse_constraints("cap=chat,max_cost<=0.15"))
    assert tight.reasons["torgash"].startswith("qualifies")  # $0.10
    assert tight.reasons["kimi"].endswith("max cost $0.5 > $0.15")
    with pytest.raises(InvalidInput, match="max_cost must be a positive number"):
        parse_constraints("max_cost<=-3")


def test_candidates_that_may_not_see_the_refs_domains_do_not_qualify(cards: CardSet) -> None:
    choice = choose(cards, parse_constraints("cap=chat"), domains={"private:alvis"})
    assert choice.reasons["torgash"].endswith("may not see private:alvis")
    assert choice.card.id in ("adolf", "gemma-local")
    with pytest.raises(InvalidInput, match="no agent satisfies"):
        choose(cards, parse_constraints("cap=marketplace"), domains={"private:alvis"})


def test_constraints_round_trip_through_the_spec() -> None:
    c = parse_constraints("tier>=large,cap=tools+code,trust>=trusted,cost<=standard,max_cost<=0.5")
    assert constraints_from_dict(c.as_dict()) == c
    merged = parse_constraints("tier>=medium,cost<=premium").merged(
        parse_constraints("tier>=large,cap=x,cost<=cheap,max_cost<=2")
    )
    assert merged == Constraints("large", frozenset({"x"}), None, "cheap", 2.0)


# -- route() and submit ----------------------------------------------------------------


def test_a_direct_target_reads_nothing_and_records_nothing(local_fabric: Fabric) -> None:
    local_fabric.port.stats.reset()
    choice = local_fabric.route(intent="x", target="kimi")
    assert choice.mode == "direct" and choice.card.id == "kimi" and choice.recorded() == {}
    assert local_fabric.port.stats.trips == 0
    assert "never re-routed" in choice.render()


def test_a_routed_submit_records_the_set_and_why(local_fabric: Fabric) -> None:
    fab = local_fabric
    park(fab, "qwen-remote", "node asleep")
    r = fab.submit("write the parser", constraints="cap=code,trust>=trusted")
    view = fab.show(r.task_id)
    assert view.spec is not None and view.spec.target == "kimi"
    assert view.spec.constraints == {"capabilities": ["code"], "trust": "trusted"}
    notes = [c.text for c in fab.board.comments(r.task_id)]
    assert any(n.startswith("Routed — cap=code,trust>=trusted: kimi (" + RULE) for n in notes), notes


def test_an_untrusted_target_marks_the_task_tainted(local_fabric: Fabric) -> None:
    r = local_fabric.submit("look this up", target="researcher")
    spec = local_fabric.show(r.task_id).spec
    assert spec is not None and spec.constraints == {"taint": "researcher"}


def test_auto_routes_by_the_rules_in_cards_router_yaml(local_fabric: Fabric) -> None:
    fab = local_fabric
    cases = [
        ("fix the bug in the parser", None, "code", "qwen-remote"),
        ("reflect on this week's notes", None, "reflect", "kimi"),
        ("what is the weather", None, "small", "gemma-local"),
        ("compare prices", "cap=marketplace", "marketplace", "torgash"),
        ("x" * 500, None, "medium", "qwen-remote"),
        ("y" * 3000, None, "default", "kimi"),
    ]
    for intent, extra, rule, pick in cases:
        choice = fab.route(intent=intent, target="auto", constraints=extra)
        assert (choice.auto_rule, choice.card.id) == (rule, pick), choice.render()
    # The router card's id means auto too; the caller's constraints are merged in.
    choice = fab.route(intent="what is the weather", target="router", constraints="cap=tools")
    assert choice.mode == "auto" and choice.card.id == "qwen-remote"
    assert (
        choice.constraints is not None
        and choice.constraints.text() == "tier>=small,cap=tools,trust>=trusted,cost<=cheap"
    )
    text = choice.render()
    assert "auto: task size small; router rules, first match wins:" in text
    assert "- research: capabilities not asked for: research" in text
    assert "* small: matches (size in small)" in text
    assert "pick: qwen-remote (queue qwen-remote)" in text
    r = fab.submit("what is the weather", target="auto")
    spec = fab.show(r.task_id).spec
    assert spec is not None and spec.target == "gemma-local"
    assert spec.constraints["route"] == "auto:small"


def test_router_rules_files_are_checked(tmp_path: Path) -> None:
    p = tmp_path / "_router.yaml"
    p.write_text("rules:\n  - name: x\n    when: {intent: '('}\n")
    with pytest.raises(ConfigError, match="regular expression"):
        load_router_policy(p)
    p.write_text("rules:\n  - name: x\n    constraints: 'tier>=huge'\n")
    with pytest.raises(ConfigError, match="unknown tier"):
        load_router_policy(p)
    p.write_text("rules:\n  - name: only-code\n    when: {intent: code}\n")
    with pytest.raises(ConfigError, match="no router rule matches"):
        load_router_policy(p).pick("hello", [], Constraints())
    assert load_router_policy(tmp_path / "missing.yaml").rules[0].name == "default"


def test_router_rules_apply_without_a_file(cards: CardSet, clock: FakeClock, tmp_path: Path) -> None:
    settings = Settings(cards_dir=tmp_path, board_url="local://", board_token="x")
    fab = make_fabric(LocalPort(clock=clock), cards, clock, settings)
    # The built-in catch-all: any agent that takes work, by the rule.
    assert fab.route(intent="anything", target="auto").auto_rule == "default"


# -- re-routing --------------------------------------------------------------------------


def test_a_constraint_task_on_a_parked_queue_is_rerouted_once(local_fabric: Fabric) -> None:
    fab = local_fabric
    r = fab.submit("write the parser", constraints="cap=code,trust>=trusted")
    view = fab.show(r.task_id)
    assert view.spec is not None and view.spec.target == "qwen-remote"
    assert reroute_parked(fab, view) is None  # not parked: stays
    park(fab, "qwen-remote", "node asleep")
    moved = reroute_parked(fab, fab.show(r.task_id))
    assert moved is not None and moved.created and moved.queue == "kimi"
    old = fab.show(r.task_id)
    assert old.current is not None and old.current.state == State.CANCELED
    assert "re-routed: qwen-remote is parked (node asleep)" in (old.current.reason or "")
    new = fab.show(moved.task_id)
    assert new.spec is not None and new.spec.constraints == {"capabilities": ["code"], "trust": "trusted"}
    # Calling again (a keeper that crashed after the cancel) finishes, never duplicates.
    again = reroute_parked(fab, old)
    assert again is not None and again.task_id == moved.task_id and not again.created


def test_a_direct_target_is_never_rerouted(local_fabric: Fabric) -> None:
    fab = local_fabric
    r = fab.submit("write the parser", target="qwen-remote")
    park(fab, "qwen-remote", "node asleep")
    assert reroute_parked(fab, fab.show(r.task_id)) is None
    cur = fab.show(r.task_id).current
    assert cur is not None and cur.state == State.QUEUED


def test_no_reroute_when_every_other_qualifier_is_parked_too(local_fabric: Fabric) -> None:
    fab = local_fabric
    r = fab.submit("think hard", constraints="tier>=large")
    park(fab, "kimi", "quota window spent", until=fab.clock() + 600)
    assert reroute_parked(fab, fab.show(r.task_id)) is None
    unpark(fab, "kimi")


def test_route_explain_cites_the_rule(cards: CardSet) -> None:
    text = choose(cards, parse_constraints("tier>=large")).render()
    assert f"rule: {RULE}" in text
    assert "  * kimi          chosen: available, standard, tier large" in text
    assert "  - gemma-local   no: tier small < large" in text
    assert text.endswith("pick: kimi (queue kimi)")
