"""The fabric behind the A2A surface: sync calls, async tasks, scoping, dedupe, push.

One :class:`A2AService` is shared by every agent the server exposes; each agent gets a
:class:`FabricRequestHandler` (the SDK's ``RequestHandler`` interface), which the SDK's
JSON-RPC routes call with the parsed request and the caller in the call context.

* **Sync** (``SendMessage`` without ``returnImmediately``): the agent runs right here,
  through the workers' model path (:mod:`fabric.apps.a2a.runner`); the board is not touched
  until the answer exists. A local row (:mod:`fabric.apps.a2a.store`) is written before the
  model call so a crash cannot leave the task working forever; the finished call is then
  journaled to the board on a separate thread (:mod:`fabric.apps.a2a.journal`).
* **Async** (``returnImmediately: true``): the message becomes a fabric task through
  ``Fabric.submit`` (actor ``a2a:<caller>``, action id = ``messageId``, so a retried
  message returns the same task); ``GetTask``/``ListTasks`` read its state from the
  board; ``CancelTask`` is a ledger transition; a follow-up message with the task's id
  answers an input-required task (``Ledger.resume``).
* **Scope**: every task belongs to the caller who created it, on the agent it was sent
  to; anyone else gets "task not found" (-32001), exactly as for an unknown id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.tasks import InMemoryPushNotificationConfigStore
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
    A2AError,
    ExtendedAgentCardNotConfiguredError,
    InternalError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.errors import FabricError, InvalidInput
from fabric.kanboard.layout import State
from fabric.kanboard.port import BoardError
from fabric.kanboard.taskboard import TaskNotFound, TaskView
from fabric.ledger import IllegalTransition, LedgerError
from fabric.policy import PolicyRefused
from fabric.submit import ActionIdCollision

from . import convert as cv
from . import store as st
from .journal import Journal, actor_for, flush, reconcile
from .push import PushPolicy, RetryingPushSender
from .runner import Answer, Runner

log = logging.getLogger("agap.a2a")
T = TypeVar("T")

MAX_PAGE = 100
DEFAULT_PAGE = 50
FINAL_BOARD = frozenset({State.DONE, State.CLOSED, State.DEAD, State.CANCELED})


@dataclass
class ServiceConfig:
    """Knobs of the A2A service (the defaults suit a household server)."""

    watch_seconds: float = 2.0  # board poll for push/subscribe on async tasks (never sync)
    journal_retry_seconds: float = 30.0
    journal_delay_seconds: float = 0.05  # let the reply leave before the journal writes
    follow_max_seconds: float = 600.0  # longest an async SubscribeToTask stays open
    board_threads: int = 2
    retention_days: float = 30.0
    push_attempts: int = 5
    push_base_delay: float = 0.5
    push_timeout: float = 10.0
    reconcile_reason: str = "the A2A server stopped during the sync call (found at restart)"


class BoardLane:
    """Board work off the event loop: a few threads, one :class:`Fabric` per thread."""

    def __init__(self, connect: Callable[[], Fabric], threads: int, name: str) -> None:
        self.connect = connect
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self._local = threading.local()
        self.fabrics: list[Fabric] = []
        self._lock = threading.Lock()

    def _fabric(self) -> Fabric:
        fab: Fabric | None = getattr(self._local, "fab", None)
        if fab is None:
            fab = self.connect()
            self._local.fab = fab
            with self._lock:
                self.fabrics.append(fab)
        return fab

    async def run(self, fn: Callable[[Fabric], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(self._fabric()))

    def trips(self) -> int:
        """Round trips made to the board so far by this lane's connections."""
        with self._lock:
            return sum(f.port.stats.trips for f in self.fabrics)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _board_error(exc: Exception) -> A2AError:
    log.warning("board error: %s", exc)
    return InternalError(message="the task board is unavailable; try again")


@dataclass
class _Watch:
    caller: str
    agent: str
    key: tuple[str, int] | None


