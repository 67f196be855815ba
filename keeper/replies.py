"""A person's answers from Matrix: replies to the keeper's notifications, read as gestures.

A notification about a task carries ``org.agap.notice`` (the task, its epoch and state:
:mod:`keeper.matrix`). A person answers by *replying* to it (``m.relates_to`` →
``m.in_reply_to``). The reply's words become one gesture of the gesture table
(:data:`fabric.kanboard.gestures.GESTURES`) and go through the keeper's own handlers
(:func:`keeper.gestures.perform`): the same meanings, and the same rule about who may
(the person the card waits on, their Matrix id from their card, or a deputy).

=================  ==========================================  ===================
the task is…       the reply says…                             the gesture
=================  ==========================================  ===================
asking you         anything: the answer                        to Queued, answered
an approval        ``approve`` [note] / ``refuse`` [why]       to Done / close
a task or decision ``done`` [what you did] / ``dismiss``       to Done, or close
done               ``accept`` / ``send back <what is wrong>``  close / to Queued
=================  ==========================================  ===================

Each incoming message gets at most one reply, whose transaction id is derived from the
message's event id: handling a message again (the keeper stopped between acting and
saving its sync token) cannot post twice, and cannot act twice either, since the task no
longer stands as the notice says (its reply then is "this notification is old"). The
sync token is the work project's metadata (``fabric.keeper.matrix.<hash>``): a message
sent while the fabric was down is read at the next sweep. A first sync (no token yet)
reads the newest page and answers only what it acts on.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fabric.cards import CardSet, MatrixChannel
from fabric.core import Fabric
from fabric.kanboard.gestures import Trigger, match
from fabric.kanboard.layout import META_MATRIX_SINCE_PREFIX, Column
from fabric.kanboard.taskboard import TaskNotFound, TaskView
from fabric.ledger import IllegalTransition
from fabric.settings import registry
from fabric.task import State
from keeper import acts
from keeper.gestures import Gesture, GestureReport, Refused, card_kind, perform
from keeper.matrix import NOTICE, MatrixNotifier, MatrixSendError, new_txn_id
from keeper.matrix_sync import MatrixReader

log = logging.getLogger("agap.keeper.replies")

WHERE = "from Matrix"

# What a card is, for a reply: which words it takes.
QUESTION, APPROVAL, TASK, RESULT = "question", "approval", "task", "result"
HOWTO = {
    QUESTION: "your answer, as a reply to the notification",
    APPROVAL: "`approve` (a note may follow) or `refuse` followed by why",
    TASK: "`done` followed by what you did, `done`, or `dismiss`",
    RESULT: "`accept`, or `send back` followed by what is wrong",
}
WHAT = {
    QUESTION: "a question for you",
    APPROVAL: "an approval waiting on you",
    TASK: "a task waiting on you",
    RESULT: "a result to verify",
}
_YES = {"approve", "approved", "yes", "ok", "okay", "accept", "accepted", "verify", "verified", "lgtm"}
_NO = {"refuse", "refused", "no", "deny", "denied", "reject", "rejected"}
_DONE = {"done", "approve", "approved", "yes", "ok", "okay"}
_DISMISS = {"dismiss", "dismissed", "no", "refuse", "cancel", "skip"}
_BACK = ("send back", "sendback", "reopen", "redo", "no")
# The column a reply's gesture moves the card to, as the board's move would.
_COLUMN_OF = {Trigger.TO_DONE: Column.DONE, Trigger.TO_QUEUED: Column.QUEUED}
_WORD = re.compile(r"^\s*([A-Za-z-]+)[\s:,.!]*(.*)$", re.S)


@dataclass(frozen=True)
class Intent:
    """A reply read as a gesture: the trigger, what the person wrote with it, and what
    the fabric says it did."""

    trigger: Trigger
    text: str  # "": nothing written (the card's comments are never read instead)
    done: str


def kind_of(view: TaskView) -> str:
    """The kind of answer a task takes ("": none)."""
    rec = view.current
    if rec is None:
        return ""
    waiting, approval = card_kind(view, rec)
    if rec.state == State.INPUT_REQUIRED:
        return QUESTION
    if rec.state == State.QUEUED and waiting:
        return APPROVAL if approval else TASK
    return RESULT if rec.state == State.DONE else ""


def strip_fallback(body: str) -> str:
    """A reply's own words: without the quoted fallback (``> …`` lines) clients put first."""
    lines = body.splitlines()
    i = 0
    while i < len(lines) and lines[i].startswith(">"):
        i += 1
    if i and i < len(lines) and not lines[i].strip():
        i += 1
    return "\n".join(lines[i:]).strip()


def _first_word(text: str) -> tuple[str, str]:
    m = _WORD.match(text)
    return (m.group(1).lower(), m.group(2).strip()) if m else ("", "")


