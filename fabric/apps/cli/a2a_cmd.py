"""``agap a2a``: serve agents over A2A v1.0, and call an A2A agent from scripts and cron."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from fabric.apps.cli import main
from fabric.cards import load_cards
from fabric.errors import EXIT_UNREACHABLE, EXIT_WAITING, ConfigError, FabricError
from fabric.settings import registry
from fabric.settings.resolve import Settings
from fabric.signals import exit_on_signal

if TYPE_CHECKING:
    from a2a.types.a2a_pb2 import Task

    from fabric.apps.a2a.auth import TokenTable
    from fabric.apps.a2a.client import FabricA2AClient
    from fabric.apps.a2a.grpc_server import GrpcListener
    from fabric.apps.a2a.server import TlsConfig

# The imports of fabric.apps.a2a and a2a below are made where they are needed: the A2A SDK
# is the optional `a2a` extra, and `agap` imports every command module, `--help` included.


@main.group("a2a")
def a2a_group() -> None:
    """The A2A v1.0 surface: `serve` agents, `call` one."""


@a2a_group.command("serve")
@click.option(
    "--agent",
    "agents",
    multiple=True,
    help="Agent (card id) to expose; repeat for more (default: every non-human card).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port", default=8700, show_default=True, type=int, help="Port (8700; the embedded board takes 8765)."
)
@click.option("--public-url", help="Base URL clients reach the server at (for the cards).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--tls-client-ca",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Require client certificates signed by this CA (mTLS, on top of tokens).",
)
@click.option(
    "--grpc-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Also serve the gRPC binding on this port of --host (0: a free one; or AGAP_A2A_GRPC_PORT).",
)
@click.option(
    "--grpc-public", help="host:port gRPC clients reach it at, for the cards (or AGAP_A2A_GRPC_PUBLIC)."
)
@click.option("-v", "--verbose", is_flag=True)
def serve_cmd(
    agents: tuple[str, ...],
    host: str,
    port: int,
    public_url: str | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
    grpc_port: int | None,
    grpc_public: str | None,
    verbose: bool,
) -> None:
    """Serve agents over A2A: cards at /<agent>/.well-known/agent-card.json, JSON-RPC and
    HTTP+JSON at /<agent>, and with --grpc-port the gRPC binding (tenant = the agent's id).

    Every binding needs the same bearer tokens (gRPC: 'authorization' metadata) and, with
    --tls-*, speaks TLS (mTLS with --tls-client-ca) on each of its ports.

    Client tokens come from AGAP_A2A_TOKENS ('caller:token,...') or AGAP_A2A_TOKENS_FILE;
    the server refuses to start without one. Push targets on private addresses need
    AGAP_A2A_PUSH_ALLOW.
    """
    exit_on_signal(0)  # a stop during start-up exits 0, as one later does
    from fabric.apps.a2a.auth import load_tokens  # optional a2a extra (see the top)
    from fabric.apps.a2a.server import TlsConfig, make_service, serve  # optional a2a extra

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    env = dict(registry.environ())
    tokens = load_tokens(env)  # first: no tokens, no server (exit 2)
    if (tls_cert is None) != (tls_key is None):
        raise ConfigError("give both --tls-cert and --tls-key", where="--tls-cert/--tls-key")
    if tls_client_ca is not None and tls_cert is None:
        raise ConfigError(
            "mTLS needs a server certificate", where="--tls-client-ca", hint="add --tls-cert and --tls-key"
        )
    settings = Settings.from_env(env)
    settings.require_board()
    cards = load_cards(settings.cards_dir)
    chosen = list(agents) or [c.id for c in cards if c.kind != "human"]
    for agent in chosen:
        cards.get(agent)  # unknown ids fail here, with the card error
    tls = TlsConfig(tls_cert, tls_key, tls_client_ca) if tls_cert and tls_key else None
    grpc = _grpc_listener(env, tokens, host, grpc_port, grpc_public, tls)
    service = make_service(settings, cards, env)
    click.echo(
        f"agap a2a: serving {', '.join(chosen)} on {host}:{port}"
        + ("" if grpc is None else " (and gRPC)")
        + f" for {len(tokens)} client token(s)",
        err=True,
    )
    serve(
        service,
        chosen,
        tokens,
        host=host,
        port=port,
        public_url=public_url,
        tls=tls,
        grpc=grpc,
        log_level="debug" if verbose else "info",
    )


def _grpc_listener(
    env: dict[str, str],
    tokens: TokenTable,
    host: str,
    port: int | None,
    public: str | None,
    tls: TlsConfig | None,
) -> GrpcListener | None:
    """The gRPC listener --grpc-port / AGAP_A2A_GRPC_PORT ask for, or None."""
    if port is None:
        raw = registry.get_str("AGAP_A2A_GRPC_PORT", env).strip()
        if not raw:
            return None
        if not raw.isdigit() or int(raw) > 65535:
            raise ConfigError(
                f"not a port: {raw!r}", where="AGAP_A2A_GRPC_PORT", hint="0..65535, or empty for no gRPC"
            )
        port = int(raw)
    try:
        from fabric.apps.a2a.grpc_server import GrpcListener  # needs grpcio (the a2a extra)
    except ImportError:
        raise ConfigError(
            "the gRPC binding needs grpcio", where="--grpc-port", hint="pip install 'agap-fabric[a2a]'"
        ) from None
    from fabric.apps.a2a.server import grpc_tls  # optional a2a extra (see the top)

    shown = public if public is not None else registry.get_str("AGAP_A2A_GRPC_PUBLIC", env).strip()
    return GrpcListener(tokens, host=host, port=port, tls=grpc_tls(tls), public=shown)


@a2a_group.command("call")
@click.argument("url")
@click.argument("text", required=False)
@click.option("--token", envvar="AGAP_A2A_TOKEN", help="Bearer token (or AGAP_A2A_TOKEN).")
@click.option("--ref", "refs", multiple=True, help="Context ref (URI) to pass; repeatable.")
@click.option(
    "--async",
    "is_async",
    is_flag=True,
    help="Return at once with the task (returnImmediately); poll with --get.",
)
@click.option("--wait", is_flag=True, help="With --async: poll until the task ends.")
@click.option("--message-id", help="Message id (a retry with the same id returns the same task).")
@click.option("--task", "task_id", help="Answer this input-required task.")
@click.option("--get", "get_id", help="Show a task.")
@click.option("--cancel", "cancel_id", help="Cancel a task.")
@click.option("--list", "do_list", is_flag=True, help="List your tasks on this agent.")
@click.option("--timeout", default=300.0, show_default=True, type=float)
@click.option("--json", "as_json", is_flag=True, help="Print the task as JSON.")
@click.option(
    "--cacert",
    type=click.Path(exists=True, dir_okay=False),
    help="CA bundle to verify the server's certificate.",
)
@click.option(
    "--client-cert",
    type=click.Path(exists=True, dir_okay=False),
    help="Client certificate (PEM) to present, for a server that requires mTLS.",
)
@click.option(
    "--client-key",
    type=click.Path(exists=True, dir_okay=False),
    help="The client certificate's key (if not in the --client-cert file).",
)
def call_cmd(
    url: str,
    text: str | None,
    token: str | None,
    refs: tuple[str, ...],
    is_async: bool,
    wait: bool,
    message_id: str | None,
    task_id: str | None,
    get_id: str | None,
    cancel_id: str | None,
    do_list: bool,
    timeout: float,
    as_json: bool,
    cacert: str | None,
    client_cert: str | None,
    client_key: str | None,
) -> None:
    """Call the A2A agent at URL (e.g. http://127.0.0.1:8700/kimi) with TEXT (or stdin).

    Prints the result text (or the task as JSON with --json). Exit 0 when the task
    completed (or was submitted with --async), 9 when it waits for input, 3 when the agent
    cannot be reached or refuses the token, 1 otherwise.
    """
    if not token:
        raise ConfigError("no token", where="--token", hint="pass --token or set AGAP_A2A_TOKEN")
    actions = sum(bool(x) for x in (get_id, cancel_id, do_list))
    if actions > 1:
        raise ConfigError("give one of --get, --cancel, --list", where="agap a2a call")
    if not actions and text is None:
        text = sys.stdin.read()
    if client_key and not client_cert:
        raise ConfigError(
            "a client key needs its certificate", where="--client-key", hint="add --client-cert"
        )
    verify = _tls(cacert, client_cert, client_key) if cacert or client_cert else True
    code = asyncio.run(
        _call(
            url,
            token,
            text,
            refs=refs,
            is_async=is_async,
            wait=wait,
            message_id=message_id,
            task_id=task_id,
            get_id=get_id,
            cancel_id=cancel_id,
            do_list=do_list,
            timeout=timeout,
            as_json=as_json,
            verify=verify,
            client_cert=bool(client_cert),
        )
    )
    sys.exit(code)


async def _call(
    url: str,
    token: str,
    text: str | None,
    *,
    refs: tuple[str, ...],
    is_async: bool,
    wait: bool,
    message_id: str | None,
    task_id: str | None,
    get_id: str | None,
    cancel_id: str | None,
    do_list: bool,
    timeout: float,
    as_json: bool,
    verify: ssl.SSLContext | bool,
    client_cert: bool,
) -> int:
    from a2a.client import A2AClientError  # optional a2a extra (see the top)
    from a2a.utils.errors import A2AError  # optional a2a extra

    from fabric.apps.a2a.client import FabricA2AClient  # optional a2a extra
    from fabric.apps.a2a.convert import to_dict  # optional a2a extra

    try:
        async with await FabricA2AClient.open(url, token, timeout=timeout, verify=verify) as c:
            if do_list:
                page = await c.list()
                click.echo(json.dumps(to_dict(page), indent=2))
                return 0
            task = await _exchange(
                c,
                text,
                refs=refs,
                is_async=is_async,
                wait=wait,
                message_id=message_id,
                task_id=task_id,
                get_id=get_id,
                cancel_id=cancel_id,
                timeout=timeout,
            )
    except (A2AError, A2AClientError) as exc:
        raise _call_error(url, exc, client_cert=client_cert) from None
    _show(task, as_json)
    return _exit_code(task, is_async=is_async, wait=wait, got=bool(get_id), canceled=bool(cancel_id))


def _call_error(url: str, exc: BaseException, *, client_cert: bool = False) -> FabricError:
    """What went wrong with a call, in one line: refused credentials and an agent that
    cannot be reached are exit 3 (the one table); anything else is the first line, exit 1.

    A server that wants a client certificate closes a TLS 1.3 connection only after the
    handshake, so the refusal surfaces as a transport error: over https without
    --client-cert the hint names the certificate too."""
    import httpx  # the A2A client's transport (the a2a extra)

    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, httpx.HTTPStatusError) and cause.response.status_code in (401, 403):
            code = cause.response.status_code
            return FabricError(
                f"the A2A agent refused the credentials (HTTP {code})",
                where=url,
                hint="check --token (or AGAP_A2A_TOKEN) against the server's AGAP_A2A_TOKENS",
            ).with_exit(EXIT_UNREACHABLE)
        if isinstance(cause, httpx.TransportError):
            hint = "is `agap a2a serve` running there, and is the URL right?"
            if url.startswith("https:") and not client_cert:
                hint += " If it asks for a client certificate, pass --client-cert and --client-key"
            return FabricError(
                f"cannot reach the A2A agent ({type(cause).__name__})", where=url, hint=hint
            ).with_exit(EXIT_UNREACHABLE)
        cause = cause.__cause__ or cause.__context__
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return FabricError(first, where=url)


def _tls(cacert: str | None, client_cert: str | None, client_key: str | None) -> ssl.SSLContext:
    """The client's TLS context; a certificate or key that does not load is bad input."""
    from fabric.apps.a2a.client import tls_context  # optional a2a extra (see the top)

    try:
        return tls_context(cacert, client_cert, client_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load the TLS files: {exc}", where="--cacert/--client-cert/--client-key"
        ) from None


async def _exchange(
    c: FabricA2AClient,
    text: str | None,
    *,
    refs: tuple[str, ...],
    is_async: bool,
    wait: bool,
    message_id: str | None,
    task_id: str | None,
    get_id: str | None,
    cancel_id: str | None,
    timeout: float,
) -> Task:
    """The task after the one action asked for: show, cancel, or send (and wait)."""
    from fabric.apps.a2a.client import text_message  # optional a2a extra (see the top)

    if get_id:
        return await c.get(get_id)
    if cancel_id:
        return await c.cancel(cancel_id)
    msg = text_message(text or "", refs=refs, message_id=message_id, task_id=task_id or "")
    task = await c.send(msg, return_immediately=is_async)
    if is_async and wait:
        task = await c.wait(task.id, timeout=timeout, every=1.0)
    return task


def _show(task: Task, as_json: bool) -> None:
    """The task as JSON, or its state on stderr and its text on stdout."""
    from a2a.types.a2a_pb2 import TaskState  # optional a2a extra (see the top)

    from fabric.apps.a2a.client import task_text  # optional a2a extra
    from fabric.apps.a2a.convert import to_dict  # optional a2a extra

    if as_json:
        click.echo(json.dumps(to_dict(task), indent=2))
        return
    click.echo(f"task {task.id}: {TaskState.Name(task.status.state)}", err=True)
    out = task_text(task)
    if out:
        click.echo(out)


def _exit_code(task: Task, *, is_async: bool, wait: bool, got: bool, canceled: bool) -> int:
    """0 done (or submitted with --async, shown, canceled as asked), 9 waiting for input, else 1."""
    from a2a.types.a2a_pb2 import TaskState  # optional a2a extra (see the top)

    state = task.status.state
    if state == TaskState.TASK_STATE_COMPLETED or (
        is_async and not wait and state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
    ):
        return 0
    if state == TaskState.TASK_STATE_INPUT_REQUIRED:
        return EXIT_WAITING
    if got and state not in (TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED):
        return 0
    if canceled and state == TaskState.TASK_STATE_CANCELED:
        return 0
    return 1
