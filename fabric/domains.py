"""Privacy domains: which person's private context a ref resolves to, and who may see it.

A ref's domains come from what it resolves to (:mod:`fabric.refcanon`), never from a
label on it:

* a file or URI: the owner rules next to the cards (``domains:`` in
  ``cards/_policy.yaml``, prefixes canonicalised the same way, files matched on their
  resolved path, whole segments only); else :data:`UNKNOWN` for an http(s) URL on this
  machine (a memory bank's API, the board: what a worker may fetch from loopback); else
  ``default_domain``;
* a file stored under a task's uid folder (a result in a shared directory): that task's
  domains as well (:data:`UNKNOWN` when the board shows no task with that uid);
* a task (``task:N``, ``kanboard://task/N/…``): the domain of the person who submitted it
  (directly or over A2A), the domains of its own refs and of its result, transitively
  (cycles contribute nothing; a task the board does not show, one the fabric did not
  write, or more than :data:`MAX_TASKS` tasks on the way: :data:`UNKNOWN`).

Nothing private ever becomes shared here: a promotion (:mod:`fabric.promotion`) makes an
approved copy in a shared root.

:data:`UNKNOWN` is the domain of what cannot be decided (a task this board does not show
or the fabric did not write, a task ref with no board to read it from): nobody may see it.
The readers' side is :func:`check_visible`; :class:`ReadGuard` applies it where a worker
reads content.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import field
from pathlib import Path

from fabric.cards import Card, CardSet, trust_rank
from fabric.kanboard.port import BoardAuthError
from fabric.kanboard.reader import ReadOnlyBoard
from fabric.people import find_person
from fabric.plain import Plain
from fabric.policy_file import UNKNOWN, PolicyConfig, rules_domain
from fabric.refcanon import BadRef, Canon, canonical
from fabric.refusals import PrivacyViolation

#: How many tasks one ref may lead through before its domain is :data:`UNKNOWN`.
MAX_TASKS = 64


def person_of(cards: CardSet, actor: str) -> Card | None:
    """The person an actor speaks for: a human card, or an A2A caller named like one."""
    return find_person(cards, actor.removeprefix("a2a:"))


def recall_scope(cards: CardSet, human: str) -> frozenset[str]:
    """What work for (a conversation with) ``human`` may see: their private domain and the
    shared domains, nothing of another human's."""
    card = find_person(cards, human)
    own = f"private:{card.id if card else human}"
    return frozenset({own} | {d for c in cards for d in c.privacy_domains if not d.startswith("private:")})


def canon_ref(ref: str) -> Canon:
    """``ref`` in canonical form; a ``#domain=`` label is refused (``privacy.label``), and
    so is a ref with no canonical form (``privacy.ref``)."""
    try:
        return canonical(ref)
    except BadRef as exc:
        rule, limit = ("privacy.label", "no labels") if exc.label else ("privacy.ref", "canonical refs")
        raise PrivacyViolation(rule, str(exc), limit=limit, where=ref) from None


#: What one node contributes by itself (its own domains) and the tasks it leads to.
_Node = tuple[frozenset[str], tuple[int, ...]]


