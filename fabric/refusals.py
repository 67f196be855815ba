"""The policy's refusal, and the privacy refusal every layer that reads refs raises.

Here rather than in :mod:`fabric.policy` so that the privacy domains
(:mod:`fabric.domains`), which the policy builds on, can raise it too.
"""

from __future__ import annotations

from fabric.errors import EXIT_POLICY, FabricError


class PolicyRefused(FabricError):
    """A submit or claim a rule refuses; ``code``, ``rule`` and ``limit`` name it."""

    exit_code = EXIT_POLICY
    code = "POLICY"

    def __init__(self, rule: str, what: str, *, limit: str, where: str = "", hint: str = "") -> None:
        self.rule = rule
        self.limit = limit
        super().__init__(f"{self.code} [{rule}, limit: {limit}]: {what}", where=where, hint=hint)


class PrivacyViolation(PolicyRefused):
    """A ref into a privacy domain its reader may not see (at submit, claim or read)."""

    code = "PRIVACY"


__all__ = ["PolicyRefused", "PrivacyViolation"]
