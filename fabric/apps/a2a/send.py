"""``SendMessage`` for one agent: a new message (sync or async), a retried one, or a follow-up.

* A **new** message runs the agent here (sync; :meth:`A2AService.start_sync`) or becomes a
  fabric task (``returnImmediately``; :meth:`A2AService.submit`).
* A **retried** message (same caller, same ``messageId``) returns the task the first one
  made; it must be the same message.
* A **follow-up** (the message names a task) answers an input-required task: a sync call
  runs again with the answer in its conversation, an async task is resumed on the board.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from a2a.server.context import ServerCallContext
from a2a.types.a2a_pb2 import Message, SendMessageRequest, Task, TaskPushNotificationConfig
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    InvalidParamsError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from fabric.core import Fabric
from fabric.kanboard.port import BoardError
from fabric.kanboard.taskboard import TaskNotFound, TaskView
from fabric.ledger import IllegalTransition, LedgerError
from fabric.task import State

from . import convert as cv
from . import store as st
from .journal import actor_for
from .service import FINAL_BOARD, A2AService, board_error

PUSH_REFUSED = "push notification URL refused (private or unresolvable targets need AGAP_A2A_PUSH_ALLOW)"


@dataclass(frozen=True)
class Incoming:
    """One checked ``SendMessage``: who sent what, and where its updates are pushed."""

    caller: str
    message: Message
    intent: str
    refs: list[str]
    push: TaskPushNotificationConfig | None
    context: ServerCallContext


class Sender:
    """``SendMessage`` on one agent (see the module docstring)."""

    def __init__(self, service: A2AService, agent: str) -> None:
        self.s = service
        self.agent = agent

    async def send(
        self, params: SendMessageRequest, context: ServerCallContext, caller: str, *, streaming: bool = False
    ) -> tuple[Task, st.TaskRow]:
        """The task the message made (or, for a retry or a follow-up, the task it names)."""
        intent, refs = _checked(params.message)
        m = Incoming(caller, params.message, intent, refs, await self._push_config(params), context)
        if m.message.task_id:
            return await self._follow_up(m)
        async_mode = params.configuration.return_immediately and not streaming
        if not async_mode:
            self._check_sync()
        seen = self.s.store.seen_message(caller, m.message.message_id)
        if seen is not None:
            return await self._retried(m, seen, async_mode=async_mode)
        context_id = m.message.context_id or cv.new_sync_id()[2:]
        if async_mode:
            return await self._send_async(m, context_id)
        await self._check_parked()
        return await self._send_sync(m, context_id, streaming=streaming)

    async def _push_config(self, params: SendMessageRequest) -> TaskPushNotificationConfig | None:
        """The message's push config, if any, once the push policy accepts its URL."""
        if not params.configuration.HasField("task_push_notification_config"):
            return None
        push = params.configuration.task_push_notification_config
        if not await self.s.policy.accepts(push.url):
            raise InvalidParamsError(message=PUSH_REFUSED)
        return push

    def _check_sync(self) -> None:
        card = self.s.cards.get(self.agent)
        if not self.s.runner.can_sync(card):
            raise UnsupportedOperationError(
                message=f"{self.agent} is worked outside the fabric's model path "
                f"({card.runtime.mode}); send with returnImmediately: true"
            )

    async def _check_parked(self) -> None:
        """A parked agent refuses a sync call at once, saying why and when it frees."""
        # Off the loop: the check takes the ledger's file lock, and may probe a sleeping node.
        card = self.s.cards.get(self.agent)
        parked = await asyncio.to_thread(self.s.runner.admission.parked, card)
        if parked is not None:
            raise UnsupportedOperationError(message=parked.line(), data=parked.data())

    async def _retried(self, m: Incoming, task_id: str, *, async_mode: bool) -> tuple[Task, st.TaskRow]:
        """A message id seen before: the task it made (a sync call once it has finished)."""
        row = await self.s.find(task_id, m.caller, self.agent)
        same_message(row, m.intent, m.refs)
        if row.kind == st.SYNC and not async_mode:
            row = await self.s.wait_sync(row)
        return await self.s.task_of(row), row

    async def _send_async(self, m: Incoming, context_id: str) -> tuple[Task, st.TaskRow]:
        row, created = await self.s.submit(m.caller, self.agent, m.message, context_id, m.intent, m.refs)
        task = await self.s.task_of(row)
        if m.push is not None:
            await self.s.push_configs.set_info(row.task_id, m.push, m.context)
            self.s.watch(row, (State.QUEUED.value, 0) if created else None)
        return task, row

    async def _send_sync(self, m: Incoming, context_id: str, *, streaming: bool) -> tuple[Task, st.TaskRow]:
        row = st.TaskRow(
            task_id=cv.new_sync_id(),
            caller=m.caller,
            agent=self.agent,
            kind=st.SYNC,
            context_id=context_id,
            message_id=m.message.message_id,
            intent=m.intent,
            refs=m.refs,
            state=st.WORKING,
        )
        existing = self.s.store.claim_message(row)
        if existing is not None:  # a concurrent retry won the message id
            if existing.agent != self.agent:
                raise InvalidParamsError(message="this messageId was already used")
            same_message(existing, m.intent, m.refs)
            return await self.s.task_of(await self.s.wait_sync(existing)), existing
        if m.push is not None:
            await self.s.push_configs.set_info(row.task_id, m.push, m.context)
        if streaming:
            self.s.start_sync(row)
            return cv.sync_task(row), row
        row = await asyncio.shield(self.s.start_sync(row))
        return cv.sync_task(row), row

    # -- follow-ups -----------------------------------------------------------------------

    async def _follow_up(self, m: Incoming) -> tuple[Task, st.TaskRow]:
        row = await self.s.find(m.message.task_id, m.caller, self.agent)
        if m.message.context_id and m.message.context_id != row.context_id:
            raise InvalidParamsError(message="contextId does not match the task's context")
        digest = st.message_digest(row.task_id, m.intent, m.refs)
        seen = self.s.store.note_message(m.caller, m.message.message_id, row.task_id, digest)
        if seen is not None:
            if seen not in ("", digest):  # never drop an answer while saying it was taken
                raise InvalidParamsError(
                    message="this messageId was already used for a different message; "
                    "send the answer with a new messageId"
                )
            # A retried follow-up: the answer was already taken.
            if row.kind == st.SYNC:
                row = await self.s.wait_sync(row)
            return await self.s.task_of(row), row
        try:
            if m.push is not None:
                await self.s.push_configs.set_info(row.task_id, m.push, m.context)
            if row.kind == st.SYNC:
                return await self._answer_sync(row, m.intent)
            return await self._resume_async(row, m)
        except BaseException:
            self.s.store.forget_message(m.caller, m.message.message_id)
            raise

    async def _answer_sync(self, row: st.TaskRow, text: str) -> tuple[Task, st.TaskRow]:
        """The sync call again, with the caller's answer in its conversation."""
        if row.state != st.INPUT_REQUIRED:
            raise not_waiting(row.state in st.SYNC_TERMINAL)
        await self._check_parked()
        row.conversation = [*row.conversation, ("answer", text)]
        row.state = st.WORKING
        self.s.store.save(row)
        row = await asyncio.shield(self.s.start_sync(row))
        return cv.sync_task(row), row

    async def _resume_async(self, row: st.TaskRow, m: Incoming) -> tuple[Task, st.TaskRow]:
        """The board task resumed with the caller's answer (``Ledger.resume``)."""
        assert row.board_task_id is not None
        bid, actor, text = row.board_task_id, actor_for(m.caller), m.intent

        def resume(fab: Fabric) -> TaskView:
            view = fab.board.read(bid)
            cur = view.current
            if view.uid != row.board_uid or cur is None:
                raise TaskNotFound(bid)
            if cur.state != State.INPUT_REQUIRED:
                raise IllegalTransition(cur.state.value)
            fab.ledger.resume(bid, actor, text, view=view)
            return fab.board.read(bid)

        try:
            view = await self.s.board.run(resume)
        except TaskNotFound:
            raise TaskNotFoundError from None
        except IllegalTransition as exc:
            terminal = exc.what in {s.value for s in FINAL_BOARD}
            raise not_waiting(terminal) from None
        except (BoardError, LedgerError) as exc:
            raise board_error(exc) from None
        if m.push is not None:
            self.s.watch(row, None)
        return await self.s.board_task(row, view), row


