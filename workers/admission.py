"""Admitting one paid model call: the one path the worker's executor and sync A2A share.

:func:`admit_call` checks and counts the call in the caller's a(t) (its own shapes and
its model endpoint's shared ledger, :mod:`workers.endpoint`) and, for a persona whose
backbone is chosen per call (:mod:`workers.backbone`), in the first backbone that admits
it. The :class:`Admitted` it returns names the card to call with, and after the call is
told how it went: :meth:`Admitted.settle` (it ran), :meth:`Admitted.failed` (what a
failure means for quota, budget and the 429 park). What a failure means for the *task*
(an attempt, a release, an error for the caller) stays with each caller.
"""

from __future__ import annotations

from fabric.availability import Availability, Verdict
from fabric.cards import Card
from fabric.kanboard.quotas import QuotaHolder
from fabric.plain import Plain
from fabric.sharedquota import HOLDER
from workers.backbone import Backbones, Endpoint
from workers.llm import ModelTimedOut, ModelUnavailable, RateLimited

__all__ = ["Admitted", "admit_call", "backbones_of"]


def backbones_of(availability: Availability) -> Backbones | None:
    """The persona's backbones inside its a(t), if it has them."""
    return next((s for s in availability.shapes if isinstance(s, Backbones)), None)


class Admitted(Plain, frozen=False):
    """A call admitted at ``at`` in these a(t)s (the caller's own; a persona's backbone)."""

    at: float
    ledgers: list[Availability]
    endpoint: Endpoint | None = None

    def card(self, default: Card) -> Card:
        """The card to call with: the chosen backbone's, else ``default``."""
        return self.endpoint.card if self.endpoint is not None else default

    def settle(self, now: float, *, cost_usd: float = 0.0) -> None:
        for av in self.ledgers:
            av.settle(now, cost_usd=cost_usd)

    def refund(self) -> None:
        for av in self.ledgers:
            av.refund(self.at)

    def failed(self, exc: BaseException, now: float, *, charge_usd: float = 0.0) -> None:
        """Feed a(t) what a failed call says; ``charge_usd``: what a timed-out call may cost."""
        if isinstance(exc, ModelTimedOut):
            # Sent, not answered: the provider may still run and charge it, so its slot
            # stays spent (at what the card allows at most).
            self.settle(now, cost_usd=charge_usd)
        elif isinstance(exc, RateLimited):
            self.refund()  # refused: the provider did not run it
            endpoint = self.ledgers[-1]  # parks the model for every caller
            if exc.headers:
                endpoint.on_rate_limited_headers(now, exc.headers)
            else:
                endpoint.on_rate_limited(now, exc.retry_after, exc.reset_at)
        elif isinstance(exc, ModelUnavailable):
            self.refund()  # never reached the provider
        else:
            self.settle(now)  # answered badly, or failed after sending: counted


def admit_call(
    availability: Availability, now: float, *, interactive: bool, holder: QuotaHolder | None = None
) -> Admitted | Verdict:
    """Admit one call now, or the refusal (nothing stays counted when refused).

    ``holder``: the task lease the call runs under; a slot it takes of a quota shared
    across hosts is tied to it, so the keeper gives the slot back if the lease dies."""
    token = HOLDER.set(holder)
    try:
        return _admit(availability, now, interactive)
    finally:
        HOLDER.reset(token)


def _admit(availability: Availability, now: float, interactive: bool) -> Admitted | Verdict:
    verdict = availability.admit(now, interactive=interactive)
    if not verdict.available:
        return verdict
    backbones = backbones_of(availability)
    if backbones is None:
        return Admitted(now, [availability])
    endpoint, verdict = backbones.choose(now, interactive=interactive)
    if endpoint is None:
        availability.refund(now)
        return verdict
    return Admitted(now, [availability, endpoint.availability], endpoint)
