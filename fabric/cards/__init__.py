"""Agent cards: who can receive work, how strong and how trusted it is, and when it is there.

Every agent — a model endpoint, a persona, a router, a person — is described by one YAML
file in ``cards/`` whose stem is the agent's id. Cards are code: they live in git and are
deployed, never edited live. This package parses them strictly (an unknown key is an error,
not a silently ignored typo), checks the rules that span several cards, and reports *every*
problem at once, one line each, so a broken deploy is fixed in one pass.

Files whose name starts with ``_`` or ``.``, files that are not ``*.yaml``/``*.yml``, and
anything in a subfolder (``cards/golden/``) are not cards.

The parts: :mod:`.fields` (vocabularies, orderings), :mod:`.schema` (the cards as plain
classes), :mod:`.models` (their checks, on pydantic, with the field types that refuse
readably), :mod:`.problems` (one line per problem), :mod:`.files` and :mod:`.dialect`
(card files, their YAML, golden sets), :mod:`.checks` (rules across cards), :mod:`.gpu`
(GPU residency), :mod:`.cardset` and :mod:`.load`. Durations are read by
:mod:`fabric.durations`. Importing this package imports neither pydantic nor yaml: a
process that starts from the checked snapshot (:mod:`fabric.cardcache`) needs neither.
"""

from fabric.cards.cardset import CardSet
from fabric.cards.fields import COST_CLASSES, SHAPES, TIERS, TRUST_ORDER, cost_rank, tier_rank, trust_rank
from fabric.cards.files import load_golden
from fabric.cards.load import load_cards, load_cards_keeping_going
from fabric.cards.problems import CardErrors, CardProblem
from fabric.cards.schema import (
    AlwaysSpec,
    AvailabilitySpec,
    Backbone,
    BackboneConstraints,
    BudgetSpec,
    Card,
    GoldenCase,
    GoldenExpect,
    GoldenSet,
    GpuResidency,
    GpuSpec,
    HoursSpec,
    HumanSpec,
    MatrixChannel,
    MemorySpec,
    OnDemandSpec,
    QuotaSpec,
    RuntimeSpec,
    WebhookChannel,
)

__all__ = [
    "COST_CLASSES",
    "SHAPES",
    "TIERS",
    "TRUST_ORDER",
    "AlwaysSpec",
    "AvailabilitySpec",
    "Backbone",
    "BackboneConstraints",
    "BudgetSpec",
    "Card",
    "CardErrors",
    "CardProblem",
    "CardSet",
    "GoldenCase",
    "GoldenExpect",
    "GoldenSet",
    "GpuResidency",
    "GpuSpec",
    "HoursSpec",
    "HumanSpec",
    "MatrixChannel",
    "MemorySpec",
    "OnDemandSpec",
    "QuotaSpec",
    "RuntimeSpec",
    "WebhookChannel",
    "cost_rank",
    "load_cards",
    "load_cards_keeping_going",
    "load_golden",
    "tier_rank",
    "trust_rank",
]
