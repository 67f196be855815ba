"""Fabric ↔ A2A: agent cards, task states, tasks and messages (protobuf types of the SDK)."""

from __future__ import annotations

import importlib
import re
import uuid
from collections.abc import Iterable
from typing import Any, cast

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    Artifact,
    HTTPAuthSecurityScheme,
    Message,
    MutualTlsSecurityScheme,
    Part,
    Role,
    SecurityRequirement,
    SecurityScheme,
    StringList,
    Task,
    TaskState,
    TaskStatus,
)

from fabric.cards import Card
from fabric.kanboard.taskboard import TaskView
from fabric.task import State

from . import store as st

PROTOCOL_VERSION = "1.0"
BEARER = "bearer"
JSONRPC, HTTP_JSON, GRPC = "JSONRPC", "HTTP+JSON", "GRPC"  # the spec's protocolBinding names
MTLS = "mtls"

# Fabric states 1:1 onto A2A task states (docs/DESIGN.md, the lifecycle).
STATE_MAP: dict[State, int] = {
    State.QUEUED: TaskState.TASK_STATE_SUBMITTED,
    State.WORKING: TaskState.TASK_STATE_WORKING,
    State.INPUT_REQUIRED: TaskState.TASK_STATE_INPUT_REQUIRED,
    State.DONE: TaskState.TASK_STATE_COMPLETED,
    State.CLOSED: TaskState.TASK_STATE_COMPLETED,
    State.DEAD: TaskState.TASK_STATE_FAILED,
    State.CANCELED: TaskState.TASK_STATE_CANCELED,
    State.DROPPED: TaskState.TASK_STATE_FAILED,
}
SYNC_STATE_MAP: dict[str, int] = {
    st.WORKING: TaskState.TASK_STATE_WORKING,
    st.INPUT_REQUIRED: TaskState.TASK_STATE_INPUT_REQUIRED,
    st.COMPLETED: TaskState.TASK_STATE_COMPLETED,
    st.FAILED: TaskState.TASK_STATE_FAILED,
    st.CANCELED: TaskState.TASK_STATE_CANCELED,
}
TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
INTERRUPTED = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})

_ASYNC_ID = re.compile(r"^(\d{1,12})-([0-9a-f]{16})$")
_SYNC_ID = re.compile(r"^s-[0-9a-f]{32}$")
_REF_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:")


def to_dict(message: Any) -> dict[str, Any]:
    """A protobuf message as its JSON dict (camelCase names, as on the wire)."""
    json_format = importlib.import_module("google.protobuf.json_format")
    return cast(dict[str, Any], json_format.MessageToDict(message))


# -- ids ------------------------------------------------------------------------------


def async_task_id(board_task_id: int, uid: str) -> str:
    """The A2A id of a fabric task: its board id and uid (Kanboard reuses numeric ids)."""
    return f"{board_task_id}-{uid}"


def parse_async_id(task_id: str) -> tuple[int, str] | None:
    m = _ASYNC_ID.match(task_id)
    return (int(m.group(1)), m.group(2)) if m else None


def new_sync_id() -> str:
    return f"s-{uuid.uuid4().hex}"


def is_sync_id(task_id: str) -> bool:
    return bool(_SYNC_ID.match(task_id))


# -- the agent card ---------------------------------------------------------------------


def agent_card(card: Card, base_url: str, *, version: str, mtls: bool = False, grpc: str = "") -> AgentCard:
    """The A2A Agent Card of a fabric card: skills from capabilities, bearer auth declared.

    Its interfaces, in the server's order of preference: JSON-RPC at ``<base>/<id>``,
    HTTP+JSON (REST) at the same URL (``<base>/<id>/message:send``, ``/tasks/…``), and with
    ``grpc`` (a gRPC target, ``host:port``) a gRPC interface, the tenant naming the agent;
    :func:`set_grpc_address` puts the bound port in once it is known (port 0).
    """
    tags = [t for t in (card.tier, card.kind, card.cost_class) if t]
    skills = [
        AgentSkill(
            id=cap,
            name=cap.replace("-", " "),
            description=f"{card.name}: {cap.replace('-', ' ')}",
            tags=[cap, *tags],
        )
        for cap in card.capabilities
    ]
    if not skills:
        skills = [
            AgentSkill(
                id=card.id, name=card.name, description=card.description or card.name, tags=tags or [card.id]
            )
        ]
    schemes = {
        BEARER: SecurityScheme(
            http_auth_security_scheme=HTTPAuthSecurityScheme(
                scheme="bearer", description="A per-client bearer token issued by the fabric's owner"
            )
        )
    }
    requirement = SecurityRequirement(schemes={BEARER: StringList()})
    if mtls:
        schemes[MTLS] = SecurityScheme(
            mtls_security_scheme=MutualTlsSecurityScheme(
                description="A client certificate signed by the fabric's CA (plus the bearer token)"
            )
        )
        requirement.schemes[MTLS].CopyFrom(StringList())
    url = f"{base_url.rstrip('/')}/{card.id}"
    interfaces = [
        AgentInterface(url=url, protocol_binding=JSONRPC, protocol_version=PROTOCOL_VERSION),
        AgentInterface(url=url, protocol_binding=HTTP_JSON, protocol_version=PROTOCOL_VERSION),
    ]
    if grpc:
        interfaces.append(
            AgentInterface(url=grpc, protocol_binding=GRPC, tenant=card.id, protocol_version=PROTOCOL_VERSION)
        )
    return AgentCard(
        name=card.name,
        description=card.description or f"{card.name} ({card.kind} agent of the fabric)",
        version=version,
        provider=AgentProvider(organization="agap-fabric", url=base_url),
        supported_interfaces=interfaces,
        capabilities=AgentCapabilities(streaming=True, push_notifications=True),
        security_schemes=schemes,
        security_requirements=[requirement],
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain", "text/markdown"],
        skills=skills,
    )


