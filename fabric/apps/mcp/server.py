"""The MCP server of one agent: the official SDK's ``MCPServer`` over :class:`AgentTools`.

Tools (each a thin call into :class:`~fabric.apps.mcp.agent.AgentTools`; a
:class:`~fabric.errors.FabricError` becomes a tool error with the CLI's line):

* ``list_targets``, ``submit_task``, ``get_task``;
* ``claim_task``, ``heartbeat_task``, ``complete_task``, ``fail_task``, ``ask_human``.

Resources (read-only JSON): ``agap://targets`` (what ``list_targets`` returns),
``agap://queue`` (this agent's queue and the claims it holds) and ``agap://task/{task_id}``
(what ``get_task`` returns).

Transports: stdio (what Claude Code and OpenClaw launch), or streamable HTTP on loopback
at ``/mcp`` behind a bearer token (``AGAP_MCP_TOKEN``), checked by the SDK's own bearer
middleware with a constant-time comparison; without the token the server does not start.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import ipaddress
import logging
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Annotated, Any, TypeVar

import anyio
import uvicorn
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    GetPromptRequestParams,
    SetLevelRequestParams,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    ToolAnnotations,
    UnsubscribeRequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from fabric.apps import asgi
from fabric.errors import ConfigError, FabricError, InvalidInput
from fabric.events.transport import Transport
from fabric.signals import exit_now, set_on_signal
from fabric.submit import INTENT_HELP, SUBMIT_OPTIONS

from .agent import AgentTools, as_json, tool_error
from .handles import ANSWER_SCHEMA, TaskHandles
from .notify import TaskListen
from .streams import RETRY_MS, ReplayBuffer, SessionLog, Watcher
from .tasks import FabricTasks

log = logging.getLogger("agap.mcp")

T = TypeVar("T")
Request = ServerRequestContext[Any, Any]
# Bearer tokens shorter than this are refused at start (as the A2A server's are).
MIN_TOKEN_CHARS = 16
MCP_PATH = "/mcp"

TaskId = Annotated[int, Field(gt=0, description="The task's id (the number in task:N or #N).")]
Epoch = Annotated[
    int | None,
    Field(ge=0, description="The epoch claim_task returned; optional (a mismatch is refused)."),
]


def fabric_version() -> str:
    try:
        return metadata.version("agap-fabric")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def _call(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    """Run one operation; a refusal is a tool error with the CLI's one line."""
    try:
        return fn(*args, **kw)
    except FabricError as exc:
        raise ToolError(tool_error(exc)) from None


def _instructions(tools: AgentTools) -> str:
    card = tools.card
    return (
        f"You act as the agent {card.id!r} ({card.trust}) on a household task fabric backed by "
        f"Kanboard. Your queue is {card.queue_name!r}. To work: claim_task, do the work, then "
        "finish the task with exactly one of complete_task, fail_task or ask_human. To hand work "
        "to another agent or a person: submit_task, then get_task to follow it. Context travels "
        "by reference (URIs in refs), never pasted. list_targets says who you may hand work to. "
        "An error starting with FENCED means another "
        "owner has the task now: stop working on it."
    )


def _renew_words(tools: AgentTools) -> str:
    minutes = tools.renew_for / 60
    return f"{minutes:g} minutes" if minutes >= 1 else f"{tools.renew_for:g} seconds"


