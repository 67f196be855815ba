"""Who an agent may hand work to: the targets ``list_targets`` and ``agap://targets`` list.

A model acting through MCP cannot guess ids (is it ``kimi``? ``alvis``?), so the server
lists what its card may submit to, with what each is for and whether it can take work now.
The scope is the submit scope (:class:`~fabric.apps.mcp.agent.AgentSubmitScope`): an
untrusted card reaches only itself and the people; every other card reaches every agent
and person, and ``auto`` (the router picks). Router cards are not targets of their own:
``auto`` stands for them.

Availability is what the fabric knows *now* without asking a provider: a queue its worker
parked (quota spent, budget reached, a health probe failing, a provider's 429: the park
state the worker publishes on the board), else the card's calendar (a person's waking
hours and vacation). A queue no worker parked counts as available.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fabric.availability import Availability
from fabric.cards import Card, CardSet

AUTO = "auto"


def may_target(caller: Card, card: Card) -> bool:
    """Whether ``caller`` may submit to ``card`` through MCP (the submit scope's rule)."""
    if card.kind == "router":
        return False
    return caller.trust != "untrusted" or card.id == caller.id or card.is_human


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z") if ts else None


def availability_now(card: Card, parks: dict[str, dict[str, Any]], now: float) -> dict[str, Any]:
    """``available``, and why not (``reason``) and until when (``until``, UTC) if known."""
    park = parks.get(card.queue_name) or {}
    if park.get("parked"):
        until = park.get("until")
        return {
            "available": False,
            "reason": f"parked: {park.get('reason') or 'by its worker'}",
            "until": _iso(until if isinstance(until, (int, float)) else None),
        }
    verdict = Availability.from_card(card).check(now)
    if not verdict.available:
        return {"available": False, "reason": verdict.reason, "until": _iso(verdict.until)}
    return {"available": True, "reason": "", "until": None}


def _row(caller: Card, card: Card, parks: dict[str, dict[str, Any]], now: float) -> dict[str, Any]:
    shared = sorted(set(caller.privacy_domains) & set(card.privacy_domains))
    return {
        "id": card.id,
        "name": card.name,
        "kind": card.kind,
        "description": card.description,
        "capabilities": list(card.capabilities),
        "tier": card.tier,
        "trust": card.trust,
        "cost_class": card.cost_class,
        "shared_privacy_domains": shared,
        **availability_now(card, parks, now),
    }


def target_rows(
    caller: Card, cards: CardSet, parks: dict[str, dict[str, Any]], now: float
) -> list[dict[str, Any]]:
    """The targets ``caller`` may submit to, ``auto`` first when it may use the router."""
    rows = [_row(caller, c, parks, now) for c in cards if may_target(caller, c)]
    routers = [c for c in cards if c.kind == "router"]
    if routers and caller.trust != "untrusted":
        router = routers[0]
        rows.insert(
            0,
            {
                "id": AUTO,
                "name": "any fitting agent",
                "kind": "router",
                "description": router.description
                or "The router picks an available agent by the task's needs, quota and cost.",
                "capabilities": [],
                "tier": None,
                "trust": router.trust,
                "cost_class": None,
                "shared_privacy_domains": sorted(
                    set(caller.privacy_domains) & set(routers[0].privacy_domains)
                ),
                "available": True,
                "reason": "",
                "until": None,
            },
        )
    return rows


def target_ids(caller: Card, cards: CardSet) -> list[str]:
    """The ids ``caller`` may pass as ``target`` (for an error line)."""
    ids = [c.id for c in cards if may_target(caller, c)]
    if caller.trust != "untrusted" and any(c.kind == "router" for c in cards):
        ids.insert(0, AUTO)
    return ids


__all__ = ["AUTO", "availability_now", "may_target", "target_ids", "target_rows"]