class Domains(Plain, frozen=False):
    """The domains of refs, read from the owner rules and (for tasks) the board.

    A task's domains are the union over every task reachable from it (through refs,
    results and result folders) of what each contributes by itself: a walk over the graph,
    so a cycle is complete whichever task it is entered from. One instance answers for one
    decision: it remembers the tasks it read.
    """

    cards: CardSet
    cfg: PolicyConfig
    board: ReadOnlyBoard | None = None
    _nodes: dict[int, _Node] = field(default_factory=dict, repr=False)
    _uids: dict[str, int | None] = field(default_factory=dict, repr=False)

    def of(self, ref: str) -> frozenset[str]:
        """The domains ``ref`` resolves into (see the module docstring)."""
        return self.of_canon(canon_ref(ref))

    def of_canon(self, c: Canon) -> frozenset[str]:
        """The domains of a canonical ref."""
        own, tasks = self._direct(c)
        return frozenset(own.union(*(self.task(t) for t in tasks)))

    def stored(self, ref: str) -> frozenset[str]:
        """:meth:`of` for a ref read from the board: one with no canonical form is
        :data:`UNKNOWN` (it was written before labels were refused)."""
        try:
            return self.of(ref)
        except PrivacyViolation:
            return frozenset({UNKNOWN})

    def task(self, task_id: int) -> frozenset[str]:
        """A task's domains: its submitter's, its refs', its result's, transitively."""
        found: set[str] = set()
        seen: set[int] = set()
        todo = [task_id]
        while todo:
            t = todo.pop()
            if t in seen:
                continue  # a cycle, or a task reached twice: counted once
            if len(seen) >= MAX_TASKS:
                return frozenset({UNKNOWN})
            seen.add(t)
            own, more = self._task_node(t)
            found |= own
            todo.extend(more)
        return frozenset(found or {self.cfg.default_domain})

    def _direct(self, c: Canon) -> _Node:
        """What a canonical ref contributes itself, and the task it leads to (if any)."""
        if c.task_id is not None:
            return frozenset(), (c.task_id,)
        own = frozenset({rules_domain(self.cfg, c.key)})
        uid = c.uid
        if uid is None:
            return own, ()
        tid = self._uid_task(uid)
        return (own, (tid,)) if tid is not None else (own | {UNKNOWN}, ())

    def _task_node(self, task_id: int) -> _Node:
        """Task ``task_id`` by itself: its submitter's domain and its refs' and result's
        own domains, and the tasks those lead to (one read, remembered)."""
        if task_id in self._nodes:
            return self._nodes[task_id]
        view = None
        if self.board is not None:
            try:
                view = self.board.read_many([task_id]).get(task_id)
            except BoardAuthError:
                view = None  # a confined agent's user may not read it: unknown to it
        if view is None or view.spec is None:
            # Not there (or not visible to this board user), or not the fabric's: who
            # wrote it is unknown, so nobody may see it.
            node: _Node = (frozenset({UNKNOWN}), ())
        else:
            own: set[str] = set()
            more: list[int] = []
            person = person_of(self.cards, view.spec.actor)
            if person is not None:
                own.add(f"private:{person.id}")
            result = view.current.result_ref if view.current else None
            for ref in (*view.spec.refs, *([result] if result else [])):
                try:
                    d, ts = self._direct(canon_ref(ref))
                except PrivacyViolation:
                    d, ts = frozenset({UNKNOWN}), ()  # a stored ref with no canonical form
                own |= d
                more += ts
            node = (frozenset(own), tuple(more))
        self._nodes[task_id] = node
        return node

    def _uid_task(self, uid: str) -> int | None:
        """The id of the task whose uid names a result folder (one search), or None."""
        if uid in self._uids:
            return self._uids[uid]
        found = None
        if self.board is not None:
            try:
                rows = self.board.search(f"desc:{uid}")
            except BoardAuthError:
                rows = []
            for row in rows:
                parsed = self.board.sealed(row.description)
                if parsed and parsed[0] == uid:
                    found = row.id
                    break
        self._uids[uid] = found
        return found


def single_link(ref: str, st: os.stat_result) -> None:
    """Refuse a regular file with several hard links: its other names may lie anywhere."""
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise PrivacyViolation(
            "privacy.hard-link",
            f"the file has {st.st_nlink} hard links, so its domain cannot be told from its path",
            limit="files with one link",
            where=ref,
            hint="copy the file instead of linking it",
        )


def check_file(ref: str, c: Canon) -> None:
    """The checks a file ref gets before anything is read: one hard link."""
    if c.path is not None:
        try:
            st = os.stat(c.path)
        except OSError:
            return  # missing: nothing to leak; the reader refuses it
        single_link(ref, st)


def scopes_of(cards: CardSet, humans: Iterable[str]) -> dict[str, frozenset[str]]:
    """``{human: recall_scope}`` for the people a piece of work is for."""
    return {h: recall_scope(cards, h) for h in sorted(set(humans))}


