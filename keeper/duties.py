"""The keeper's human-facing duties: deadlines, gate reminders, urgent notices, digests.

None of them changes a task's state: an overdue task gets a decision task in the
responsible human's inbox, an ignored gate gets a reminder, never a default approval.
What the keeper did is remembered in the task's metadata so it happens once per task
(``fabric.escalated``), once per interval (``fabric.reminded``) or once per epoch
(``fabric.notified``).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from functools import partial
from zoneinfo import ZoneInfo

from fabric import people
from fabric.availability import Availability, ParkTracker, Verdict, reason_key
from fabric.cards import Card
from fabric.core import Fabric
from fabric.kanboard.layout import META_COST, META_ESCALATED, META_NOTIFIED, META_REMINDED, Column
from fabric.kanboard.taskboard import TaskView
from fabric.people import find_person as find_human
from fabric.settings.keeper import KeeperConfig
from fabric.submit import ActionIdCollision, Receipt
from fabric.task import KEEPER_ACTOR, State
from keeper import snapshot
from keeper.matrix import Notice
from keeper.notify import Notifier
from keeper.snapshot import Snapshot
from keeper.sweeps import SweepReport, guarded, usable

log = logging.getLogger("agap.keeper.duties")


KEEPER = KEEPER_ACTOR  # the actor of decision and digest cards (their text: fabric.description)
URGENT = 3
DAY = 86400.0
WAITING_STATES = (State.QUEUED, State.WORKING, State.INPUT_REQUIRED)


@dataclass
class DutyReport(SweepReport):
    escalated: dict[int, int] = field(default_factory=dict)  # task -> decision task
    reminded: list[int] = field(default_factory=list)
    notified: list[int] = field(default_factory=list)
    settled: list[int] = field(default_factory=list)  # decision tasks closed: their dead letter moved on


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def is_keepers_own(view: TaskView) -> bool:
    """Digests and decision tasks the keeper itself wrote."""
    return view.spec is not None and view.spec.actor == KEEPER


def responsible(fab: Fabric, cfg: KeeperConfig, view: TaskView) -> Card | None:
    """The human a task is escalated to and reported to (:func:`fabric.people.responsible`)."""
    return people.responsible(fab.cards, view.spec, cfg.escalate_to)


def waiting_on(fab: Fabric, view: TaskView) -> Card | None:
    """The human a task waits on right now (a gate for them, or a question), else None."""
    cur, spec = view.current, view.spec
    if cur is None or spec is None:
        return None
    if cur.state == State.INPUT_REQUIRED and cur.assignee:
        return find_human(fab.cards, cur.assignee)
    if cur.state == State.QUEUED:
        return find_human(fab.cards, spec.target)
    return None


# -- deadlines --------------------------------------------------------------------------


def sweep_deadlines(fab: Fabric, snap: Snapshot, cfg: KeeperConfig, notifier: Notifier) -> DutyReport:
    """Escalate overdue tasks once: a decision task for the responsible human."""
    report = DutyReport()
    now = fab.clock()
    for view in snap.views:
        report.scanned += 1
        if not usable(view, report) or view.current is None or view.spec is None:
            continue
        spec = view.spec
        if (
            spec.deadline is None
            or spec.deadline > now
            or view.current.state not in WAITING_STATES
            or view.meta.get(META_ESCALATED)
            or is_keepers_own(view)
        ):
            continue
        guarded(view, report, partial(_escalate, fab, cfg, notifier, view, report))
    return report


def _escalate(fab: Fabric, cfg: KeeperConfig, notifier: Notifier, view: TaskView, report: DutyReport) -> None:
    assert view.spec is not None and view.current is not None and view.uid is not None
    human = responsible(fab, cfg, view)
    if human is None:
        report.problem(view.id, "overdue, but there is no human card to escalate to")
        return
    spec, cur = view.spec, view.current
    title = spec.title()
    intent = (
        f'Decide: task #{view.id} "{title}" missed its deadline\n\n'
        f"Task #{view.id} (queue {spec.queue}) was due {_when(spec.deadline or 0)} and is "
        f"still {cur.state.value} (attempt {cur.attempt}/{spec.max_attempts}). Nothing was "
        f"changed on it. Decide: let it run, cancel it (close its card), give it a new due "
        f"date (**Edit the task** on its card), or resubmit it. Close this card when decided."
    )
    # Once per deadline: a deadline a person set on the card since may be missed too.
    key = f"escalate:{view.uid}" if view.terms is None else f"escalate:{view.uid}:{int(spec.deadline or 0)}"
    receipt = fab.submit(
        intent,
        target=human.id,
        key=key,
        actor=KEEPER,
        priority="urgent",
        refs=(f"task:{view.id}",),
    )
    note = json.dumps({"at": fab.clock(), "to": human.id, "task": receipt.task_id})
    fab.board.save_meta(
        view.id,
        {META_ESCALATED: note},
        comment=f"Deadline ({_when(spec.deadline or 0)}) passed while {cur.state.value}: "
        f"escalated to @{_username(human)} as decision task #{receipt.task_id}. "
        f"The keeper changes nothing else.",
    )
    notifier.notify(
        human.id,
        f"Overdue: #{view.id} {title}",
        f"Task #{view.id} missed its deadline; decision task #{receipt.task_id} waits in your inbox.",
        urgent=True,
        ref=f"task:{receipt.task_id}",
        url=card_url(fab, receipt.task_id),
        key=f"deadline/{view.id}/{receipt.task_id}",
    )
    report.escalated[view.id] = receipt.task_id


def card_url(fab: Fabric, task_id: int) -> str | None:
    """The task's page in Kanboard, for a notification to link (None: no web address)."""
    links = fab.board.links
    return links.task(task_id) if links is not None else None


