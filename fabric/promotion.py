"""Promotion: one private file becomes shared, only through its owner's approval.

``agap promote REF --owner PERSON`` first puts an approval task into the owner's inbox
(actor :data:`PROMOTE_ACTOR`; its action id is keyed to the file's resolved path and the
sha256 of its content, so asking twice makes one task). Once the owner approved it, the
same command copies exactly that content into the shared folder ``promote_to`` of
``cards/_policy.yaml`` (``<promote_to>/<owner>/<sha256[:12]>-<name>``) and records the copy
on the approval task. The copy is what is shared; the original stays private, and so does
every other file, the same file edited later (a new approval), a link to it.

Why a copy, not a grant read at every check: a sandboxed agent's worker signs in as its
own board user and cannot read anyone's inbox, so a grant it cannot see would never let
the file through; a copy in a shared root needs no board at all to be judged.

The owner's approval: the task is Done (or verified) and the latest comment on it from the
owner's own Kanboard user starts with "approve". Kanboard binds a comment to the user who
is logged in (UI session or user API token), so nobody else's approval counts.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.domains import Domains, canon_ref, check_file, rules_domain
from fabric.errors import ConfigError, InvalidInput
from fabric.kanboard.layout import receipt_reference
from fabric.kanboard.reader import ReadOnlyBoard
from fabric.kanboard.taskboard import TaskBoard
from fabric.kanboard.views import TaskView
from fabric.people import find_person
from fabric.policy_file import POLICY_FILE, PolicyConfig
from fabric.refcanon import canonical
from fabric.refusals import PrivacyViolation
from fabric.task import PROMOTE_ACTOR, State


def file_digest(path: Path) -> str | None:
    """The sha256 of a file's content, or None when it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def grant_key(key: str, digest: str) -> str:
    """The action id of the promotion of the object ``key`` (a canonical ref) with ``digest``."""
    return f"promote/{hashlib.sha256(key.encode()).hexdigest()[:24]}/{digest[:24]}"


def promotion_intent(key: str, digest: str, owner: str, copy: str) -> str:
    """The approval task's text: what exactly would be shared, and how to approve it."""
    return (
        f"Share {Path(key.removeprefix('file://')).name} from your private domain?\n\n"
        f"{key} (sha256 {digest}) would be copied, exactly as it is now, to {copy}, which "
        "every agent and person that sees the shared domain may read. The original stays "
        "private; a later edit needs a new approval.\n\n"
        f"Approve: write a comment starting with 'approve' as {owner}, then move this card "
        "to Done. Refuse: close it."
    )


@dataclass(frozen=True)
class Promotion:
    """What promoting ``ref`` (canonical) of ``owner`` with content ``digest`` means: the
    approval task (``intent``, action id ``key``) and the shared copy ``copy``."""

    ref: str
    owner: str
    digest: str
    key: str
    intent: str
    copy: Path

    @property
    def copy_ref(self) -> str:
        return self.copy.as_uri()


def _copy_path(cfg: PolicyConfig, owner: str, digest: str, name: str) -> Path:
    """Where the shared copy goes; the folder must be in the shared domain."""
    where = f"promote_to in cards/{POLICY_FILE}"
    if not cfg.promote_to:
        raise ConfigError(
            "no folder for promoted files", where=where, hint="promote_to: file:///srv/agap/shared/promoted/"
        )
    folder = canonical(cfg.promote_to).path
    if folder is None:
        raise ConfigError(f"{cfg.promote_to!r} is not a file:// folder", where=where)
    copy = folder / owner / f"{digest[:12]}-{name}"
    if rules_domain(cfg, "file://" + copy.as_posix()) != cfg.default_domain:
        raise ConfigError(f"{folder} is not in the shared domain", where=where)
    return copy


