"""Which model a persona thinks with: its backbone, resolved from the cards.

A persona names the strength it needs (``backbone.constraints``: a tier and capabilities)
or one model card (``backbone.model``), not an endpoint, so swapping its backbone is an
edit of those lines. The choice among the model cards that fit is fixed and explainable:

1. the model card must satisfy the tier and every capability;
2. it must be allowed every privacy domain the persona reads (a backbone sees the
   persona's whole context, so a private-domain persona never lands on a shared-only model);
3. of those, the smallest sufficient tier, then the cheapest cost class, then the card id.

The worker, the A2A server and the eval gate all call :func:`with_backbone`, so the model
a persona calls, and whose a(t) it spends, is the one resolved here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from fabric.cards.fields import cost_rank, tier_rank
from fabric.cards.schema import Card, satisfies
from fabric.errors import InvalidInput
from fabric.plain import Plain

__all__ = [
    "RECORD_FILE",
    "BackboneChange",
    "BackboneChoice",
    "backbone_changes",
    "backbone_choices",
    "read_record",
    "resolve_backbone",
    "with_backbone",
    "write_record",
]


class BackboneChoice(Plain):
    """One model card considered for a persona's backbone, and why it was or was not taken."""

    card: Card
    fits: bool  # the one chosen when all are available
    why: str
    eligible: bool = False  # fits the constraints and may see the persona's domains


def _why_not(persona: Card, model: Card) -> str:
    backbone = persona.backbone
    assert backbone is not None and backbone.constraints is not None
    want = backbone.constraints
    if not satisfies(model, want.tier, want.capabilities):
        missing = sorted(set(want.capabilities) - set(model.capabilities))
        parts = []
        if want.tier and not satisfies(model, want.tier, []):
            parts.append(f"tier {model.tier or 'none'} < {want.tier}")
        if missing:
            parts.append(f"lacks {', '.join(missing)}")
        return "; ".join(parts)
    hidden = sorted(set(persona.privacy_domains) - set(model.privacy_domains))
    if hidden:
        return f"may not see {', '.join(hidden)}"
    return ""


def _preference(model: Card) -> tuple[int, int, str]:
    return (
        tier_rank(model.tier) if model.tier else 99,
        cost_rank(model.cost_class) if model.cost_class else 99,
        model.id,
    )


def backbone_choices(persona: Card, cards: Iterable[Card]) -> list[BackboneChoice]:
    """Every model card, best fit first, each with the reason (``agap route --explain``)."""
    backbone = persona.backbone
    models = [c for c in cards if c.kind == "model"]
    if backbone is None:
        return []
    if backbone.model is not None:
        named = backbone.model
        pin = "named by backbone.model"
        return [
            BackboneChoice(m, m.id == named, pin if m.id == named else "", m.id == named)
            for m in models  # pinned: the one named, nothing else
        ]
    rated = [(m, _why_not(persona, m)) for m in models]
    rated.sort(key=lambda item: (item[1] != "", _preference(item[0])))
    chosen = next((m for m, why in rated if not why), None)
    return [
        BackboneChoice(
            m,
            m is chosen,
            why or ("closest fit" if m is chosen else "fits; used when a closer fit is parked"),
            not why,
        )
        for m, why in rated
    ]


def resolve_backbone(persona: Card, cards: Iterable[Card]) -> Card | None:
    """The model card ``persona`` thinks with, or None (no backbone, or nothing fits)."""
    return next((c.card for c in backbone_choices(persona, cards) if c.fits), None)


def with_backbone(card: Card, cards: Iterable[Card], gated: str | None = None) -> Card:
    """``card`` calling its backbone's model: the backbone decides, whatever
    ``runtime.model`` says (``agap cards validate`` flags a disagreement). ``gated``: the
    model the eval gate last passed for it, kept while it still fits, so a card edit that
    changes the resolution takes effect only once the gate has passed it. A card without
    a backbone, or whose backbone nothing fits, is returned as it is."""
    if card.backbone is None:
        return card
    fitting = [c.card for c in backbone_choices(card, cards) if c.eligible]  # closest first
    model = next((m for m in fitting if gated and m.runtime.model == gated), None)
    model = model or (fitting[0] if fitting else None)
    if model is None or not model.runtime.model:
        return card
    runtime = replace(
        card.runtime,
        model=model.runtime.model,
        api_base=card.runtime.api_base or model.runtime.api_base,
        api_key_env=card.runtime.api_key_env or model.runtime.api_key_env,
    )
    return replace(card, runtime=runtime)


# ---------------------------------------------------------------------------------------
# The record of gated resolutions: a change of resolution passes the eval gate first

#: In the cards folder; a name starting with '_' is not an agent card.
RECORD_FILE = "_backbones.yaml"

_RECORD_HEAD = (
    "# What each persona's backbone resolved to when its golden set last passed the eval\n"
    "# gate. Written by `agap eval --agent ID --record`; `agap cards validate` fails while a\n"
    "# persona resolves to anything else (a card edit changed it and nobody ran the gate).\n"
)


class BackboneChange(Plain):
    """A persona whose backbone now resolves to a model other than the one the gate passed."""

    persona: str
    recorded: str | None
    now: str

    def line(self) -> str:
        was = f"was {self.recorded}" if self.recorded else "never gated"
        return (
            f"cards/{self.persona}.yaml: backbone: now resolves to {self.now} ({was}); run "
            f"`agap eval --agent {self.persona} --record` to gate the change"
        )


def read_record(directory: Path) -> dict[str, str]:
    """``{persona: model}`` from the record; an absent file is an empty record."""
    path = directory / RECORD_FILE
    if not path.is_file():
        return {}
    import yaml  # here: a process that reads the checked cards back reads no record

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        where = str(path)
        raise InvalidInput(f"{RECORD_FILE} is not YAML: {exc}", where=where, hint="or delete it") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise InvalidInput(
            f"{RECORD_FILE} must map persona ids to model names", where=str(path), hint="or delete it"
        )
    return data


def write_record(directory: Path, record: Mapping[str, str]) -> None:
    """Rewrite the record (sorted, atomically)."""
    path = directory / RECORD_FILE
    body = "".join(f"{k}: {json.dumps(v)}\n" for k, v in sorted(record.items()))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(_RECORD_HEAD + body)
    tmp.replace(path)


def backbone_changes(cards: Iterable[Card], record: Mapping[str, str]) -> list[BackboneChange]:
    """Personas with a golden set whose resolved backbone is not the recorded one."""
    cards = list(cards)
    changes = []
    for card in cards:
        if card.backbone is None or card.golden is None:
            continue
        now = resolve_backbone(card, cards)
        if now is not None and now.runtime.model and record.get(card.id) != now.runtime.model:
            changes.append(BackboneChange(card.id, record.get(card.id), now.runtime.model))
    return changes