@dataclass
class A2AService:
    """Shared state of the A2A server (see the module docstring)."""

    cards: CardSet
    store: st.CallStore
    runner: Runner
    connect: Callable[[], Fabric]
    env: Mapping[str, str] = field(default_factory=dict)
    config: ServiceConfig = field(default_factory=ServiceConfig)
    owner: str | None = None

    def __post_init__(self) -> None:
        self.board = BoardLane(self.connect, self.config.board_threads, "a2a-board")
        self.journal_lane = BoardLane(self.connect, 1, "a2a-journal")
        self.push_configs = InMemoryPushNotificationConfigStore()
        self.policy = PushPolicy.from_env(self.env)
        self._http: httpx.AsyncClient | None = None
        self.push: RetryingPushSender | None = None
        self._exec: dict[str, asyncio.Task[st.TaskRow]] = {}
        self._pending: set[asyncio.Future[Any]] = set()
        self._watched: dict[str, _Watch] = {}
        self._results: dict[str, str] = {}
        self._loops: list[asyncio.Task[None]] = []
        self.journaled = 0
        self.last_reconcile: dict[str, int] = {}

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._http = httpx.AsyncClient(timeout=self.config.push_timeout, follow_redirects=False)
        self.push = RetryingPushSender(
            self._http,
            self.push_configs,
            self.policy,
            attempts=self.config.push_attempts,
            base_delay=self.config.push_base_delay,
        )
        self.store.prune(time.time() - self.config.retention_days * 86400)
        try:
            self.last_reconcile = await self.journal_lane.run(
                lambda fab: reconcile(self.store, self._journal(fab), reason=self.config.reconcile_reason)
            )
        except (FabricError, OSError) as exc:
            log.warning("reconcile at start: board unavailable (%s); retrying later", exc)
        if self.last_reconcile.get("interrupted"):
            log.warning(
                "a2a: %d sync call(s) were cut short by the last stop: recorded as failed",
                self.last_reconcile["interrupted"],
            )
        self._loops.append(asyncio.create_task(self._watch_loop()))
        self._loops.append(asyncio.create_task(self._journal_loop()))

    async def stop(self, *, timeout: float = 10.0) -> None:
        for t in self._loops:
            t.cancel()
        for t in self._loops:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._loops.clear()
        pending = [*self._exec.values(), *self._pending]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        if self._http is not None:
            await self._http.aclose()
        self.board.close()
        self.journal_lane.close()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    def _journal(self, fab: Fabric) -> Journal:
        return Journal(fab, owner=self.owner)

    def _spawn(self, coro: Any) -> None:
        fut = asyncio.ensure_future(coro)
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)

    # -- background loops ---------------------------------------------------------------

    async def _journal_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.journal_retry_seconds)
            if self.store.unjournaled():
                with contextlib.suppress(FabricError, OSError):
                    self.journaled += await self.journal_lane.run(
                        lambda fab: flush(self.store, self._journal(fab))
                    )

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.watch_seconds)
            try:
                await self._watch_once()
            except (FabricError, OSError) as exc:
                log.warning("push watch: %s", exc)

    async def _watch_once(self) -> None:
        if not self._watched:
            return
        rows = {tid: self.store.get(tid) for tid in list(self._watched)}
        ids = [r.board_task_id for r in rows.values() if r and r.board_task_id]
        views = await self.board.run(lambda fab: fab.board.read_many(ids))
        for tid, row in rows.items():
            w = self._watched.get(tid)
            if row is None or w is None or row.board_task_id is None:
                self._watched.pop(tid, None)
                continue
            view = views.get(row.board_task_id)
            if view is None or view.current is None:
                continue
            key = (view.current.state.value, view.epoch)
            if key == w.key:
                continue
            w.key = key
            task = await self._board_task(row, view, with_result=True)
            if view.current.state in FINAL_BOARD:
                self._watched.pop(tid, None)
            self._notify(tid, task)

    def _notify(self, task_id: str, task: Task) -> None:
        if self.push is not None:
            self._spawn(self.push.send_notification(task_id, task))

    # -- journaling ---------------------------------------------------------------------

    def _journal_soon(self, task_id: str) -> None:
        async def go() -> None:
            await asyncio.sleep(self.config.journal_delay_seconds)

            def work(fab: Fabric) -> None:
                row = self.store.get(task_id)
                if row is None or row.journal != st.J_PENDING:
                    return
                j = self._journal(fab).record(row)
                row.board_task_id, row.board_uid, row.journal = j.task_id, j.uid, st.J_DONE
                self.store.save(row)
                self.journaled += 1

            try:
                await self.journal_lane.run(work)
            except (FabricError, OSError) as exc:
                log.warning("sync task %s: journal deferred (%s)", task_id, exc)

        self._spawn(go())

    # -- sync execution -------------------------------------------------------------------

    def start_sync(self, row: st.TaskRow) -> asyncio.Task[st.TaskRow]:
        task = asyncio.ensure_future(self._execute(row))
        self._exec[row.task_id] = task
        task.add_done_callback(lambda _t: self._exec.pop(row.task_id, None))
        return task

    async def _execute(self, row: st.TaskRow) -> st.TaskRow:
        key = f"a2a:{row.caller}:{row.message_id}:{len(row.conversation)}"
        try:
            answer = await asyncio.to_thread(
                self.runner.run,
                row.agent,
                row.intent,
                row.refs,
                key=key,
                conversation=row.conversation,
                metadata={"a2a_task": row.task_id, "trace_user_id": row.caller},
            )
        except asyncio.CancelledError:
            answer = Answer("canceled", "canceled by the caller")
        except Exception:
            log.exception("sync task %s", row.task_id)
            answer = Answer("failed", "internal error (see the server log)")
        fresh = self.store.get(row.task_id) or row
        if fresh.state == st.CANCELED:  # canceled while the model ran: drop the answer
            return fresh
        if answer.kind == "done":
            row.state, row.result = st.COMPLETED, answer.text
        elif answer.kind == "ask":
            row.state = st.INPUT_REQUIRED
            row.conversation = [*row.conversation, ("question", answer.text)]
        elif answer.kind == "canceled":
            row.state, row.error = st.CANCELED, answer.text
        else:
            row.state, row.error = st.FAILED, answer.text
        if row.state in st.SYNC_TERMINAL:
            row.journal = st.J_PENDING
        self.store.save(row)
        if row.journal == st.J_PENDING:
            self._journal_soon(row.task_id)
        self._notify(row.task_id, cv.sync_task(row))
        return row

    async def wait_sync(self, row: st.TaskRow) -> st.TaskRow:
        """The row once its running execution (if any) finished."""
        running = self._exec.get(row.task_id)
        if running is not None:
            return await asyncio.shield(running)
        return self.store.get(row.task_id) or row

    # -- board reads --------------------------------------------------------------------

    async def _result_text(self, ref: str | None) -> str | None:
        if not ref or not ref.startswith("kanboard://"):
            return None
        if ref in self._results:
            return self._results[ref]
        from workers.results import AttachmentStore

        try:
            text = await self.board.run(lambda fab: AttachmentStore(fab.board).get(ref))
        except FabricError:
            return None
        if len(self._results) > 1000:
            self._results.clear()
        self._results[ref] = text
        return text

    async def _board_task(self, row: st.TaskRow, view: TaskView, *, with_result: bool = True) -> Task:
        cur = view.current
        result = None
        if with_result and cur is not None and cur.state in (State.DONE, State.CLOSED):
            result = await self._result_text(cur.result_ref)
        return cv.board_task(row, view, result=result)

    async def read_async(self, row: st.TaskRow) -> tuple[TaskView, Task]:
        assert row.board_task_id is not None
        bid = row.board_task_id
        try:
            view = await self.board.run(lambda fab: fab.board.read(bid))
        except TaskNotFound:
            raise TaskNotFoundError from None
        except BoardError as exc:
            raise _board_error(exc) from None
        if view.uid != row.board_uid or view.current is None:
            raise TaskNotFoundError
        return view, await self._board_task(row, view)

    async def find(self, task_id: str, caller: str, agent: str) -> st.TaskRow:
        """The caller's task on ``agent``; "not found" for anyone else's."""
        row = self.store.get(task_id)
        if row is not None:
            if row.caller != caller or row.agent != agent:
                raise TaskNotFoundError
            return row
        parsed = cv.parse_async_id(task_id)
        if parsed is None:
            raise TaskNotFoundError
        bid, uid = parsed
        try:
            view = await self.board.run(lambda fab: fab.board.read(bid))
        except TaskNotFound:
            raise TaskNotFoundError from None
        except BoardError as exc:
            raise _board_error(exc) from None
        spec = view.spec
        if view.uid != uid or spec is None or spec.actor != actor_for(caller) or spec.target != agent:
            raise TaskNotFoundError
        row = cv.async_row_from_view(view, caller, agent)
        self.store.save(row)
        return row

    async def task_of(self, row: st.TaskRow) -> Task:
        if row.kind == st.SYNC:
            return cv.sync_task(row)
        return (await self.read_async(row))[1]

    # -- async submit ---------------------------------------------------------------------

    async def submit(
        self, caller: str, agent: str, message: Message, context_id: str, intent: str, refs: list[str]
    ) -> tuple[st.TaskRow, bool]:
        actor = actor_for(caller)

        def work(fab: Fabric) -> Any:
            return fab.submit(intent, target=agent, key=message.message_id, actor=actor, refs=refs)

        try:
            receipt = await self.board.run(work)
        except ActionIdCollision:
            raise InvalidParamsError(
                message="this messageId was already used for a different message"
            ) from None
        except (InvalidInput, PolicyRefused) as exc:
            # A refusal names the rule and the limit (quota, depth, cycle, privacy, taint).
            raise InvalidParamsError(message=exc.line()) from None
        except (BoardError, LedgerError) as exc:
            raise _board_error(exc) from None
        tid = cv.async_task_id(receipt.task_id, receipt.uid)
        row = st.TaskRow(
            task_id=tid,
            caller=caller,
            agent=agent,
            kind=st.ASYNC,
            context_id=context_id,
            message_id=message.message_id,
            intent=intent,
            refs=refs,
            state=st.BOARD,
            board_task_id=receipt.task_id,
            board_uid=receipt.uid,
        )
        existing = self.store.claim_message(row)
        return (existing or row), receipt.created

    def watch(self, row: st.TaskRow, key: tuple[str, int] | None) -> None:
        if row.kind == st.ASYNC:
            self._watched[row.task_id] = _Watch(row.caller, row.agent, key)