def notice_of(view: TaskView) -> Notice | None:
    """The task as it stands, for a notification a reply may answer."""
    if view.current is None:
        return None
    return Notice(view.id, view.epoch, view.current.state.value)


def _username(card: Card) -> str:
    return card.human.username if card.human else card.id


# -- gate reminders ---------------------------------------------------------------------


def human_availability(card: Card, now: float) -> Verdict:
    """A person's a(t) now, from their card (waking hours, vacation)."""
    return Availability.from_card(card).check(now)


def publish_human_parks(fab: Fabric, trackers: dict[str, ParkTracker], now: float) -> None:
    """Publish each person's park state when it changes, so ``agap ls`` shows who is away."""
    for card in fab.cards.humans():
        tracker = trackers.setdefault(card.queue_name, ParkTracker(card.queue_name))
        change = tracker.update(human_availability(card, now), now)
        if change is not None:
            fab.board.publish_park(card.queue_name, change.to_dict())


def sweep_reminders(fab: Fabric, snap: Snapshot, cfg: KeeperConfig, notifier: Notifier) -> DutyReport:
    """Re-remind a human of a gate or question ignored for an interval. Never approves.

    Not while the person is away (outside waking hours, on vacation): their gates wait,
    and the reminder goes out once they are back.
    """
    report = DutyReport()
    now = fab.clock()
    for view in snap.views:
        report.scanned += 1
        if not usable(view, report) or view.current is None or is_keepers_own(view):
            continue
        human = waiting_on(fab, view)
        if human is None or not human_availability(human, now).available:
            continue
        since = view.current.at
        last = _float(view.meta.get(META_REMINDED))
        if now - max(since, last) < cfg.reminder_interval:
            continue
        guarded(view, report, partial(_remind, fab, notifier, view, human, since, report))
    return report


