"""The client side of the MCP tasks extension (SEP-2663), on the official SDK's ``Client``.

``Client(..., extensions=[TasksExtension()])`` declares the extension on each request; a
server that answers ``tools/call`` with a task handle (``resultType: "task"``) is then
followed by ``tasks/get`` at the server's ``pollIntervalMs`` until the task ends, and
``client.call_tool`` returns the task's tool result as if the call had blocked. To hold
the handle instead: ``client.session.call_tool(..., allow_claimed=True)`` returns a
:class:`CreateTask`; :func:`rpc` with :class:`TasksGet`, :class:`TasksUpdate` or
:class:`TasksCancel` works on it.
"""

from __future__ import annotations

from typing import Any, Literal

import anyio
from mcp.client import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ErrorData, Request, RequestParams, Result, TextContent
from pydantic import BaseModel, ConfigDict, Field

TASKS = "io.modelcontextprotocol/tasks"


class Raw(BaseModel):
    """Any result, as the wire had it (every key is an extra)."""

    model_config = ConfigDict(extra="allow")


class CreateTask(Result):
    """A task handle in place of a tool result."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    result_type: Literal["task"] = Field(default="task", alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str


class TaskParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True)
    task_id: str = Field(alias="taskId")
    input_responses: Any = Field(default=None, alias="inputResponses")


class TasksGet(Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"  # the extension's Mcp-Name routing header


class TasksUpdate(Request[TaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param = "taskId"


class TasksCancel(Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


async def rpc(session: ClientSession | Client, request: Any) -> dict[str, Any]:
    """One request; its result as the wire had it."""
    s = session.session if isinstance(session, Client) else session
    return dict((await s.send_request(request, Raw)).model_extra or {})


async def get_task(session: ClientSession | Client, handle: str) -> dict[str, Any]:
    return await rpc(session, TasksGet(params=TaskParams(task_id=handle)))


FINAL = {"completed", "failed", "cancelled"}


class TasksExtension(ClientExtension):
    """Declares the extension; a handle is followed to its end (``poll_ms`` overrides the
    server's ``pollIntervalMs``)."""

    identifier = TASKS

    def __init__(self, *, poll_ms: int | None = None) -> None:
        self.poll_ms = poll_ms
        self.polls = 0

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTask, resolve=self._follow)]

    async def _follow(self, handle: CreateTask, ctx: ClaimContext) -> CallToolResult:
        task: dict[str, Any] = {"status": handle.status, **(handle.model_extra or {})}
        while task["status"] not in FINAL:
            wait = self.poll_ms if self.poll_ms is not None else int(task.get("pollIntervalMs") or 1000)
            await anyio.sleep(wait / 1000)  # the server's pace: a poll, not a synchronisation
            task = await get_task(ctx.session, handle.task_id)
            self.polls += 1
        if task["status"] == "completed":
            return CallToolResult.model_validate(task["result"])
        if task["status"] == "failed":
            raise MCPError.from_error_data(ErrorData.model_validate(task["error"]))
        text = task.get("statusMessage") or "cancelled"
        return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


__all__ = [
    "FINAL",
    "TASKS",
    "CreateTask",
    "TaskParams",
    "TasksCancel",
    "TasksExtension",
    "TasksGet",
    "TasksUpdate",
    "get_task",
    "rpc",
]