def submit_signature() -> inspect.Signature:
    """``submit_task``'s arguments, made from the one declaration (fabric.submit.SUBMIT_OPTIONS)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter("intent", kind, annotation=Annotated[str, Field(description=INTENT_HELP)])]
    for opt in SUBMIT_OPTIONS:
        base: Any = list[str] if opt.kind is list else opt.kind
        field = Field(description=opt.help, gt=0) if opt.kind is int else Field(description=opt.help)
        annotation: Any = Annotated[base if opt.default is not None else base | None, field]
        params.append(inspect.Parameter(opt.name, kind, default=opt.default, annotation=annotation))
    return inspect.Signature(params, return_annotation=dict[str, Any])


def _add_submit_and_read(mcp: MCPServer[Any], tools: AgentTools) -> None:
    card = tools.card

    def list_targets() -> dict[str, Any]:
        return _call(tools.targets)

    mcp.add_tool(
        list_targets,
        name="list_targets",
        title="Who you may hand work to",
        description=(
            "List the agents and people you may pass as submit_task's target: id, name, kind (persona, "
            "model, human; 'auto' lets the router pick), what each is for, capabilities, trust, "
            "the privacy domains you share, and whether it can take work now (available, reason, until). "
            "Call it before submitting when you are not sure of an id."
        ),
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )

    def submit_task(**arguments: Any) -> dict[str, Any]:
        intent = arguments.pop("intent")
        arguments["refs"] = arguments.get("refs") or []
        return _call(tools.submit, intent, **arguments)

    submit_task.__signature__ = submit_signature()  # type: ignore[attr-defined]

    mcp.add_tool(
        submit_task,
        name="submit_task",
        title="Submit a task",
        description=(
            "Submit a new task to the fabric; it returns at once with the task id, and the task runs "
            "later on another agent or a person. Give exactly one of target (an agent or person id, or "
            "'auto') or constraints. Pass context as URIs in refs, never pasted into the intent. A key "
            "makes retries safe. parent defaults to the one task you hold. "
            f"You submit as {card.id!r}: its creation quota, the depth and cycle "
            "rules and its privacy domains apply. Follow the task with get_task."
        ),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
    )

    def get_task(task_id: TaskId) -> dict[str, Any]:
        return _call(tools.get_task, task_id)

    mcp.add_tool(
        get_task,
        name="get_task",
        title="Read a task",
        description=(
            "Read one task: its state (queued, working, input_required, done, closed, dead, canceled), "
            "epoch, owner and lease, the conversation (questions asked, answers given, reasons a result "
            "was sent back), and once done "
            f"its result text (or the result's ref). You may read tasks in your queue "
            f"({card.queue_name!r}) and tasks you submitted."
        ),
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )


def _add_lease_tools(mcp: MCPServer[Any], tools: AgentTools) -> None:
    card = tools.card

    def claim_task(
        lease_seconds: Annotated[
            float | None,
            Field(description="Lease length in seconds (default: the card's lease; 5 to 86400)."),
        ] = None,
    ) -> dict[str, Any]:
        return _call(tools.claim, lease_seconds)

    mcp.add_tool(
        claim_task,
        name="claim_task",
        title="Claim the next task",
        description=(
            f"Claim the next due task of your queue ({card.queue_name!r}): the most urgent first. Returns "
            "claimed=false when there is nothing to do. On success you hold a lease on it, and the "
            "result has the intent, refs, priority, deadline and the conversation so far (earlier "
            "questions, people's answers, and why an earlier result was sent back: rework it). "
            "The server renews the lease on its own every third of "
            f"its length for up to {_renew_words(tools)} after the claim or your last heartbeat_task. "
            "Finish every claimed task with exactly one of complete_task, fail_task or ask_human."
        ),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
    )

    def heartbeat_task(task_id: TaskId, epoch: Epoch = None) -> dict[str, Any]:
        return _call(tools.heartbeat, task_id, epoch)

    mcp.add_tool(
        heartbeat_task,
        name="heartbeat_task",
        title="Keep a claimed task",
        description=(
            "Renew the lease on a task you claimed, and restart the server's auto-renew window. Call it "
            "now and then during long work. An error starting with FENCED means the task has another "
            "owner now: stop working on it."
        ),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True),
    )

    def complete_task(
        task_id: TaskId,
        result: Annotated[str | None, Field(description="The result as text (stored with the task).")] = None,
        result_file: Annotated[
            str | None, Field(description="Or: an absolute path to a UTF-8 file holding the result.")
        ] = None,
        result_ref: Annotated[
            str | None, Field(description="Or: a URI where the result is, e.g. a pull request.")
        ] = None,
        note: Annotated[str | None, Field(description="A short note for the task's journal.")] = None,
        epoch: Epoch = None,
    ) -> dict[str, Any]:
        return _call(
            tools.complete,
            task_id,
            result=result,
            result_file=result_file,
            result_ref=result_ref,
            note=note,
            epoch=epoch,
        )

    mcp.add_tool(
        complete_task,
        name="complete_task",
        title="Complete a claimed task",
        description=(
            "Report a task you claimed as done, with exactly one of result (text), result_file (an "
            "absolute path) or result_ref (a URI). The submitter or a person verifies it later. An error "
            "starting with FENCED means your lease is gone: your output is kept only as evidence; stop."
        ),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
    )

    _add_fail_and_ask(mcp, tools)


def _add_fail_and_ask(mcp: MCPServer[Any], tools: AgentTools) -> None:
    def fail_task(
        task_id: TaskId,
        reason: Annotated[str, Field(description="What went wrong, for the journal and the next attempt.")],
        poison: Annotated[
            bool, Field(description="True when retrying cannot help: straight to the dead letter column.")
        ] = False,
        epoch: Epoch = None,
    ) -> dict[str, Any]:
        return _call(tools.fail, task_id, reason, poison=poison, epoch=epoch)

    mcp.add_tool(
        fail_task,
        name="fail_task",
        title="Fail a claimed task",
        description=(
            "Report that this attempt at a task you claimed failed. The fabric retries it after a backoff "
            "until its attempts are spent, then a person decides; poison=true skips the retries."
        ),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
    )

    async def ask_human(
        task_id: TaskId,
        question: Annotated[str, Field(description="The question, answerable without more context.")],
        ctx: Context,
        human: Annotated[
            str | None,
            Field(
                description="Who to ask (a person's card id or username); default the submitter if a "
                "person, else the person using this client when the server knows them, else the "
                "household's first person."
            ),
        ] = None,
        epoch: Epoch = None,
    ) -> dict[str, Any]:
        username, own = await anyio.to_thread.run_sync(_call, tools.ask_target, task_id, human, epoch)
        if own and _can_elicit(ctx):
            answer = await _elicit(ctx, question)
            if answer is not None:
                return await anyio.to_thread.run_sync(
                    lambda: _call(tools.ask_answered, task_id, question, answer, epoch=epoch)
                )
        return await anyio.to_thread.run_sync(
            lambda: _call(tools.ask, task_id, question, human=username, epoch=epoch)
        )

    mcp.add_tool(
        ask_human,
        name="ask_human",
        title="Ask a person about a claimed task",
        description=(
            "Ask a person a question about a task you claimed. You give the task up: it waits in their "
            "Kanboard inbox, and once they answer it is queued again; claim_task then returns it with "
            "the question and the answer in its conversation. A question for the person using this "
            "client is put to them here when the client can (elicitation), and answered=true returns "
            "the answer at once."
        ),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True),
    )


def _can_elicit(ctx: Context) -> bool:
    """A back-channel to the client's user: a handshake session that declared form elicitation.

    On 2026-07-28 there is no server-to-client request; a client with the tasks extension
    answers through the ask_human task handle's inputRequests instead."""
    session = ctx.request_context.session
    caps = session.client_capabilities
    return (
        ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS
        and caps is not None
        and caps.elicitation is not None
        and session.can_send_request
    )