def _question(text: str) -> Intent | None:
    answer = re.sub(r"^answer\s*[:\-]\s*", "", text, flags=re.I).strip()
    return Intent(Trigger.TO_QUEUED, answer, "resumed it with your answer") if answer else None


def _approval(text: str) -> Intent | None:
    word, rest = _first_word(text)
    if word in _YES:
        return Intent(Trigger.TO_DONE, rest, "approved it")
    if word in _NO:
        return Intent(Trigger.CLOSE, rest, "refused it (canceled)")
    return None


def _task(text: str) -> Intent | None:
    word, rest = _first_word(text)
    if word in _DONE:
        # "done <what you did>" is a close with a comment; a bare "done", a move to Done.
        if rest:
            return Intent(Trigger.CLOSE, rest, "marked it done and verified it")
        return Intent(Trigger.TO_DONE, "", "marked it done by you")
    if word in _DISMISS:
        return Intent(Trigger.CLOSE, "", "dismissed it (canceled)")
    return None


def _result(text: str) -> Intent | None:
    lowered = text.lower()
    for back in _BACK:
        if lowered.startswith(back) and (len(lowered) == len(back) or not lowered[len(back)].isalpha()):
            why = text[len(back) :].strip(" :,.-\n")
            return Intent(Trigger.TO_QUEUED, why, "sent it back") if why else None  # a reason is due
    word, _ = _first_word(text)
    return Intent(Trigger.CLOSE, "", "accepted it (verified)") if word in _YES else None


_PARSERS = {QUESTION: _question, APPROVAL: _approval, TASK: _task, RESULT: _result}


def parse(kind: str, text: str) -> Intent | None:
    """What a reply means for a card of ``kind`` (None: it does not say)."""
    text = text.strip()
    reader = _PARSERS.get(kind)
    return reader(text) if reader is not None and text else None


def sync_key(homeserver: str, bot: str) -> str:
    """The project-metadata key of one bot's sync token on one homeserver."""
    return META_MATRIX_SINCE_PREFIX + hashlib.sha256(f"{homeserver}\n{bot}".encode()).hexdigest()[:16]


def matrix_channels(cards: CardSet) -> dict[tuple[str, str], list[str]]:
    """(homeserver, token variable) -> the rooms of every person's Matrix channels there."""
    out: dict[tuple[str, str], list[str]] = {}
    for card in cards.humans():
        for ch in card.human.channels if card.human else []:
            if isinstance(ch, MatrixChannel):
                rooms = out.setdefault((str(ch.homeserver).rstrip("/"), ch.token_env), [])
                if ch.room not in rooms:
                    rooms.append(ch.room)
    return out


def username_of(cards: CardSet, sender: str) -> str:
    """The Kanboard username of the person whose card names Matrix id ``sender`` (else
    ``sender`` itself, which no rule allows)."""
    for card in cards.humans():
        for ch in card.human.channels if card.human else []:
            if isinstance(ch, MatrixChannel) and ch.user == sender and card.human is not None:
                return card.human.username
    return sender


@dataclass
class ReplyReport(GestureReport):
    """What one Matrix sweep read and did."""

    read: int = 0  # messages by people
    answered: dict[str, str] = field(default_factory=dict)  # their event id -> the bot's reply


@dataclass
class MatrixReplies:
    """The keeper's Matrix inbox: every bot's rooms, read from their saved sync tokens."""

    env: Mapping[str, str] | None = None
    limit: int = 50
    timeout: float = 10.0
    _bots: dict[tuple[str, str], str] = field(default_factory=dict)  # (homeserver, token) -> user id

    def sweep(self, fab: Fabric) -> ReplyReport:
        report = ReplyReport()
        env = registry.environ(self.env)
        meta: dict[str, str] | None = None
        for (homeserver, token_env), rooms in matrix_channels(fab.cards).items():
            token = registry.named(token_env, env)
            if not token:
                continue  # the notifier says so, once
            meta = fab.board.project_meta() if meta is None else meta
            try:
                self._sweep_one(fab, homeserver, token, rooms, meta, report)
            except MatrixSendError as exc:
                # The homeserver is away: its token stays, so nothing is skipped later.
                log.warning("matrix: %s", exc.line())
                report.problem(0, exc.line())
        return report

    def _sweep_one(
        self,
        fab: Fabric,
        homeserver: str,
        token: str,
        rooms: list[str],
        meta: dict[str, str],
        report: ReplyReport,
    ) -> None:
        reader = MatrixReader(homeserver, token, timeout=self.timeout, limit=self.limit)
        bot = self._bots.get((homeserver, token)) or reader.whoami()
        self._bots[(homeserver, token)] = bot
        key = sync_key(homeserver, bot)
        since = meta.get(key) or None
        page = reader.sync(since, rooms)
        session = _Session(fab, reader, homeserver, token, bot, quiet=since is None, report=report)
        for room, event in page.events:
            session.handle(room, event)
        if page.next_batch and page.next_batch != since:
            fab.board.save_project_meta({key: page.next_batch})
            meta[key] = page.next_batch