def plan_promotion(
    cards: CardSet, cfg: PolicyConfig, board: ReadOnlyBoard, ref: str, owner: str
) -> Promotion:
    """The promotion of the file ``ref`` for its owner ``owner``.

    Refuses a ref that is not a readable file, an owner who is not a person, and a file
    that is not in the owner's private domain alone: nobody promotes what is not theirs.
    """
    person = find_person(cards, owner)
    if person is None:
        raise InvalidInput(
            f"{owner!r} is not a person's card", where="--owner", hint="name a kind: human card"
        )
    c = canon_ref(ref)
    if c.path is None:
        raise InvalidInput("only a file can be promoted", where=ref, hint="write file:///absolute/path")
    check_file(ref, c)
    digest = file_digest(c.path) if c.path.is_file() else None
    if digest is None:
        raise InvalidInput("not a readable regular file", where=ref)
    found = Domains(cards, cfg, board).of_canon(c)
    own = f"private:{person.id}"
    private = sorted(d for d in found if d != cfg.default_domain)
    if not private:
        raise InvalidInput("already in the shared domain: nothing to promote", where=ref)
    if private != [own]:
        raise PrivacyViolation(
            "privacy.promote",
            f"{c.key} is in {', '.join(private)}; {person.id} may promote only what is theirs alone",
            limit=own,
            where=ref,
        )
    copy = _copy_path(cfg, person.id, digest, c.path.name)
    intent = promotion_intent(c.key, digest, person.id, copy.as_uri())
    return Promotion(c.key, person.id, digest, grant_key(c.key, digest), intent, copy)


def approved(board: TaskBoard, cards: CardSet, plan: Promotion, view: TaskView) -> bool:
    """Whether ``view`` is ``plan``'s approval task and its owner approved it (see the
    module docstring): one round trip for the comments."""
    card = find_person(cards, plan.owner)
    s, cur = view.spec, view.current
    if card is None or card.human is None or s is None or cur is None:
        return False
    ours = (
        s.actor == PROMOTE_ACTOR and s.target == card.id and s.intent == plan.intent and s.refs == (plan.ref,)
    )
    if not ours or cur.state not in (State.DONE, State.CLOSED):
        return False
    user = board.layout.users.get(card.human.username)
    said = [c.text.strip().casefold() for c in board.comments(view.id) if user and c.user_id == user]
    return bool(said) and said[-1].startswith("approve")


@dataclass(frozen=True)
class PromotionState:
    """Where a promotion stands: ``asked`` (the task was just made), ``waiting`` (not
    approved by the owner yet) or ``shared`` (the copy is in place)."""

    state: str
    task_id: int
    plan: Promotion
    created: bool = False


def promote(fab: Fabric, ref: str, owner: str) -> PromotionState:
    """Ask ``owner`` to share ``ref``; once they approved, make the shared copy."""
    plan = plan_promotion(fab.cards, fab.policy_context().config, fab.board, ref, owner)
    row = fab.board.find_by_reference(receipt_reference(PROMOTE_ACTOR, plan.key))
    if row is None:
        receipt = fab.submit(
            plan.intent,
            target=plan.owner,
            refs=[plan.ref],
            key=plan.key,
            actor=PROMOTE_ACTOR,
            priority="high",
        )
        return PromotionState("asked", receipt.task_id, plan, receipt.created)
    view = fab.board.read(row.id)
    if not approved(fab.board, fab.cards, plan, view):
        return PromotionState("waiting", row.id, plan)
    if _write_copy(plan):
        fab.board.comment(row.id, f"Promoted: {plan.copy_ref} (sha256 {plan.digest}).")
    return PromotionState("shared", row.id, plan)


def _write_copy(plan: Promotion) -> bool:
    """Copy exactly the approved content (re-read and re-hashed now); False if it is there."""
    src = Path(plan.ref.removeprefix("file://"))
    data = src.read_bytes()
    if hashlib.sha256(data).hexdigest() != plan.digest:
        raise InvalidInput("the file changed since it was approved", where=plan.ref, hint="ask again")
    if plan.copy.is_file() and plan.copy.read_bytes() == data:
        return False
    plan.copy.parent.mkdir(parents=True, exist_ok=True)
    tmp = plan.copy.with_name(f".{plan.copy.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(plan.copy)  # a reader never sees half a copy
    return True


__all__ = [
    "PROMOTE_ACTOR",
    "Promotion",
    "PromotionState",
    "approved",
    "grant_key",
    "plan_promotion",
    "promote",
]
