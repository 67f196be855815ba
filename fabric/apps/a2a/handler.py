"""The SDK's request-handler interface for one agent, answered by the fabric.

``SendMessage`` is :mod:`fabric.apps.a2a.send`; the shared state (sync executions, board
reads, the push watch) is :class:`~fabric.apps.a2a.service.A2AService`. Here: the entry
points, the events a stream follows a task with, ``GetTask``/``ListTasks``/``CancelTask``,
push configs and ``SubscribeToTask``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length, validate_history_length

from fabric.core import Fabric
from fabric.kanboard.port import BoardError
from fabric.kanboard.taskboard import TaskNotFound, TaskView
from fabric.ledger import IllegalTransition, LedgerError

from . import convert as cv
from . import store as st
from .journal import actor_for
from .send import PUSH_REFUSED, Sender
from .service import FINAL_BOARD, A2AService, board_error

MAX_PAGE = 100
DEFAULT_PAGE = 50
MAX_LISTED = 1000  # ListTasks orders at most this many of a caller's newest tasks


@dataclass(frozen=True)
class _Listed:
    """One task of a ``ListTasks`` answer, with what it was read from."""

    task: Task
    row: st.TaskRow
    view: TaskView | None


def _caller(context: ServerCallContext) -> str:
    """The caller the bearer gate authenticated (every task is scoped to it)."""
    user = context.user
    if not user.is_authenticated or not user.user_name:
        raise InvalidParamsError(message="unauthenticated call")  # the gate stops these first
    return str(user.user_name)


class FabricRequestHandler(RequestHandler):
    """The SDK's request-handler interface, answered by the fabric for one agent."""

    def __init__(self, service: A2AService, agent: str, card: AgentCard) -> None:
        self.s = service
        self.agent = agent
        self.card = card
        self.sender = Sender(service, agent)

    # -- SendMessage / SendStreamingMessage -----------------------------------------------

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        validate_history_length(params.configuration)
        task, _ = await self.sender.send(params, context, _caller(context))
        return apply_history_length(task, params.configuration)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        validate_history_length(params.configuration)
        task, row = await self.sender.send(params, context, _caller(context), streaming=True)
        yield task
        async for event in self._follow(row, task):
            yield event

    async def _follow(self, row: st.TaskRow, first: Task) -> AsyncGenerator[Event]:
        """Events after ``first`` until the task ends or waits for input."""
        if first.status.state in cv.TERMINAL | cv.INTERRUPTED:
            return
        if row.kind == st.SYNC:
            done = await self.s.wait_sync(row)
            final = cv.sync_task(done, history=False)
            for art in final.artifacts:
                yield TaskArtifactUpdateEvent(
                    task_id=row.task_id, context_id=row.context_id, artifact=art, last_chunk=True
                )
            yield TaskStatusUpdateEvent(task_id=row.task_id, context_id=row.context_id, status=final.status)
            return
        last = (first.status.state, len(first.artifacts))
        deadline = time.monotonic() + self.s.config.follow_max_seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(self.s.config.watch_seconds)
            _, task = await self.s.read_async(row)
            key = (task.status.state, len(task.artifacts))
            if key == last:
                continue
            last = key
            for art in task.artifacts:
                yield TaskArtifactUpdateEvent(
                    task_id=row.task_id, context_id=row.context_id, artifact=art, last_chunk=True
                )
            yield TaskStatusUpdateEvent(task_id=row.task_id, context_id=row.context_id, status=task.status)
            if task.status.state in cv.TERMINAL | cv.INTERRUPTED:
                return

    # -- GetTask / ListTasks / CancelTask -----------------------------------------------------

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        validate_history_length(params)
        row = await self.s.find(params.id, _caller(context), self.agent)
        return apply_history_length(await self.s.task_of(row), params)

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """The caller's tasks, most recent status change first (the spec's order).

        An async task's last status change is on the board, so the order needs every
        candidate's state: up to :data:`MAX_LISTED` rows are read (one board read),
        sorted, filtered and cut to the page; only the page's results are fetched.
        """
        caller = _caller(context)
        validate_history_length(params)
        size, offset = _page(params)
        rows, _ = self.s.store.list_for(caller, self.agent, context_id=params.context_id, limit=MAX_LISTED)
        listed = [x for x in await self._tasks(rows) if _wanted(x.task, params)]
        listed.sort(key=lambda x: (x.task.status.timestamp.ToNanoseconds(), x.task.id), reverse=True)
        total = len(listed)
        out = ListTasksResponse(
            page_size=size,
            total_size=total,
            next_page_token=str(offset + size) if offset + size < total else "",
        )
        for x in listed[offset : offset + size]:
            task = x.task
            if not params.include_artifacts:
                task.ClearField("artifacts")
            elif x.view is not None:
                task = await self.s.board_task(x.row, x.view, with_result=True)
            out.tasks.append(apply_history_length(task, params))
        return out

    async def _tasks(self, rows: list[st.TaskRow]) -> list[_Listed]:
        """The rows as tasks: sync ones from the row, async ones from the board (one read)."""
        ids = [r.board_task_id for r in rows if r.kind == st.ASYNC and r.board_task_id]
        views: dict[int, TaskView] = {}
        if ids:
            try:
                views = await self.s.board.run(lambda fab: fab.board.read_many(ids))
            except BoardError as exc:
                raise board_error(exc) from None
        out: list[_Listed] = []
        for r in rows:
            if r.kind == st.SYNC:
                out.append(_Listed(cv.sync_task(r), r, None))
                continue
            view = views.get(r.board_task_id or 0)
            if view is None or view.current is None or view.uid != r.board_uid:
                continue
            out.append(_Listed(await self.s.board_task(r, view, with_result=False), r, view))
        return out

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        caller = _caller(context)
        row = await self.s.find(params.id, caller, self.agent)
        if row.kind == st.SYNC:
            if row.state in st.SYNC_TERMINAL:
                raise TaskNotCancelableError
            return self.s.cancel_sync(row)
        assert row.board_task_id is not None
        bid, actor = row.board_task_id, actor_for(caller)

        def cancel(fab: Fabric) -> TaskView:
            view = fab.board.read(bid)
            if view.uid != row.board_uid:
                raise TaskNotFound(bid)
            fab.ledger.cancel(bid, actor, "canceled over A2A", view=view)
            return fab.board.read(bid)

        try:
            view = await self.s.board.run(cancel)
        except TaskNotFound:
            raise TaskNotFoundError from None
        except IllegalTransition:
            raise TaskNotCancelableError from None
        except (BoardError, LedgerError) as exc:
            raise board_error(exc) from None
        task = await self.s.board_task(row, view)
        self.s.unwatch(row.task_id, task)
        return task

    # -- push notification configs ------------------------------------------------------

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        row = await self.s.find(params.task_id, _caller(context), self.agent)
        if not await self.s.policy.accepts(params.url):
            raise InvalidParamsError(message=PUSH_REFUSED)
        stored = await self.s.push_configs.set_info(row.task_id, params, context)
        if row.kind == st.ASYNC:
            view, _ = await self.s.read_async(row)
            cur = view.current
            assert cur is not None
            if cur.state not in FINAL_BOARD:
                self.s.watch(row, (cur.state.value, view.epoch))
        return stored

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        row = await self.s.find(params.task_id, _caller(context), self.agent)
        for config in await self.s.push_configs.get_info(row.task_id, context):
            if config.id == params.id:
                return config
        raise TaskNotFoundError(message="push notification config not found")

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        row = await self.s.find(params.task_id, _caller(context), self.agent)
        configs = await self.s.push_configs.get_info(row.task_id, context)
        return ListTaskPushNotificationConfigsResponse(configs=configs)

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        row = await self.s.find(params.task_id, _caller(context), self.agent)
        await self.s.push_configs.delete_info(row.task_id, context, params.id or None)

    # -- SubscribeToTask / extended card ------------------------------------------------

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        row = await self.s.find(params.id, _caller(context), self.agent)
        task = await self.s.task_of(row)
        if task.status.state in cv.TERMINAL:
            raise UnsupportedOperationError(
                message=f"task {row.task_id} is in terminal state {TaskState.Name(task.status.state)}"
            )
        yield task
        async for event in self._follow(row, task):
            yield event

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError


def _page(params: ListTasksRequest) -> tuple[int, int]:
    """``(page size, offset)`` of a ``ListTasks`` request."""
    size = params.page_size if params.HasField("page_size") else DEFAULT_PAGE
    if not 1 <= size <= MAX_PAGE:
        raise InvalidParamsError(message=f"pageSize must be 1..{MAX_PAGE}")
    try:
        offset = int(params.page_token or 0)
    except ValueError:
        raise InvalidParamsError(message="bad pageToken") from None
    return size, offset


def _wanted(task: Task, params: ListTasksRequest) -> bool:
    """The task is in the asked state and changed after the asked time (each when asked)."""
    if params.status and task.status.state != params.status:
        return False
    if params.HasField("status_timestamp_after"):
        return bool(task.status.timestamp.ToNanoseconds() > params.status_timestamp_after.ToNanoseconds())
    return True
