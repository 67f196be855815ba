"""The fabric behind the A2A surface: sync calls, async tasks, scoping, dedupe, push.

One :class:`A2AService` is shared by every agent the server exposes; each agent gets a
:class:`~fabric.apps.a2a.handler.FabricRequestHandler` (the SDK's ``RequestHandler``
interface), which the SDK's JSON-RPC routes call with the parsed request and the caller in
the call context. ``SendMessage`` itself is :mod:`fabric.apps.a2a.send`.

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

This module is the shared state and its background work: the board lanes, the sync
executions, journaling, the push watch, and reading a caller's task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from a2a.types.a2a_pb2 import Message, Task
from a2a.utils.errors import A2AError, InternalError, InvalidParamsError, TaskNotFoundError

from fabric.cards import CardSet
from fabric.core import Fabric
from fabric.errors import FabricError, InvalidInput
from fabric.kanboard.port import BoardError
from fabric.kanboard.taskboard import TaskNotFound, TaskView
from fabric.ledger import LedgerError
from fabric.policy import PolicyRefused
from fabric.results import AttachmentStore
from fabric.submit import ActionIdCollision
from fabric.task import State

from . import convert as cv
from . import store as st
from .journal import Journal, actor_for, flush, reconcile
from .push import DurablePushConfigs, PushPolicy, RetryingPushSender
from .runner import Answer, Runner

log = logging.getLogger("agap.a2a")
T = TypeVar("T")

FINAL_BOARD = frozenset({State.DONE, State.CLOSED, State.DEAD, State.CANCELED, State.DROPPED})


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


def board_error(exc: Exception) -> A2AError:
    """What a caller is told when the board fails under a request (the details go to the log)."""
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
        self.push_configs = DurablePushConfigs(self.store)
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
        self._rearm_pushes()
        self._loops.append(asyncio.create_task(self._watch_loop()))
        self._loops.append(asyncio.create_task(self._journal_loop()))

    def _rearm_pushes(self) -> None:
        """Owe every receiver the end of its task again: watch async tasks, push ended sync ones.

        An async task is watched with no known state, so its current state is pushed on the
        first pass (at-least-once) and its end when it comes; a sync task cut short by the
        stop was just recorded as failed by the reconcile, and that end is pushed now.
        """
        for task_id in self.store.open_pushes():
            row = self.store.get(task_id)
            if row is None:
                continue
            if row.kind == st.ASYNC:
                self.watch(row, None)
            elif row.state in st.SYNC_TERMINAL:
                self.notify(task_id, cv.sync_task(row))

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
            task = await self.board_task(row, view, with_result=True)
            if view.current.state in FINAL_BOARD:
                self._watched.pop(tid, None)
            self.notify(tid, task)

    def notify(self, task_id: str, task: Task) -> None:
        """Push ``task``'s new state to the caller's push config, if it set one.

        Once a terminal state has been delivered (or ran out of retries) the task owes its
        receivers nothing more, and a restart does not push it again.
        """
        if self.push is None:
            return
        push = self.push

        async def go() -> None:
            await push.send_notification(task_id, task)
            if task.status.state in cv.TERMINAL:
                self.store.push_finished(task_id)

        self._spawn(go())

    # -- journaling ---------------------------------------------------------------------

    def journal_soon(self, task_id: str) -> None:
        """Journal a finished sync call to the board shortly (after the reply has left)."""

        async def go() -> None:
            await asyncio.sleep(self.config.journal_delay_seconds)

            def work(fab: Fabric) -> None:
                row = self.store.get(task_id)
                if row is None or row.journal != st.J_PENDING:
                    return
                j = self._journal(fab).record(row)
                row.board_task_id, row.board_uid, row.journal = j.task_id, j.uid, st.J_DONE
                self.store.save(row, touch=False)
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
                caller=row.caller,
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
            self.journal_soon(row.task_id)
        self.notify(row.task_id, cv.sync_task(row))
        return row

    def cancel_sync(self, row: st.TaskRow) -> Task:
        """Cancel a sync call now: recorded, journaled soon; a model call still running is dropped."""
        row.state, row.error, row.journal = st.CANCELED, "canceled by the caller", st.J_PENDING
        self.store.save(row)
        running = self._exec.get(row.task_id)
        if running is not None:
            running.cancel()
        self.journal_soon(row.task_id)
        task = cv.sync_task(row)
        self.notify(row.task_id, task)
        return task

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
        try:
            text = await self.board.run(lambda fab: AttachmentStore(fab.board).get(ref))
        except FabricError:
            return None
        if len(self._results) > 1000:
            self._results.clear()
        self._results[ref] = text
        return text

    async def board_task(self, row: st.TaskRow, view: TaskView, *, with_result: bool = True) -> Task:
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
            raise board_error(exc) from None
        if view.uid != row.board_uid or view.current is None:
            raise TaskNotFoundError
        return view, await self.board_task(row, view)

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
            raise board_error(exc) from None
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
            raise board_error(exc) from None
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
        """Watch an async task for push (``key``: its last known state and epoch)."""
        if row.kind == st.ASYNC:
            self._watched[row.task_id] = _Watch(row.caller, row.agent, key)

    def unwatch(self, task_id: str, final: Task) -> None:
        """Stop watching a task that ended here; a watched one pushes its ``final`` state."""
        if self._watched.pop(task_id, None) is not None:
            self.notify(task_id, final)