async def _elicit(ctx: Context, question: str) -> str | None:
    """The user's answer, or None when they declined, cancelled or the client failed."""
    try:
        result = await ctx.request_context.session.elicit_form(
            question, ANSWER_SCHEMA, related_request_id=ctx.request_context.request_id
        )
    except Exception as exc:  # the client could not ask: the question goes to the inbox
        log.warning("elicitation failed (%s): the question goes to the inbox", exc)
        return None
    content = result.content or {}
    answer = content.get("answer") if result.action == "accept" else None
    return answer.strip() if isinstance(answer, str) and answer.strip() else None


def _add_resources(mcp: MCPServer[Any], tools: AgentTools) -> None:
    @mcp.resource(
        "agap://targets",
        name="targets",
        title="Who you may hand work to",
        description="The agents and people you may submit to: what list_targets returns.",
        mime_type="application/json",
    )
    def targets_resource() -> str:
        try:
            return as_json(tools.targets())
        except FabricError as exc:
            raise ResourceError(tool_error(exc)) from None

    @mcp.resource(
        "agap://queue",
        name="queue",
        title=f"Queue {tools.card.queue_name}",
        description="Your queue's open tasks (id, column, priority, age, title), whether it is parked, "
        "and the claims this server holds.",
        mime_type="application/json",
    )
    def queue_resource() -> str:
        try:
            return as_json(tools.queue())
        except FabricError as exc:
            raise ResourceError(tool_error(exc)) from None

    @mcp.resource(
        "agap://task/{task_id}",
        name="task",
        title="A task",
        description="One task you may read (in your queue, or submitted by you): what get_task returns.",
        mime_type="application/json",
    )
    def task_resource(task_id: str) -> str:
        try:
            if not task_id.isdigit() or int(task_id) <= 0:
                raise InvalidInput(f"{task_id!r} is not a task id", where="agap://task/{task_id}")
            return as_json(tools.get_task(int(task_id)))
        except FabricError as exc:
            raise ResourceError(tool_error(exc)) from None


