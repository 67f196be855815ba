"""A persona's backbone chosen per task: the first fitting model endpoint that is available.

A persona with ``backbone.constraints`` may run on any model card that fits them
(:func:`fabric.cards.backbone.backbone_choices` orders them: closest fit first). Its
worker may claim while *any* of them is available (:class:`Backbones` is the persona's
a(t) over them), and each task's call goes to the first one that admits it, spending
that endpoint's shared ledger (:mod:`workers.endpoint`). Which one ran, and why, is
recorded on the task with its completion. A pinned backbone (``backbone.model``) has
one endpoint, its card's own.
"""

from __future__ import annotations

from fabric.availability import Availability, ShapeBase, Verdict
from fabric.cards import Card
from fabric.plain import Plain

__all__ = ["Backbones", "Endpoint"]


class Endpoint(Plain):
    """One model endpoint a persona may call: the persona's card set to that model."""

    card: Card  # the persona, its runtime.model the endpoint's
    model: Card  # the model card (whose a(t) the call spends)
    availability: Availability
    why: str  # why this one is where it is in the order

    def note(self) -> str:
        return f"backbone {self.model.id} ({self.card.runtime.model}): {self.why}"


class Backbones(ShapeBase):
    """The persona's a(t) over its backbones: available while any one of them is."""

    kind = "backbones"
    # Each endpoint parks on its own 429s; the persona's queue needs no park of its own.
    handles_429 = True

    def __init__(self, endpoints: list[Endpoint]) -> None:
        if not endpoints:
            raise ValueError("a persona needs at least one backbone")
        self.endpoints = endpoints
        self.parked: list[str] = []  # the model cards parked at the last check

    def check(self, now: float, *, interactive: bool = False) -> Verdict:
        refusals: list[tuple[Endpoint, Verdict]] = []
        for e in self.endpoints:
            verdict = e.availability.check(now, interactive=interactive)
            if verdict.available:
                self.parked = []
                return Verdict.ok()
            refusals.append((e, verdict))
        self.parked = [e.model.id for e, _ in refusals]
        return _all_parked(refusals)

    def choose(self, now: float, *, interactive: bool = False) -> tuple[Endpoint | None, Verdict]:
        """The first endpoint that admits a call now (the call is then counted in its
        ledger), or None and why every one refused."""
        refusals: list[tuple[Endpoint, Verdict]] = []
        for e in self.endpoints:
            verdict = e.availability.admit(now, interactive=interactive)
            if verdict.available:
                return e, verdict
            refusals.append((e, verdict))
        return None, _all_parked(refusals)


def _all_parked(refusals: list[tuple[Endpoint, Verdict]]) -> Verdict:
    reason = "; ".join(f"{e.model.id}: {v.reason}" for e, v in refusals)
    known = [v.until for _, v in refusals if v.until is not None]
    # The queue may run again as soon as any one frees up.
    return Verdict.no(f"every backbone is parked: {reason}", min(known) if known else None)