@dataclass
class _Session:
    """One bot's page of messages being handled."""

    fab: Fabric
    reader: MatrixReader
    homeserver: str
    token: str = field(repr=False)
    bot: str = ""
    quiet: bool = False  # a first sync: answer only what is acted on
    report: ReplyReport = field(default_factory=ReplyReport)

    def handle(self, room: str, event: dict[str, Any]) -> None:
        content = event.get("content")
        sender, event_id = str(event.get("sender", "")), str(event.get("event_id", ""))
        if event.get("type") != "m.room.message" or not isinstance(content, dict) or sender == self.bot:
            return
        relates = content.get("m.relates_to")
        if not event_id or (isinstance(relates, dict) and relates.get("rel_type") == "m.replace"):
            return  # an edit of an earlier message: that message was read already
        self.report.read += 1
        parent = relates.get("m.in_reply_to", {}).get("event_id") if isinstance(relates, dict) else None
        if not parent:
            self._say(room, event_id, "To answer, reply to one of my notifications. Nothing changed.")
            return
        notice = self._notice(room, str(parent))
        if notice is None:
            self._say(room, event_id, "That is not one of the fabric's notifications, so nothing changed.")
            return
        self._answer(room, event_id, sender, notice, strip_fallback(str(content.get("body", ""))))

    def _notice(self, room: str, event_id: str) -> dict[str, Any] | None:
        parent = self.reader.event(room, event_id)
        if parent is None or parent.get("sender") != self.bot:
            return None
        notice = (parent.get("content") or {}).get(NOTICE)
        ok = isinstance(notice, dict) and isinstance(notice.get("task"), int)
        return notice if ok else None

    def _answer(self, room: str, event_id: str, sender: str, notice: dict[str, Any], text: str) -> None:
        fab, task = self.fab, int(notice["task"])
        try:
            view = fab.board.read(task)
        except TaskNotFound:
            self._say(room, event_id, f"Task #{task} is gone from the board. Nothing changed.")
            return
        rec = view.current
        if rec is None or view.epoch != notice.get("epoch") or rec.state.value != notice.get("state"):
            now = rec.state.value if rec is not None else "unreadable"
            self._say(
                room, event_id, f"This notification is old: task #{task} is {now} now. Nothing changed."
            )
            return
        kind = kind_of(view)
        intent = parse(kind, text) if kind else None
        rule = None
        if intent is not None:
            waiting, approval = card_kind(view, rec)
            rule = match(intent.trigger, rec.state, waiting=waiting, approval=approval)
        if intent is None or rule is None:
            said = text.replace("\n", " ")[:80]
            what = WHAT.get(kind, f"a task that is {rec.state.value}")
            howto = f" Write {HOWTO[kind]}." if kind else ""
            self._say(
                room,
                event_id,
                f"I read “{said}” as a reply about task #{task} ({what}), but not as an answer: "
                f"nothing changed.{howto}",
            )
            return
        username = username_of(fab.cards, sender)
        assert view.spec is not None
        col = {Trigger.TO_DONE: Column.DONE, Trigger.TO_QUEUED: Column.QUEUED}.get(
            intent.trigger, Column.WAITING
        )
        g = Gesture(
            view, rec, col, view.spec.queue, acts.person_id(fab.cards, username), username, intent.text, WHERE
        )
        try:
            perform(fab, g, rule, self.report)
        except Refused as exc:
            self._say(room, event_id, f"{exc} Nothing changed on task #{task}.")
            return
        except IllegalTransition as exc:
            self._say(room, event_id, f"{exc.line()} Nothing changed on task #{task}.")
            return
        self.report.acted[task] = rule.handler
        self.report.by[task] = g.by
        log.info("task #%s: %s by %s (a Matrix reply)", task, rule.handler, g.by)
        self._say(room, event_id, f"Task #{task}: {intent.done}.", acted=True)

    def _say(self, room: str, event_id: str, text: str, *, acted: bool = False) -> None:
        """One reply to the person's message (never two: its txn id is the message's)."""
        if self.quiet and not acted:
            return
        content = {
            "msgtype": "m.notice",
            "body": text,
            "m.relates_to": {"m.in_reply_to": {"event_id": event_id}},
        }
        MatrixNotifier(self.homeserver, room, self.token).post(content, new_txn_id(f"reply/{event_id}", room))
        self.report.answered[event_id] = text


__all__ = [
    "HOWTO",
    "Intent",
    "MatrixReplies",
    "ReplyReport",
    "kind_of",
    "matrix_channels",
    "parse",
    "strip_fallback",
    "sync_key",
    "username_of",
]