class StaticBearer:
    """The SDK's token verifier for one configured token (compared in constant time)."""

    def __init__(self, token: str, client: str) -> None:
        self._digest = hashlib.sha256(token.encode()).digest()
        self._client = client

    async def verify_token(self, token: str) -> AccessToken | None:
        probe = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        if hmac.compare_digest(probe, self._digest):
            return AccessToken(token="", client_id=self._client, scopes=[])
        return None


def task_key(configured: str, token: str | None) -> bytes:
    """The key task handles are signed with: AGAP_MCP_TASK_KEY; else, over HTTP, one derived
    from the bearer token (handles then outlive a restart); else random for this process."""
    if configured.strip():
        return hashlib.sha256(b"agap-mcp-task-key\0" + configured.strip().encode()).digest()
    if token:
        return hmac.new(token.encode(), b"agap-mcp-task-key", hashlib.sha256).digest()
    return secrets.token_bytes(32)


def build_server(
    tools: AgentTools,
    *,
    token: str | None = None,
    base_url: str = "",
    handles: TaskHandles | None = None,
    events: Transport | None = None,
    watch_every: float = 1.0,
) -> MCPServer[Any]:
    """The MCP server for ``tools``' agent; with ``token`` every HTTP request must carry it.

    ``handles`` serves the tasks extension (by default signed with a random key);
    ``events`` (the live events' transport) wakes the resource watcher and the task status
    notifications, which read the board every ``watch_every`` seconds without them."""
    if handles is None:
        handles = TaskHandles(tools, task_key("", token))
    auth: dict[str, Any] = {}
    if token is not None:
        auth = {
            "token_verifier": StaticBearer(token, tools.card.id),
            # The SDK's bearer middleware needs AuthSettings; no OAuth server or resource
            # metadata is served (resource_server_url=None), only the token check.
            "auth": AuthSettings(issuer_url=base_url or "http://127.0.0.1", resource_server_url=None),
        }
    mcp: MCPServer[Any] = MCPServer(
        name=f"agap-{tools.card.id}",
        title=f"agap fabric: {tools.card.name}",
        instructions=_instructions(tools),
        version=fabric_version(),
        log_level="WARNING",
        extensions=[FabricTasks(handles)],
        **auth,
    )
    _add_submit_and_read(mcp, tools)
    _add_lease_tools(mcp, tools)
    _add_resources(mcp, tools)
    _add_watching(mcp, Watcher(tools, events=events))
    _add_prompt_errors(mcp)
    # subscriptions/listen with taskIds: notifications/tasks (notify.TaskListen); without,
    # the SDK's own listen on the same bus.
    listen = TaskListen(handles, mcp._subscriptions, events=events, every=watch_every)
    mcp._lowlevel_server.add_request_handler("subscriptions/listen", SubscriptionsListenRequestParams, listen)
    return mcp


def _add_watching(mcp: MCPServer[Any], watcher: Watcher) -> None:
    """resources/subscribe and logging/setLevel on the handshake wire (streams.Watcher).

    MCPServer has no public seam for these spec methods (an extension may not bind them),
    so they go on its low-level server, which derives the capabilities from the handlers."""
    low = mcp._lowlevel_server

    async def subscribe(
        ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams
    ) -> dict[str, Any]:
        await watcher.subscribe(ctx.session, str(params.uri))
        return {}

    async def unsubscribe(
        ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams
    ) -> dict[str, Any]:
        await watcher.unsubscribe(ctx.session, str(params.uri))
        return {}

    async def set_level(ctx: Request, params: SetLevelRequestParams) -> dict[str, Any]:
        await watcher.set_level(ctx.session, params.level)
        if log.getEffectiveLevel() > logging.INFO:
            log.setLevel(logging.INFO)  # the watcher's lines are info
        return {}

    low.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    low.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
    low.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
    log.addHandler(SessionLog(watcher))