def _same_message(row: st.TaskRow, intent: str, refs: list[str]) -> None:
    """A retried message must be the same message (the board's receipt rule)."""
    if row.intent.strip() != intent.strip() or list(row.refs) != list(refs):
        raise InvalidParamsError(message="this messageId was already used for a different message")


def _caller(context: ServerCallContext) -> str:
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

    # -- SendMessage --------------------------------------------------------------------

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        task, _ = await self._send(params, context)
        return apply_history_length(task, params.configuration)

    async def _send(
        self, params: SendMessageRequest, context: ServerCallContext, *, streaming: bool = False
    ) -> tuple[Task, st.TaskRow]:
        caller = _caller(context)
        msg = params.message
        if not msg.message_id:
            raise InvalidParamsError(message="message.messageId is required")
        intent, refs = cv.message_text(msg), cv.message_refs(msg)
        if not intent:
            raise InvalidParamsError(message="the message has no text part")
        if cv.bad_refs(refs):
            raise InvalidParamsError(message=f"not a URI: {cv.bad_refs(refs)[0]!r}")
        push = (
            params.configuration.task_push_notification_config
            if params.configuration.HasField("task_push_notification_config")
            else None
        )
        if push is not None and not await self.s.policy.accepts(push.url):
            raise InvalidParamsError(
                message="push notification URL refused (private or "
                "unresolvable targets need AGAP_A2A_PUSH_ALLOW)"
            )
        if msg.task_id:
            return await self._follow_up(caller, msg, intent, push, context)
        card = self.s.cards.get(self.agent)
        async_mode = params.configuration.return_immediately and not streaming
        if not async_mode and not self.s.runner.can_sync(card):
            raise UnsupportedOperationError(
                message=f"{self.agent} is worked outside the fabric's model path "
                f"({card.runtime.mode}); send with returnImmediately: true"
            )
        seen = self.s.store.seen_message(caller, msg.message_id)
        if seen is not None:
            row = await self.s.find(seen, caller, self.agent)
            _same_message(row, intent, refs)
            if row.kind == st.SYNC and not async_mode:
                row = await self.s.wait_sync(row)
            return await self.s.task_of(row), row
        context_id = msg.context_id or cv.new_sync_id()[2:]
        if async_mode:
            row, created = await self.s.submit(caller, self.agent, msg, context_id, intent, refs)
            task = await self.s.task_of(row)
            if push is not None:
                await self.s.push_configs.set_info(row.task_id, push, context)
                self.s.watch(row, (State.QUEUED.value, 0) if created else None)
            return task, row
        row = st.TaskRow(
            task_id=cv.new_sync_id(),
            caller=caller,
            agent=self.agent,
            kind=st.SYNC,
            context_id=context_id,
            message_id=msg.message_id,
            intent=intent,
            refs=refs,
            state=st.WORKING,
        )
        existing = self.s.store.claim_message(row)
        if existing is not None:  # a concurrent retry won the message id
            if existing.agent != self.agent:
                raise InvalidParamsError(message="this messageId was already used")
            _same_message(existing, intent, refs)
            return await self.s.task_of(await self.s.wait_sync(existing)), existing
        if push is not None:
            await self.s.push_configs.set_info(row.task_id, push, context)
        if streaming:
            self.s.start_sync(row)
            return cv.sync_task(row), row
        row = await asyncio.shield(self.s.start_sync(row))
        return cv.sync_task(row), row

    async def _follow_up(
        self,
        caller: str,
        msg: Message,
        text: str,
        push: TaskPushNotificationConfig | None,
        context: ServerCallContext,
    ) -> tuple[Task, st.TaskRow]:
        row = await self.s.find(msg.task_id, caller, self.agent)
        if msg.context_id and msg.context_id != row.context_id:
            raise InvalidParamsError(message="contextId does not match the task's context")
        if not self.s.store.note_message(caller, msg.message_id, row.task_id):
            # A retried follow-up: the answer was already taken.
            if row.kind == st.SYNC:
                row = await self.s.wait_sync(row)
            return await self.s.task_of(row), row
        try:
            if push is not None:
                await self.s.push_configs.set_info(row.task_id, push, context)
            if row.kind == st.SYNC:
                if row.state != st.INPUT_REQUIRED:
                    raise self._not_waiting(row.state in st.SYNC_TERMINAL)
                row.conversation = [*row.conversation, ("answer", text)]
                row.state = st.WORKING
                self.s.store.save(row)
                row = await asyncio.shield(self.s.start_sync(row))
                return cv.sync_task(row), row
            assert row.board_task_id is not None
            bid, actor = row.board_task_id, actor_for(caller)

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
                raise self._not_waiting(terminal) from None
            except (BoardError, LedgerError) as exc:
                raise _board_error(exc) from None
            if push is not None:
                self.s.watch(row, None)
            return await self.s._board_task(row, view), row
        except BaseException:
            self.s.store.forget_message(caller, msg.message_id)
            raise

    @staticmethod
    def _not_waiting(terminal: bool) -> A2AError:
        if terminal:
            return UnsupportedOperationError(
                message="the task is finished: a terminal task accepts no more messages"
            )
        return UnsupportedOperationError(message="the task is not waiting for input")

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        task, row = await self._send(params, context, streaming=True)
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
        row = await self.s.find(params.id, _caller(context), self.agent)
        return apply_history_length(await self.s.task_of(row), params)

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        caller = _caller(context)
        size = params.page_size if params.HasField("page_size") else DEFAULT_PAGE
        if not 1 <= size <= MAX_PAGE:
            raise InvalidParamsError(message=f"pageSize must be 1..{MAX_PAGE}")
        try:
            offset = int(params.page_token or 0)
        except ValueError:
            raise InvalidParamsError(message="bad pageToken") from None
        filtered = bool(params.status) or params.HasField("status_timestamp_after")
        rows, total = self.s.store.list_for(
            caller,
            self.agent,
            context_id=params.context_id,
            offset=0 if filtered else offset,
            limit=1000 if filtered else size,
        )
        ids = [r.board_task_id for r in rows if r.kind == st.ASYNC and r.board_task_id]
        views: dict[int, TaskView] = {}
        if ids:
            try:
                views = await self.s.board.run(lambda fab: fab.board.read_many(ids))
            except BoardError as exc:
                raise _board_error(exc) from None
        tasks: list[Task] = []
        for r in rows:
            if r.kind == st.SYNC:
                tasks.append(cv.sync_task(r))
                continue
            view = views.get(r.board_task_id or 0)
            if view is None or view.current is None or view.uid != r.board_uid:
                continue
            tasks.append(await self.s._board_task(r, view, with_result=params.include_artifacts))
        if filtered:
            after = (
                params.status_timestamp_after.ToNanoseconds()
                if params.HasField("status_timestamp_after")
                else None
            )
            tasks = [
                t
                for t in tasks
                if (not params.status or t.status.state == params.status)
                and (after is None or t.status.timestamp.ToNanoseconds() > after)
            ]
            total = len(tasks)
            tasks = tasks[offset : offset + size]
        out = ListTasksResponse(
            page_size=size,
            total_size=total,
            next_page_token=str(offset + size) if offset + size < total else "",
        )
        for t in tasks:
            if not params.include_artifacts:
                t.ClearField("artifacts")
            out.tasks.append(apply_history_length(t, params))
        return out

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        caller = _caller(context)
        row = await self.s.find(params.id, caller, self.agent)
        if row.kind == st.SYNC:
            if row.state in st.SYNC_TERMINAL:
                raise TaskNotCancelableError
            row.state, row.error, row.journal = st.CANCELED, "canceled by the caller", st.J_PENDING
            self.s.store.save(row)
            running = self.s._exec.get(row.task_id)
            if running is not None:
                running.cancel()
            self.s._journal_soon(row.task_id)
            task = cv.sync_task(row)
            self.s._notify(row.task_id, task)
            return task
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
            raise _board_error(exc) from None
        task = await self.s._board_task(row, view)
        if row.task_id in self.s._watched:
            self.s._watched.pop(row.task_id, None)
            self.s._notify(row.task_id, task)
        return task

    # -- push notification configs ------------------------------------------------------

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        row = await self.s.find(params.task_id, _caller(context), self.agent)
        if not await self.s.policy.accepts(params.url):
            raise InvalidParamsError(
                message="push notification URL refused (private or "
                "unresolvable targets need AGAP_A2A_PUSH_ALLOW)"
            )
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