def check_visible(
    card: Card,
    ref: str,
    found: Iterable[str],
    *,
    scopes: Mapping[str, frozenset[str]] | None = None,
    where: str = "--ref",
) -> None:
    """Refuse ``ref`` (resolving into ``found``) for ``card``, working for the people in
    ``scopes`` (:func:`scopes_of`).

    The rules, in order: ``privacy.unknown`` (a domain nobody may see), ``privacy.sandboxed``
    (sandboxed and untrusted cards see no private domain), ``privacy.card-domains`` (the
    card lists the domain) and ``privacy.interlocutor`` (work for H sees only H's private
    domain and the shared ones).
    """
    for d in sorted(found):
        if d == UNKNOWN:
            raise PrivacyViolation(
                "privacy.unknown",
                f"the domain of {ref} cannot be decided (no such task here, a task the "
                "fabric did not write, or a task ref where there is no board)",
                limit="refs whose owner is known",
                where=where,
            )
        if d.startswith("private:") and trust_rank(card.trust) <= trust_rank("sandboxed"):
            raise PrivacyViolation(
                "privacy.sandboxed",
                f"{card.id} is {card.trust} and may not receive {ref} ({d})",
                limit="shared domains only",
                where=where,
            )
        if d not in card.privacy_domains:
            raise PrivacyViolation(
                "privacy.card-domains",
                f"{card.id} may not see {d} ({ref})",
                limit=", ".join(card.privacy_domains),
                where=where,
                hint=f"send it to an agent whose card lists {d}",
            )
        for h, scope in sorted((scopes or {}).items()):
            if d.startswith("private:") and d not in scope:
                raise PrivacyViolation(
                    "privacy.interlocutor",
                    f"work for {h} may not reference {d} ({ref})",
                    limit=f"{h}: " + ", ".join(sorted(scope)),
                    where=where,
                    hint="content from one human's conversations never reaches another",
                )


def check_retain(task_id: int, found: Iterable[str], bank: str, bank_domain: str) -> None:
    """Refuse retaining task ``task_id``'s result (its task resolving into ``found``) into
    ``bank``, whose owner rules give ``bank_domain``.

    A result goes back only into a bank of the task's own privacy domain: never into a
    bank nobody owns by a rule (``privacy.unknown``), never from a task of one person's
    into another's or into a shared bank (``privacy.retain``: a memory is read by whoever
    reads the bank), and never from a task that did not work in the bank's domain.
    """
    domains = frozenset(found)
    where = f"task #{task_id} -> {bank}"
    if bank_domain == UNKNOWN or UNKNOWN in domains:
        whose = bank if bank_domain == UNKNOWN else f"task #{task_id}"
        raise PrivacyViolation(
            "privacy.unknown",
            f"the owner of {whose} cannot be decided",
            limit="banks and tasks whose owner is known",
            where=where,
            hint="name the bank's owner in domains: of cards/_policy.yaml",
        )
    other = sorted(d for d in domains if d.startswith("private:") and d != bank_domain)
    if other:
        raise PrivacyViolation(
            "privacy.retain",
            f"task #{task_id} carries {other[0]}: its result may not go into {bank} ({bank_domain})",
            limit=f"{bank}: {bank_domain} only",
            where=where,
            hint="content from one person's work never reaches another's memory, nor a shared one",
        )
    if bank_domain not in domains:
        raise PrivacyViolation(
            "privacy.retain",
            f"task #{task_id} did not work in {bank_domain} ({', '.join(sorted(domains))})",
            limit=f"{bank}: {bank_domain} only",
            where=where,
            hint="retain a result only into a bank of the task's own privacy domain",
        )


class ReadGuard(Plain, frozen=False):
    """The privacy check where content is read: ``card`` working for ``humans``.

    :meth:`admit` runs before a ref is read; :meth:`admit_file` on the file actually
    opened (its path read back from the open descriptor), so a file swapped between the
    check and the read is judged as what was read.
    """

    domains: Domains
    card: Card
    humans: tuple[str, ...] = ()

    def admit(self, ref: str) -> Canon:
        """Refuse ``ref`` unless the card may see what it resolves to; its canonical form."""
        c = canon_ref(ref)
        check_file(ref, c)
        if c.path is None:
            self._check(ref, self.domains.of_canon(c))
        return c

    def admit_file(self, ref: str, opened: Path, st: os.stat_result) -> None:
        """Refuse the file that was opened for ``ref`` unless the card may see it."""
        single_link(ref, st)
        c = Canon(ref, "file", "file://" + opened.as_posix(), path=opened)
        self._check(ref, self.domains.of_canon(c))

    def _check(self, ref: str, found: frozenset[str]) -> None:
        check_visible(self.card, ref, found, scopes=scopes_of(self.domains.cards, self.humans), where=ref)


__all__ = [
    "MAX_TASKS",
    "UNKNOWN",
    "Domains",
    "ReadGuard",
    "canon_ref",
    "check_file",
    "check_retain",
    "check_visible",
    "person_of",
    "recall_scope",
    "rules_domain",
    "scopes_of",
    "single_link",
]
