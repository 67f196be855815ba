"""The MCP tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663) on the SDK.

A client that declares the extension on its ``tools/call`` (protocol 2026-07-28, where the
extension lives) gets a task handle from ``submit_task`` and ``ask_human`` in place of
the tool result: the tool runs first, so the handle exists only once the board has
committed the task (or the question). ``tasks/get``, ``tasks/update`` and
``tasks/cancel`` then work on the board through :class:`~fabric.apps.mcp.handles.TaskHandles`.

A client that does not declare it, or one on the 2025-11-25 handshake, gets the plain
tool result (the task id; follow it with ``get_task``), and ``tasks/*`` answer "method
not found" on the handshake wire (the SDK serves them only on 2026-07-28) and
-32021 (missing required client capability) to a 2026 client that did not declare it.
The 2025-11-25 experimental tasks are not served: that revision's tasks were replaced by
this extension, and the SDK does not route them.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, CallToolRequestParams, CallToolResult, RequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict, Field

from fabric.errors import FabricError, InvalidInput

from .agent import tool_error
from .handles import ASKED, SUBMITTED, TaskHandles

TASKS = "io.modelcontextprotocol/tasks"
# The tools whose answer is a task: a submitted task, and a question to a person.
TASK_TOOLS = {"submit_task": SUBMITTED, "ask_human": ASKED}


class GetTaskParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    task_id: str = Field(alias="taskId")


class UpdateTaskParams(GetTaskParams):
    input_responses: Any = Field(alias="inputResponses")


def caller_identity(card_id: str) -> str:
    """Who is asking: the card the server acts as, and over HTTP the token's principal."""
    token = get_access_token()
    return f"{card_id}|{token.client_id if token is not None else 'stdio'}"


def _declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    caps = ctx.session.client_capabilities
    return bool(caps and caps.extensions and TASKS in caps.extensions)


def _invalid(exc: FabricError) -> MCPError:
    """Bad input (an unknown, foreign or stale task id, a malformed answer) is invalid
    params, as the extension says; the board failing is an internal error."""
    code = INVALID_PARAMS if isinstance(exc, InvalidInput) else INTERNAL_ERROR
    return MCPError(code=code, message=tool_error(exc))


class FabricTasks(Extension):
    """The extension: task handles from the task tools; tasks/get, tasks/update, tasks/cancel."""

    identifier = TASKS

    def __init__(self, handles: TaskHandles) -> None:
        self.handles = handles

    def _identity(self) -> str:
        return caller_identity(self.handles.tools.card.id)

    def methods(self) -> list[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", GetTaskParams, self._get, modern),
            MethodBinding("tasks/update", UpdateTaskParams, self._update, modern),
            MethodBinding("tasks/cancel", GetTaskParams, self._cancel, modern),
        ]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        kind = TASK_TOOLS.get(params.name)
        if kind is None or not _declared(ctx):
            return await call_next(ctx)
        result = await call_next(ctx)
        if not isinstance(result, CallToolResult) or result.is_error or not result.structured_content:
            return result  # refused, or answered at once (an elicited answer): the plain result
        data = result.structured_content
        task_id, epoch = data.get("task_id"), data.get("epoch", 0) if kind == ASKED else 0
        if not isinstance(task_id, int) or not isinstance(epoch, int):
            return result
        if kind == ASKED and data.get("state") != "input_required":
            return result
        identity = self._identity()
        try:
            seed = await anyio.to_thread.run_sync(self.handles.issue, identity, task_id, kind, epoch)
        except FabricError as exc:  # committed, but not readable back: say so, with the id
            raise MCPError(
                code=INTERNAL_ERROR, message=f"task #{task_id} was committed; {exc.line()}"
            ) from None
        return {"resultType": "task", **seed}

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: GetTaskParams) -> HandlerResult:
        require_client_extension(ctx, TASKS)
        identity = self._identity()
        try:
            return await anyio.to_thread.run_sync(self.handles.get, identity, params.task_id)
        except FabricError as exc:
            raise _invalid(exc) from None

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> HandlerResult:
        require_client_extension(ctx, TASKS)
        identity = self._identity()
        try:
            if not isinstance(params.input_responses, dict):
                raise InvalidInput(
                    "inputResponses is an object keyed by inputRequests keys", where="inputResponses"
                )
            await anyio.to_thread.run_sync(
                self.handles.update, identity, params.task_id, params.input_responses
            )
        except FabricError as exc:
            raise _invalid(exc) from None
        return {}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: GetTaskParams) -> HandlerResult:
        require_client_extension(ctx, TASKS)
        identity = self._identity()
        try:
            await anyio.to_thread.run_sync(self.handles.cancel, identity, params.task_id)
        except FabricError as exc:
            raise _invalid(exc) from None
        return {}


__all__ = ["TASKS", "FabricTasks", "caller_identity"]