def set_grpc_address(card: AgentCard, address: str) -> None:
    """Put the bound gRPC target (``host:port``) into the card's gRPC interface."""
    for iface in card.supported_interfaces:
        if iface.protocol_binding == GRPC:
            iface.url = address


# -- messages -------------------------------------------------------------------------


def message_text(message: Message) -> str:
    """The text parts of a message, joined by blank lines."""
    return "\n\n".join(p.text for p in message.parts if p.text).strip()


def message_refs(message: Message) -> list[str]:
    """Context refs: the URL parts of a message (the fabric passes context by reference)."""
    return [p.url for p in message.parts if p.url]


def bad_refs(refs: Iterable[str]) -> list[str]:
    return [r for r in refs if not _REF_SCHEME.match(r)]


def agent_message(text: str, task_id: str, context_id: str) -> Message:
    return Message(
        message_id=uuid.uuid4().hex,
        role=Role.ROLE_AGENT,
        task_id=task_id,
        context_id=context_id,
        parts=[Part(text=text)],
    )


def user_message(row: st.TaskRow) -> Message:
    parts = [Part(text=row.intent)] + [Part(url=r) for r in row.refs]
    return Message(
        message_id=row.message_id,
        role=Role.ROLE_USER,
        task_id=row.task_id,
        context_id=row.context_id,
        parts=parts,
    )


def result_artifact(text: str, ref: str | None = None) -> Artifact:
    parts = [Part(text=text, media_type="text/markdown")]
    if ref:
        parts.append(Part(url=ref))
    return Artifact(artifact_id="result", name="result", parts=parts)


# -- tasks ----------------------------------------------------------------------------


def _status(state: int, at: float, note: str | None, row: st.TaskRow) -> TaskStatus:
    status = TaskStatus(state=state)  # type: ignore[arg-type]
    status.timestamp.FromNanoseconds(int(at * 1e9))
    if note:
        status.message.CopyFrom(agent_message(note, row.task_id, row.context_id))
    return status


def sync_task(row: st.TaskRow, *, history: bool = True) -> Task:
    """A sync task from the local row."""
    state = SYNC_STATE_MAP[row.state]
    note = None
    if row.state == st.INPUT_REQUIRED and row.conversation:
        note = row.conversation[-1][1]
    elif row.state in (st.FAILED, st.CANCELED):
        note = row.error
    task = Task(id=row.task_id, context_id=row.context_id, status=_status(state, row.updated, note, row))
    if row.state == st.COMPLETED and row.result is not None:
        ref = f"kanboard://task/{row.board_task_id}/file/result-e1.md" if row.board_task_id else None
        task.artifacts.append(result_artifact(row.result, ref))
    if history:
        task.history.append(user_message(row))
    return task


def board_task(row: st.TaskRow, view: TaskView, *, result: str | None = None, history: bool = True) -> Task:
    """An async task: its state from the board, its context from the local row."""
    cur = view.current
    assert cur is not None
    state = STATE_MAP[cur.state]
    note = cur.reason if cur.state in (State.INPUT_REQUIRED, State.DEAD, State.CANCELED) else None
    task = Task(id=row.task_id, context_id=row.context_id, status=_status(state, cur.at, note, row))
    if cur.result_ref and cur.state in (State.DONE, State.CLOSED):
        task.artifacts.append(result_artifact(result if result is not None else "", cur.result_ref))
    if history:
        task.history.append(user_message(row))
    return task


def async_row_from_view(view: TaskView, caller: str, agent: str) -> st.TaskRow:
    """An index row rebuilt from the board (the local index lost it)."""
    assert view.spec is not None and view.uid is not None
    tid = async_task_id(view.id, view.uid)
    return st.TaskRow(
        task_id=tid,
        caller=caller,
        agent=agent,
        kind=st.ASYNC,
        context_id=tid,
        message_id=view.spec.action_id or tid,
        intent=view.spec.intent,
        refs=list(view.spec.refs),
        state=st.BOARD,
        board_task_id=view.id,
        board_uid=view.uid,
        created=view.spec.submitted_at,
        updated=view.spec.submitted_at,
    )