def _remind(
    fab: Fabric, notifier: Notifier, view: TaskView, human: Card, since: float, report: DutyReport
) -> None:
    hours = (fab.clock() - since) / 3600
    text = (
        f"Reminder: this has been waiting on @{_username(human)} for {hours:.1f} h. "
        f"Nothing happens until you act (it is never approved by default)."
    )
    fab.board.save_meta(view.id, {META_REMINDED: str(round(fab.clock(), 3))}, comment=text)
    title = view.spec.title() if view.spec else f"task #{view.id}"
    notifier.notify(
        human.id,
        f"Still waiting on you: #{view.id} {title}",
        text,
        urgent=bool(view.spec and view.spec.priority >= URGENT),
        ref=f"task:{view.id}",
        url=card_url(fab, view.id),
        key=f"remind/{view.id}/e{view.epoch}/{int(fab.clock() // 60)}",
        about=notice_of(view),
    )
    report.reminded.append(view.id)


def _float(text: str | None) -> float:
    try:
        return float(text or 0)
    except ValueError:
        return 0.0


# -- immediate notices --------------------------------------------------------------------


def sweep_inbox(fab: Fabric, snap: Snapshot, cfg: KeeperConfig, notifier: Notifier) -> DutyReport:
    """Notify at once: a new gate or question for a human, an urgent task finished.

    Everything else waits for the daily digest. Each task is notified once per epoch.
    """
    report = DutyReport()
    for view in snap.views:
        report.scanned += 1
        if not usable(view, report) or view.current is None or is_keepers_own(view):
            continue
        if view.meta.get(META_NOTIFIED) == str(view.epoch):
            continue
        cur, spec = view.current, view.spec
        assert spec is not None
        human = waiting_on(fab, view)
        subject = ""
        if human is not None:
            subject = (
                f"Question for you: #{view.id} {spec.title()}"
                if cur.state == State.INPUT_REQUIRED
                else f"Waiting on you: #{view.id} {spec.title()}"
            )
            body = cur.reason or spec.intent
        elif cur.state == State.DONE and spec.priority >= URGENT:
            human = responsible(fab, cfg, view)
            subject = f"Urgent task finished: #{view.id} {spec.title()}"
            body = f"Result: {cur.result_ref}. Verify it by closing the card."
        if human is None or not subject:
            continue
        urgent = spec.priority >= URGENT or cur.state == State.INPUT_REQUIRED
        away = human_availability(human, fab.clock())
        if not away.available and (not urgent or reason_key(away.reason) == "on vacation"):
            continue  # notified when they are back (vacation: everything waits)
        guarded(view, report, partial(_notice, fab, notifier, view, human, subject, body, urgent, report))
    return report


def _notice(
    fab: Fabric,
    notifier: Notifier,
    view: TaskView,
    human: Card,
    subject: str,
    body: str,
    urgent: bool,
    report: DutyReport,
) -> None:
    fab.board.save_meta(view.id, {META_NOTIFIED: str(view.epoch)})
    notifier.notify(
        human.id,
        subject,
        body[:2000],
        urgent=urgent,
        ref=f"task:{view.id}",
        url=card_url(fab, view.id),
        key=f"inbox/{view.id}/e{view.epoch}",
        about=notice_of(view),  # a reply answers it (keeper.replies), by the gestures' rules
    )
    report.notified.append(view.id)


# -- the daily digest ----------------------------------------------------------------------


@dataclass
class DigestLine:
    task_id: int
    title: str
    detail: str


@dataclass
class Digest:
    human: Card
    finished: list[DigestLine] = field(default_factory=list)
    waiting: list[DigestLine] = field(default_factory=list)
    failed: list[DigestLine] = field(default_factory=list)
    spend: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))

    def render(self, day: date, limit: int = 3800) -> str:
        user = _username(self.human)
        out = [f"Daily digest for {user}, {day.isoformat()}", ""]

        def section(name: str, lines: list[DigestLine]) -> None:
            out.append(f"{name} ({len(lines)})")
            out.extend(f"- #{ln.task_id} {ln.title}: {ln.detail}" for ln in lines[:40])
            if len(lines) > 40:
                out.append(f"- … and {len(lines) - 40} more")
            out.append("")

        section("Waiting on you", self.waiting)
        section("Finished in the last day", self.finished)
        section("Failed (dead letters)", self.failed)
        out.append("Work per agent in the last day (tasks, recorded cost USD)")
        for agent, (n, usd) in sorted(self.spend.items()):
            out.append(f"- {agent}: {int(n)} tasks, ${usd:.2f}")
        if not self.spend:
            out.append("- none")
        text = "\n".join(out).strip()
        return text if len(text) <= limit else text[: limit - 1] + "…"


