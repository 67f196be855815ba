"""The fabric, assembled: settings, cards, a board connection, the ledger and submit.

This is the Python API the CLI, workers and the A2A server share::

    fab = Fabric.connect()
    receipt = fab.submit("Summarise the week", target="kimi")
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import field
from functools import partial
from typing import TYPE_CHECKING, Any

from fabric import people
from fabric.cardcache import checked_cards
from fabric.cards import Card, CardSet
from fabric.constraints import Constraints
from fabric.errors import ConfigError
from fabric.kanboard.bootstrap import cached_layout, forget_layout_cache
from fabric.kanboard.fit import FittedPort, fit
from fabric.kanboard.gather import gathering, gathering_of
from fabric.kanboard.layout import COLUMN_ORDER
from fabric.kanboard.port import RpcPort
from fabric.kanboard.principals import board_client, confined, home_settings, home_work_settings, signed_in
from fabric.kanboard.reader import ReadOnlyBoard
from fabric.kanboard.spanning import SpanningReader
from fabric.kanboard.taskboard import TaskBoard, TaskView
from fabric.kanboard.weblinks import links_for
from fabric.ledger import Ledger
from fabric.plain import Plain
from fabric.policy import GateRequest, PolicyContext, SubmitPolicy, check_claim_on_board, default_policies
from fabric.settings import registry
from fabric.settings.resolve import Settings
from fabric.slots import plan_slot
from fabric.submit import ActionIdCollision, Receipt, Submitter, build_spec
from fabric.taint import GATE_ACTOR, find_by_uid
from fabric.task import TaskSpec, parse_priority, parse_when

if TYPE_CHECKING:
    from fabric.router import Choice

log = logging.getLogger("agap.submit")


# Called after a task is created or found: (receipt, spec). Listeners must not raise.
SubmitListener = Callable[[Receipt, TaskSpec], None]


class Fabric(Plain, frozen=False):
    """One connection to the fabric: use it from one thread."""

    settings: Settings
    cards: CardSet
    port: RpcPort
    board: TaskBoard
    ledger: Ledger
    clock: Callable[[], float] = time.time
    parks: dict[str, dict[str, Any]] = field(default_factory=dict)  # from the last listing
    policies: list[SubmitPolicy] = field(default_factory=default_policies)
    submit_listeners: list[SubmitListener] = field(default_factory=list)
    homes: dict[str, TaskBoard] = field(default_factory=dict)  # confined agent -> its home's board
    home_of: str = ""  # the confined agent whose home this fabric is on ("" for the work project)
    main: TaskBoard | None = None  # a home fabric's work project, when it holds the app token

    def __post_init__(self) -> None:
        # One port for every caller: the board's, which fits every value to every backend.
        self.port = self.board.port
        if self.ledger.verifier is None:
            # A done card goes to the person who verifies it (its "My tasks" in Kanboard).
            escalate_to = registry.get_str("AGAP_KEEPER_ESCALATE_TO", fallback="")
            self.ledger.verifier = partial(people.verifier, self.cards, escalate_to=escalate_to)

    @classmethod
    def connect(
        cls,
        settings: Settings | None = None,
        *,
        cards: CardSet | None = None,
        port: RpcPort | None = None,
        clock: Callable[[], float] = time.time,
        refresh_layout: bool = False,
    ) -> Fabric:
        """Connect to the board named by the settings (environment by default)."""
        settings = settings or Settings.from_env()
        # Cards loaded here are judged with the policy too (a memory bank across people);
        # unchanged since a process checked them, they are read back from its snapshot.
        cards = cards or checked_cards(settings.cards_dir)
        settings = signed_in(settings, cards)  # a confined agent's user works its home
        if port is None:
            port = board_client(settings)  # the app token, or a confined agent's own user
        if not isinstance(port, FittedPort):
            # Under the fitting, so what rides together has been fitted already.
            port = gathering(port)
        port = fit(port)  # one port for every caller, so every write fits every backend
        layout = cached_layout(port, settings, refresh=refresh_layout)
        links = links_for(settings.board_url, settings.web_url)
        # Cards are sealed with a key derived from the app token (none for a board user).
        board = TaskBoard(port, layout, clock=clock, secret=settings.board_token, links=links)
        # `agap keeper` with a home's projects (as `agap up` and the compose stack run a
        # home's keeper) is that home's fabric: its own queue is here, the rest is the
        # work project's.
        home_of, main = cls._at_home(settings, cards), None
        if home_of and not settings.board_user:
            work = home_work_settings(settings, cards.get(home_of))
            main_layout = cached_layout(port, work, refresh=refresh_layout)
            main = board.sibling(main_layout)
        return cls(
            settings, cards, port, board, Ledger(board, clock=clock), clock, home_of=home_of, main=main
        )

    @staticmethod
    def _at_home(settings: Settings, cards: CardSet) -> str:
        """The confined agent whose home ``settings`` name ("" for the work project)."""
        for card in cards:
            if confined(card) and home_work_settings(settings, card) != settings:
                return card.id
        return ""

    # -- submit ---------------------------------------------------------------------

    def submit(
        self,
        intent: str,
        *,
        target: str | None = None,
        constraints: str | Constraints | None = None,
        refs: tuple[str, ...] | list[str] = (),
        priority: str | int = "normal",
        deadline: str | float | None = None,
        not_before: str | float | None = None,
        key: str | None = None,
        actor: str | None = None,
        parent: int | None = None,
        slot: str | None = None,
        timezone: str | None = None,
    ) -> Receipt:
        """Validate, route and create a task; returns at once with its receipt.

        A task that may pass only through a taint gate creates the gate task (in a
        human's inbox) and is refused with :class:`~fabric.policy.TaintGated`. With a
        ``slot`` (and its ``timezone``) it is a scheduler's firing (:mod:`fabric.slots`):
        keyed by the planned time, on time or refused as missed.
        """
        options: dict[str, Any] = dict(
            target=target,
            constraints=constraints,
            refs=refs,
            priority=priority,
            deadline=deadline,
            not_before=not_before,
            key=key,
            actor=actor,
            parent=parent,
        )
        if slot or timezone:
            return self._submit_slot(intent, slot, timezone, options)
        return self._submit(intent, **options)

    def _submit_slot(
        self, intent: str, slot: str | None, timezone: str | None, kw: dict[str, Any]
    ) -> Receipt:
        """One firing of a planned slot: the task of its planned time, made once."""
        firing = plan_slot(slot, timezone, kw["key"], self.clock())
        actor = kw["actor"] or self.settings.actor
        kw.update(key=firing.key, since=firing.planned.timestamp())
        if not firing.on_time and self.board.tasks_by_keys([(actor, firing.key)])[0] is None:
            raise firing.missed("--slot")
        try:
            return self._submit(intent, **kw)
        except ActionIdCollision as exc:
            # The slot has its task (a firing worded differently, or routed elsewhere since):
            # one slot is one task, as the fabric's own cron has it.
            view = self.board.read(exc.task_id)
            assert view.spec is not None
            return Receipt(exc.task_id, view.uid or "", False, view.spec.queue)

    def _submit(
        self,
        intent: str,
        *,
        target: str | None,
        constraints: str | Constraints | None,
        refs: tuple[str, ...] | list[str],
        priority: str | int,
        deadline: str | float | None,
        not_before: str | float | None,
        key: str | None,
        actor: str | None,
        parent: int | None,
        since: float | None = None,
    ) -> Receipt:
        """``submit`` with relative times counted from ``since`` (a slot's planned time),
        else from now."""
        now = self.clock()
        base = now if since is None else since
        # direct, constraint set or auto; explained (fabric/router.py)
        choice = self.route(
            intent=intent, target=target, constraints=constraints, refs=refs, priority=priority
        )
        card, cons = choice.card, choice.recorded()
        parent_view = self.board.read(parent) if parent is not None else None
        spec = build_spec(
            intent=intent,
            target=card.id,
            queue=card.queue_name,
            refs=tuple(refs),
            constraints=cons,
            priority=parse_priority(priority),
            deadline=_when(deadline, base, "--deadline"),
            not_before=_when(not_before, base, "--not-before"),
            actor=actor or self.settings.actor,
            action_id=key,
            parent=parent_view,
            max_attempts=card.runtime.max_attempts,
            now=now,
        )
        return self._create(spec, choice, parent_view)

    def resubmit(
        self,
        spec: TaskSpec,
        *,
        key: str,
        target: str | None = None,
        constraints: str | Constraints | None = None,
    ) -> Receipt:
        """The same work again, routed anew: to ``target`` (a lane a person dragged the card
        to) or by ``constraints`` (off a parked queue), under the action id ``key`` (so a
        crash between the old task's cancel and this submit is finished by calling again).

        Every other field of ``spec`` carries over as it is: intent, refs, priority,
        deadline, start, actor, lineage and attempts. Routing and policy apply as to any
        submit; the re-submitters of the keeper use this and nothing else.
        """
        choice = self.route(
            intent=spec.intent, target=target, constraints=constraints, refs=spec.refs, priority=spec.priority
        )
        card = choice.card
        changes = {
            "target": card.id,
            "queue": card.queue_name,
            "constraints": choice.recorded(),
            "action_id": key,
            "submitted_at": round(self.clock(), 3),
        }
        again = TaskSpec.from_dict({**spec.as_dict(), **changes})
        return self._create(again, choice, self._parent_of(spec))

    def _parent_of(self, spec: TaskSpec) -> TaskView | None:
        """The parent task of ``spec`` (by its uid), for the lineage policies; None if gone."""
        if spec.parent is None:
            return None
        found = find_by_uid(self.reader(), [spec.parent])
        return self.board.read(found[spec.parent][0]) if spec.parent in found else None

    def _create(self, spec: TaskSpec, choice: Choice, parent_view: TaskView | None) -> Receipt:
        """Apply the submit policies to a routed spec, create the task, tell the listeners."""
        card = choice.card
        if self.policies:
            ctx = self.policy_context()
            for policy in self.policies:
                gate = policy.check(ctx, spec, card, parent_view)
                if gate is not None:
                    raise gate.refusal(self._gate(gate))
        assignee = card.human.username if card.human is not None else None
        try:
            receipt = Submitter(self.board_for(card)).submit(spec, assignee=assignee)
        except ConfigError:
            # The cached layout may be stale (a new card, a reset board): refresh once.
            forget_layout_cache(self.settings)
            self.board.layout = cached_layout(self.port, self.settings, refresh=True)
            receipt = Submitter(self.board_for(card, refresh=True)).submit(spec, assignee=assignee)
        self._note_route(receipt, choice)
        for listener in self.submit_listeners:
            try:
                listener(receipt, spec)
            except Exception:  # publishing is never on the correctness path
                log.exception("submit listener failed")
        return receipt

    def board_for(self, card: Card, *, refresh: bool = False) -> TaskBoard:
        """The board ``card``'s tasks are written on: a confined agent's home
        (:mod:`fabric.kanboard.principals`), else the work project. A fabric signed in as
        a board user has only its own home."""
        if self.home_of:
            # At home: its own queue is here; other tasks go to the work project when this
            # fabric may write there (the app token), else nowhere (the board refuses).
            return self.main if self.main is not None and card.id != self.home_of else self.board
        if self.settings.board_user or not confined(card):
            return self.board
        board = None if refresh else self.homes.get(card.id)
        if board is None:
            home = self.board.layout.homes.get(card.id)
            if home is None:
                raise ConfigError(
                    f"{card.id!r} is {card.trust} and has no home on the board yet",
                    where=home_settings(self.settings, card).project,
                    hint="run `agap init`",
                )
            board = self.board.sibling(home)
            self.homes[card.id] = board
        return board

    def lanes(self) -> list[int]:
        """Every queue swimlane of the projects this fabric writes: its own, the homes' it
        knows, and a home fabric's work project."""
        layouts = [self.board.layout, *self.board.layout.homes.values()]
        if self.main is not None:
            layouts.append(self.main.layout)
        return [i for lay in layouts for i in lay.swimlanes.values()]

    def home_fabric(self, card: Card) -> Fabric:
        """This fabric on ``card``'s home, over the same connection: where a confined
        agent's runtime (an MCP server, the home's keeper) works. Itself for a trusted card,
        or when signed in as a board user (already at home)."""
        if self.settings.board_user or not confined(card):
            return self
        board = self.board_for(card)
        return Fabric(
            home_settings(self.settings, card),
            self.cards,
            self.port,
            board,
            Ledger(board, clock=self.clock),
            self.clock,
            policies=self.policies,
            submit_listeners=self.submit_listeners,
            home_of=card.id,
            main=self.board,
        )

    def route(
        self,
        *,
        intent: str,
        target: str | None = None,
        constraints: str | Constraints | None = None,
        refs: tuple[str, ...] | list[str] = (),
        priority: str | int = "normal",
    ) -> Choice:
        """Where a submit would go, and why (``agap route --explain``); reads the park
        states for constraint and auto targets, nothing for a direct one."""
        from fabric.router import route  # only a submit routes: a worker's claim, heartbeat never do

        return route(
            self.cards,
            self.reader(),
            self.settings.cards_dir,
            intent=intent,
            target=target,
            constraints=constraints,
            refs=refs,
            priority=priority,
            clock=self.clock,
        )

    def together(self, *jobs: Callable[[], Any]) -> list[Any]:
        """Run ``jobs`` side by side on this connection, their round trips riding in shared
        requests (:mod:`fabric.kanboard.gather`); one after another on a port that cannot."""
        port = gathering_of(self.port)
        if port is None:
            return [job() for job in jobs]
        return port.together(*jobs)

    def close(self) -> None:
        """Finish what this connection owes the board (a card move to check), then close it."""
        self.board.close()
        closer = getattr(self.port, "close", None)
        if callable(closer):
            closer()

    def claim_check(self, card: Card) -> Callable[[TaskView], None]:
        """The policy every claim from ``card``'s queue passes, whoever claims (a worker
        daemon, ``agap claim``, the MCP tools): the queue and trust floor, the privacy
        domains of the refs and of the parent chain, and the taint rule
        (:func:`fabric.policy.check_claim_on_board`). Raises to refuse."""

        def check(view: TaskView) -> None:
            if view.spec is not None:
                check_claim_on_board(self.policy_context(), card, view.spec)

        return check

    def policy_context(self) -> PolicyContext:
        """What the policies read now: the cards, the policy file and this board."""
        return PolicyContext(self.cards, self.reader(), self.settings.cards_dir, self.clock())

    def reader(self) -> ReadOnlyBoard:
        """What routing and policy read: the work project and every confined agent's home
        (:mod:`fabric.kanboard.spanning`); a board user reads only its own home."""
        if self.main is not None:
            return SpanningReader(self.main, [self.board])  # a home, on the work project's fabric
        if self.settings.board_user:
            return self.board
        homes = [self.board_for(c) for c in self._homed()]
        return SpanningReader(self.board, homes) if homes else self.board

    def _homed(self) -> list[Card]:
        """The confined cards whose home this (work project's) fabric knows."""
        if self.home_of or self.settings.board_user:
            return []
        return [c for c in self.cards if confined(c) and c.id in self.board.layout.homes]

    def _gate(self, gate: GateRequest) -> Receipt:
        """The gate task a human approves before tainted input passes (found if it exists)."""
        return self.submit(
            gate.intent,
            target=gate.human,
            refs=list(gate.refs),
            priority="high",
            key=gate.key,
            actor=GATE_ACTOR,
        )

    def _note_route(self, receipt: Receipt, choice: Choice) -> None:
        """Record why a routed task went where it went, as a comment (never raises)."""
        if choice.mode == "direct" or not receipt.created:
            return
        try:
            self.board.comment(receipt.task_id, "Routed — " + choice.why())
        except Exception:  # the spec already records the constraint set; this is for humans
            logging.getLogger("agap.route").warning("could not record the route of task #%s", receipt.task_id)

    # -- inspect --------------------------------------------------------------------

    def show(self, task_id: int) -> TaskView:
        """One task with its spec and records."""
        return self.board.read(task_id)

    def listing(self, *, include_closed: bool = False) -> list[dict[str, Any]]:
        """Open tasks per queue and column, with ages (one round trip)."""
        query = "" if include_closed else "status:open"
        # The work project and the confined agents' homes, in the same round trip.
        every = SpanningReader(self.board, [self.board_for(c) for c in self._homed()])
        rows, self.parks = every.search_with_parks(query)
        by_col = every.columns()
        now = self.clock()
        out: list[dict[str, Any]] = []
        for r in rows:
            col = by_col.get(r.column_id)
            out.append(
                {
                    "id": r.id,
                    "title": r.title,
                    "queue": every.queue_of(r.swimlane_id) or r.swimlane_name,
                    "column": col.value if col else r.column_name,
                    "priority": r.priority,
                    "assignee": r.assignee,
                    "age_seconds": max(0, int(now - (r.created_at or now))),
                    "moved_seconds_ago": max(0, int(now - (r.moved_at or now))),
                    "open": r.is_open,
                }
            )
        order = {c.value: i for i, c in enumerate(COLUMN_ORDER)}
        out.sort(
            key=lambda t: (
                str(t["queue"]),
                order.get(str(t["column"]), 99),
                -int(t["priority"]),
                int(t["id"]),
            )
        )
        return out


def _when(value: str | float | None, now: float, where: str) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return float(value)
    return parse_when(value, now=now, where=where)


__all__ = ["Fabric"]