def _checked(msg: Message) -> tuple[str, list[str]]:
    """The message's text and refs; a message without an id or text, or a bad ref, is refused."""
    if not msg.message_id:
        raise InvalidParamsError(message="message.messageId is required")
    kinds = {p.WhichOneof("content") for p in msg.parts}
    if kinds - {"text", "url"}:
        # The card declares text/plain input; a URL part is a context ref (by reference).
        unsupported = ", ".join(sorted(k or "empty" for k in kinds - {"text", "url"}))
        raise ContentTypeNotSupportedError(
            message=f"unsupported part ({unsupported}): this agent takes text parts, "
            "and URL parts as context refs"
        )
    intent, refs = cv.message_text(msg), cv.message_refs(msg)
    if not intent:
        if msg.parts:
            raise ContentTypeNotSupportedError(message="the message has no text part: this agent takes text")
        raise InvalidParamsError(message="the message has no parts")
    if cv.bad_refs(refs):
        raise InvalidParamsError(message=f"not a URI: {cv.bad_refs(refs)[0]!r}")
    return intent, refs


def same_message(row: st.TaskRow, intent: str, refs: list[str]) -> None:
    """A retried message must be the same message (the board's receipt rule)."""
    if row.intent.strip() != intent.strip() or list(row.refs) != list(refs):
        raise InvalidParamsError(message="this messageId was already used for a different message")


def not_waiting(terminal: bool) -> A2AError:
    """The refusal of a follow-up to a task that is not waiting for input."""
    if terminal:
        return UnsupportedOperationError(
            message="the task is finished: a terminal task accepts no more messages"
        )
    return UnsupportedOperationError(message="the task is not waiting for input")