def _add_prompt_errors(mcp: MCPServer[Any]) -> None:
    """prompts/get naming a prompt the server does not have is bad input: -32602, as the
    spec says. The SDK raises a ValueError there, which reaches the client as code 0 on the
    handshake wire and as -32603 "Internal server error" (with a logged traceback) on the
    2026-07-28 one. Prompts the server has go to the SDK's handler as before."""
    low = mcp._lowlevel_server
    entry = low.get_request_handler("prompts/get")
    if entry is None:  # no prompts capability at all: the SDK answers method not found
        return
    sdk = entry.handler

    async def get_prompt(ctx: ServerRequestContext[Any, Any], params: GetPromptRequestParams) -> Any:
        if params.name not in {p.name for p in await mcp.list_prompts()}:
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown prompt: {params.name}")
        return await sdk(ctx, params)

    low.add_request_handler("prompts/get", GetPromptRequestParams, get_prompt)


def check_token(token: str, name: str) -> str:
    """The HTTP transport's bearer token: set, and long enough."""
    token = token.strip()
    if not token:
        raise ConfigError(
            "no bearer token: the MCP HTTP transport does not run without authentication",
            where=name,
            hint=f"set {name} to a secret of {MIN_TOKEN_CHARS}+ characters "
            "(python -c 'import secrets; print(secrets.token_urlsafe(32))'), or use --transport stdio",
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"the token is shorter than {MIN_TOKEN_CHARS} characters", where=name)
    return token


def check_loopback(host: str) -> None:
    """The HTTP transport listens on loopback only: it has no TLS of its own."""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(
            f"{host} is not a loopback address",
            where="--host",
            hint="the MCP HTTP transport has no TLS: bind 127.0.0.1 and put a TLS proxy in front",
        )


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0 picks a free one), TCP_NODELAY-ready for asyncio."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}", where="--port") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


@contextmanager
def _serving(tools: AgentTools) -> Iterator[None]:
    """Run with the renewer until the transport ends; then release the leases still held."""
    tools.start()
    try:
        yield
    finally:
        _release(tools)


def _release(tools: AgentTools) -> None:
    released = tools.close()
    if released:
        log.warning("released %s on shutdown", ", ".join(f"#{t}" for t in released))


def serve_stdio(
    tools: AgentTools,
    handles: TaskHandles | None = None,
    events: Transport | None = None,
    watch_every: float = 1.0,
) -> None:
    """Serve over stdin/stdout until the client closes them (or SIGTERM/SIGINT)."""
    mcp = build_server(tools, handles=handles, events=events, watch_every=watch_every)

    def _stop() -> None:
        # The thread reading stdin cannot be interrupted, and the interpreter would wait
        # for it at exit: release the leases, then end the process (fabric.signals).
        _release(tools)
        exit_now(0)

    set_on_signal(threading.Event(), note=lambda _: threading.Thread(target=_stop, daemon=True).start())
    with _serving(tools):
        anyio.run(mcp.run_stdio_async)


def serve_http(
    tools: AgentTools,
    *,
    host: str,
    port: int,
    token: str,
    ready: Callable[[str], None] | None = None,
    handles: TaskHandles | None = None,
    events: Transport | None = None,
    watch_every: float = 1.0,
) -> None:
    """Serve streamable HTTP at ``http://host:port/mcp`` until SIGINT/SIGTERM."""
    check_loopback(host)
    sock = bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    base = f"http://{shown}:{bound_port}"
    mcp = build_server(
        tools, token=token, base_url=base, handles=handles, events=events, watch_every=watch_every
    )
    # Every SSE event has an id, each stream opens with a priming event and a retry: a
    # client that lost a stream resumes it with Last-Event-ID (streams.ReplayBuffer).
    app = mcp.streamable_http_app(
        streamable_http_path=MCP_PATH, host=host, event_store=ReplayBuffer(), retry_interval=RETRY_MS
    )
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", access_log=False, timeout_graceful_shutdown=asgi.GRACEFUL
    )
    try:
        with _serving(tools):
            if ready is not None:
                ready(base + MCP_PATH)
            asgi.serve(config, [sock])
    finally:
        sock.close()


__all__ = [
    "StaticBearer",
    "build_server",
    "check_loopback",
    "check_token",
    "serve_http",
    "serve_stdio",
    "task_key",
]