def digest_day(fab: Fabric, cfg: KeeperConfig) -> date:
    return datetime.fromtimestamp(fab.clock(), ZoneInfo(cfg.digest_tz)).date()


def gather_digests(fab: Fabric, cfg: KeeperConfig) -> dict[str, Digest]:
    """Each human's digest for the last day (by human card id)."""
    now = fab.clock()
    since = now - DAY
    digests = {c.id: Digest(c) for c in fab.cards.humans()}
    snap = snapshot.take(fab, with_done=True)
    # Recently finished closed tasks and the open dead letters: rows first, metadata for
    # those only (bounded by a day's work and what waits on people, not by history). A
    # dead letter's age is its record's: the fabric's moves leave date_moved alone.
    closed_rows = fab.board.search("status:closed")
    recent = [r for r in closed_rows if r.completed_at >= since] + list(snap.dead_rows)
    views = [v for v in fab.board.read_meta_many(recent) if _of_the_day(v, since)] if recent else []
    done_id = fab.board.layout.columns[Column.DONE]
    for view in snap.views:
        if view.current is None or view.spec is None or view.problems:
            continue
        h = waiting_on(fab, view)
        if h is not None and h.id in digests and not is_keepers_own(view):
            digests[h.id].waiting.append(
                DigestLine(view.id, view.spec.title(), f"since {_when(view.current.at)}")
            )
        if view.task.column_id == done_id and view.current.state == State.DONE and view.current.at >= since:
            views.append(view)
    for view in views:
        if view.current is None or view.spec is None or view.problems or is_keepers_own(view):
            continue
        owner = responsible(fab, cfg, view)
        if owner is None or owner.id not in digests:
            continue
        d, cur, spec = digests[owner.id], view.current, view.spec
        if cur.state == State.DEAD:
            d.failed.append(DigestLine(view.id, spec.title(), cur.reason or "dead letter"))
        elif cur.state in (State.DONE, State.CLOSED):
            verified = "verified" if cur.state == State.CLOSED else "awaiting verification"
            d.finished.append(DigestLine(view.id, spec.title(), verified))
        else:
            continue
        cell = d.spend[spec.target]
        cell[0] += 1
        cell[1] += _float(view.meta.get(META_COST))
    return digests


def _of_the_day(view: TaskView, since: float) -> bool:
    """False for a dead letter dead since before the day (an earlier digest said it)."""
    cur = view.current
    return cur is None or cur.state != State.DEAD or cur.at >= since


def write_digests(fab: Fabric, cfg: KeeperConfig) -> list[Receipt]:
    """One digest task per human per day: a second firing returns the same tasks, even when
    the day's work has changed what the digest would say (the first one stands)."""
    day = digest_day(fab, cfg)
    out = []
    for card_id, digest in gather_digests(fab, cfg).items():
        user = _username(digest.human)
        try:
            receipt = fab.submit(
                digest.render(day),
                target=card_id,
                key=f"digest:{user}:{day.isoformat()}",
                actor=KEEPER,
                priority="low",
            )
        except ActionIdCollision as exc:
            receipt = _existing(fab, exc.task_id, card_id)
        out.append(receipt)
    return out


def _existing(fab: Fabric, task_id: int, target: str) -> Receipt:
    """The receipt of the day's digest already on the board."""
    view = fab.board.read(task_id)
    queue = view.spec.queue if view.spec else target
    return Receipt(task_id=task_id, uid=view.uid or "", created=False, queue=queue)


__all__ = [
    "META_ESCALATED",
    "META_NOTIFIED",
    "META_REMINDED",
    "DutyReport",
    "gather_digests",
    "responsible",
    "sweep_deadlines",
    "sweep_inbox",
    "sweep_reminders",
    "write_digests",
]
