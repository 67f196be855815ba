"""The card: a fabric task as Kanboard stores it, and the sealed spec it carries.

A card's description is what a person reads (:mod:`fabric.kanboard.cardtext`), then the
task's spec as one line of JSON in a Markdown reference definition, which renders as
nothing. The block is sealed with a key derived from the fabric's app token, so only the
fabric's own blocks are ever trusted: a task whose submitter died between creating it and
writing its records is repairable from the board alone, and the policy's lineage and
taint checks find a task's spec by its uid in one search. Anyone who can edit a
description can write a block, so only the *last* block counts, and only if its seal
verifies. The key never leaves :mod:`fabric.kanboard`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from typing import NamedTuple

from fabric.kanboard.cardtext import human_text
from fabric.kanboard.weblinks import WebLinks
from fabric.task import Record, TaskSpec

# The sealed spec is the description's last line, a Markdown reference definition (which
# Markdown, Kanboard's included, never shows). Layout 2 boards wrote it as a fenced block in
# an HTML <details> element (Kanboard shows that HTML as text): both are read.
SPEC_LINE = "[fabric-spec]: # ("
_SPEC_BLOCK = re.compile(
    r"^\[fabric-spec\]: # \((\{[^\n]*\})\)[ ]*$|```json fabric-spec\n(.*?)\n```", re.S | re.M
)
SPEC_FENCE = "```json fabric-spec"


class Sealed(NamedTuple):
    """What the fabric sealed into a card: the task's uid, spec and first assignee."""

    uid: str
    spec: TaskSpec
    assignee: str | None


def derive_seal_key(secret: str) -> bytes:
    """The key spec blocks are sealed with, derived from a secret every fabric process has."""
    return hashlib.sha256(b"agap-fabric spec seal v1\x00" + secret.encode()).digest()


def _seal(key: bytes, block: dict[str, object]) -> str:
    body = json.dumps(block, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()[:32]


def spec_block(spec: TaskSpec, uid: str, *, assignee: str | None, key: bytes) -> str:
    """The machine-readable, sealed JSON of a task's uid, spec and assignee."""
    block: dict[str, object] = {"uid": uid, "assignee": assignee, "spec": json.loads(spec.to_meta())}
    return json.dumps({**block, "seal": _seal(key, block)}, sort_keys=True)


def render_description(
    spec: TaskSpec,
    uid: str,
    *,
    assignee: str | None = None,
    key: bytes = b"",
    record: Record | None = None,
    links: WebLinks | None = None,
    result_url: str | None = None,
) -> str:
    """The description: what a person reads (:mod:`fabric.description`), then the sealed
    spec as a Markdown reference definition, which renders as nothing.

    ``record`` is the state the card shows (None: as submitted, waiting on ``assignee``
    when that is a person); ``assignee`` is also sealed, for a repair's epoch 0.
    """
    lines = human_text(spec, record, links=links, result_url=result_url, assignee=assignee)
    block = spec_block(spec, uid, assignee=assignee, key=key)
    return "\n".join([*lines, f"{SPEC_LINE}{block})"])


def readable(text: str) -> str:
    """``text`` without the machine-readable blocks: what Kanboard shows a person."""
    return _SPEC_BLOCK.sub("", text or "").replace("<details>", "").replace("</details>", "").rstrip() + "\n"


def parse_description(text: str, key: bytes) -> Sealed | None:
    """The (uid, spec, assignee) the fabric sealed into a description, or None.

    Only the last block counts (the fabric writes it last; text above it is the intent,
    which anyone may have written), and only with a seal made with ``key``.
    """
    blocks = _SPEC_BLOCK.findall(text or "")
    if not blocks:
        return None
    try:
        d = json.loads(blocks[-1][0] or blocks[-1][1])
        if not isinstance(d, dict):
            return None
        seal = d.pop("seal", None)
        if not isinstance(seal, str) or not hmac.compare_digest(seal, _seal(key, d)):
            return None
        return Sealed(str(d["uid"]), TaskSpec.from_dict(d["spec"]), d.get("assignee"))
    except (ValueError, KeyError, TypeError):
        return None
