"""Every environment variable the fabric reads, declared once, and the one way to read it.

Each :class:`Var` gives a variable's name, type, default, meaning and the parts of the
fabric that read it. Readers never touch ``os.environ``; they ask this module
(:func:`get_str`, :func:`get_duration`, …), which parses the value by its type. A value
that does not parse raises a one-line :class:`~fabric.errors.ConfigError` naming the
variable, the value and what was expected.

Where values come from (the environment, then ``AGAP_ENV_FILE``, else ``.agap.env``, else
``~/.config/agap/env``) is
:mod:`fabric.settings.resolve`'s job. The CLI applies those files to the process environment at
start, so a reader here sees the resolved value.

An empty value counts as unset (compose writes ``${X:-}``), except for a variable
declared with ``empty``, which says what an empty value means there (for
``AGAP_REF_ROOTS=``: no directory).

This module imports only the standard library, :mod:`fabric.errors` and
:mod:`fabric.durations` (the one duration grammar), because the container healthcheck
imports it and must stay cheap.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal, TypeVar, overload
from urllib.parse import urlsplit

from fabric.durations import parse_setting_duration as parse_duration  # a bare number is seconds here
from fabric.errors import ConfigError, InvalidInput
from fabric.plain import Plain

Kind = Literal["str", "int", "float", "duration", "bool", "path", "url", "list", "secret"]
Component = Literal[
    "cli", "worker", "keeper", "events", "a2a", "cron", "deploy", "workspace", "board", "mcp", "ops"
]
COMPONENTS: tuple[Component, ...] = (
    "cli",
    "worker",
    "keeper",
    "events",
    "a2a",
    "cron",
    "deploy",
    "workspace",
    "board",
    "mcp",
    "ops",
)
Env = Mapping[str, str] | None
Value = str | int | float | bool | Path | tuple[str, ...]

# What a value of each type looks like (a variable's own `grammar` can say more).
GRAMMAR: dict[str, str] = {
    "str": "text",
    "secret": "text, never printed",
    "int": "a whole number, 0 or more",
    "float": "a number",
    "duration": "seconds (90) or a number and unit: 30s, 5m, 1h, 2d, 1w, 1h30m",
    "bool": "1, true, yes or on; 0, false, no or off",
    "path": "a path",
    "url": "scheme://host[:port][/path]",
    "list": "comma-separated",
}
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_INT = re.compile(r"^\d+$")
_FLOAT = re.compile(r"^[+-]?\d+(?:\.\d+)?$")
# user:password@ in a URL, with or without the // (a value that is not a URL yet).
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:)?(//)?[^@/]*@")
# How an error names what it could not read the value as.
_AS = {
    "int": "a whole number",
    "float": "a number",
    "duration": "a duration",
    "bool": "a yes/no value",
    "url": "a URL",
}


class Var(Plain):
    """One environment variable the fabric reads."""

    name: str
    kind: Kind
    readers: tuple[Component, ...]
    meaning: str
    default: str = ""  # applied when unset, parsed like a set value; "" = none
    note: str = ""  # the default when it is not a fixed value ("the card's")
    grammar: str = ""  # what a value looks like, when the type alone does not say
    sep: str = ","  # lists only
    empty: str = ""  # what an empty value means, when it does not mean "unset"

    @property
    def secret(self) -> bool:
        return self.kind == "secret"

    @property
    def expected(self) -> str:
        """What a value must look like, in words."""
        if self.grammar:
            return self.grammar
        if self.kind == "list" and self.sep != ",":
            return f"{self.sep!r}-separated"
        return GRAMMAR[self.kind]


def _v(
    name: str,
    kind: Kind,
    readers: Component | tuple[Component, ...],
    meaning: str,
    default: str = "",
    *,
    note: str = "",
    grammar: str = "",
    sep: str = ",",
    empty: str = "",
) -> Var:
    return Var(
        name,
        kind,
        readers if isinstance(readers, tuple) else (readers,),
        meaning,
        default,
        note,
        grammar,
        sep,
        empty,
    )


_EVERY = "how often the keeper's {} duty runs"
# One variable per person: the name is this with <USER> filled in (see person_secret).
PERSON_PASSWORD = "AGAP_PASSWORD_<USER>"
# One per confined agent (its board user's password), named the same way after its card id.
AGENT_BOARD_PASSWORD = "AGAP_BOARD_PASSWORD_<USER>"

REGISTRY: tuple[Var, ...] = (
    # Every command (fabric.settings.resolve.Settings and the resolution order)
    _v("KANBOARD_URL", "url", "cli", "the board's JSON-RPC endpoint (…/jsonrpc.php)"),
    _v("KANBOARD_API_TOKEN", "secret", "cli", "the board's application token"),
    _v("AGAP_CARDS_DIR", "path", "cli", "agent cards", "cards"),
    _v("AGAP_STATE_DIR", "path", "cli", "local state: embedded board, counters", "var"),
    _v("AGAP_PROJECT", "str", "cli", "the work project's name", "Agent Fabric"),
    _v("AGAP_LOCKS_PROJECT", "str", "cli", "the locks project's name", "Agent Fabric Locks"),
    _v(
        "AGAP_QUOTA_PROJECT",
        "str",
        "cli",
        "the project holding the quotas shared across hosts (cards with across_hosts: true)",
        "Agent Fabric Quotas",
    ),
    _v(
        "AGAP_ACTOR",
        "str",
        "cli",
        "who the CLI acts as: an agent or a process (a runtime keeps its card identity); a "
        "person's name here is refused for their gestures and submits unless AGAP_USER signs "
        "them in",
        "cli",
    ),
    _v(
        "AGAP_USER",
        "str",
        ("cli", "mcp"),
        "the person at this shell or MCP client, signed in as their own Kanboard user: their "
        "approvals, answers, refusals, send-backs and submits are theirs (docs/HOUSEHOLD.md)",
    ),
    _v(
        "AGAP_USER_PASSWORD",
        "secret",
        ("cli", "mcp"),
        "AGAP_USER's Kanboard password, or a personal API token (Kanboard: My profile > API)",
    ),
    _v(
        "KANBOARD_WEB_URL",
        "url",
        "cli",
        "the Kanboard address people open in a browser: links on cards and in notifications",
        note="KANBOARD_URL without /jsonrpc.php",
    ),
    _v(
        PERSON_PASSWORD,
        "secret",
        "cli",
        "the Kanboard password `agap init` gives that person's new user (<USER>: the username "
        "in capitals, - as _); unset: a one-time password, printed once",
    ),
    _v(
        "AGAP_BOARD_USER",
        "str",
        ("worker", "cli"),
        "sign in as this Kanboard user instead of with the application token (a confined "
        "agent's worker: agap-<agent>)",
    ),
    _v("AGAP_BOARD_PASSWORD", "secret", ("worker", "cli"), "AGAP_BOARD_USER's password"),
    _v(
        AGENT_BOARD_PASSWORD,
        "secret",
        ("cli", "deploy"),
        "the password of a confined (sandboxed or untrusted) agent's board user agap-<agent>, "
        "which `agap init` sets (<USER>: the card id in capitals, - as _); its worker gets "
        "it as AGAP_BOARD_PASSWORD",
    ),
    _v(
        "AGAP_ENV_FILE",
        "path",
        "cli",
        "the env file with more settings (must exist if named; then no .agap.env is read)",
    ),
    _v("XDG_CACHE_HOME", "path", "cli", "where the board layout cache lives (in agap/)", note="~/.cache"),
    _v(
        "XDG_CONFIG_HOME",
        "path",
        ("cli", "mcp"),
        "where the user's env file is (agap/env), read when neither AGAP_ENV_FILE nor a .agap.env applies",
        note="~/.config",
    ),
    # The embedded board (agap board serve, agap up)
    _v("AGAP_BOARD_PORT", "int", "board", "the embedded board's port under agap up", "8765"),
    _v("AGAP_BOARD_TOKEN", "secret", "board", "the embedded board's token (default: generated)"),
    # Workers (and the A2A server, which runs the same model clients)
    _v(
        "AGAP_MODEL_MODE",
        "str",
        ("worker", "a2a", "board"),
        "gateway, sdk or demo for every card (overrides cards)",
        note="the card's; demo under agap up",
        grammar="gateway, sdk or demo",
        empty="each card's own mode, under agap up too",
    ),
    _v("AGAP_LITELLM_URL", "url", ("worker", "a2a"), "the LiteLLM proxy", "http://127.0.0.1:4000"),
    _v("LITELLM_MASTER_KEY", "secret", ("worker", "a2a"), "the LiteLLM proxy's key"),
    _v("AGAP_LITELLM_KEY", "secret", ("worker", "a2a"), "a LiteLLM virtual key for the fabric"),
    _v(
        "AGAP_RESULT_STORE",
        "str",
        ("worker", "mcp"),
        "attachment or dir",
        "attachment",
        grammar="attachment or dir",
    ),
    _v(
        "AGAP_RESULT_DIR",
        "path",
        ("worker", "mcp", "keeper", "cli"),
        "where dir results go (and where the keeper and agap memory retain read them)",
    ),
    _v(
        "AGAP_REF_ROOTS",
        "list",
        ("worker", "a2a"),
        "directories file:// refs may read (:-separated)",
        ".",
        sep=os.pathsep,
        empty="no directory",
    ),
    _v(
        "AGAP_HINDSIGHT_URL",
        "url",
        ("worker", "a2a", "cli", "keeper"),
        "the Hindsight API hindsight://<bank>/… refs read from and agap memory retain and the "
        "keeper (a card's memory.retain) write to "
        "(unset under agap up: its embedded stand-in, seeded with demo memories)",
        "http://127.0.0.1:8888",
    ),
    _v(
        "AGAP_HINDSIGHT_KEY",
        "secret",
        ("worker", "a2a", "cli", "keeper"),
        "the bearer token Hindsight's API requires, if any (its HINDSIGHT_API_TENANT_API_KEY)",
    ),
    _v("AGAP_POLL_SECONDS", "duration", "worker", "worker poll interval (default: the card's)"),
    _v(
        "AGAP_QUOTA_REFRESH",
        "duration",
        ("worker", "a2a"),
        "while a quota shared across hosts looks spent, how often the worker reads the board again "
        "(to see slots given back)",
        "30s",
    ),
    _v(
        "AGAP_OUTAGE_GRACE",
        "duration",
        "worker",
        "how long running work goes on while the board is away",
        note="one lease",
    ),
    _v(
        "AGAP_BOARD_WAIT_CAP",
        "duration",
        ("worker", "keeper", "cron"),
        "the longest wait between tries while a worker, the keeper or agap cron waits for its board at start",
        "30s",
    ),
    _v(
        "AGAP_SUPERVISED",
        "bool",
        ("worker", "keeper", "cron"),
        "set by agap up for the daemons it starts: they leave start-up problems (a bad card) "
        "to it to report, once",
    ),
    _v(
        "AGAP_STOP_GRACE",
        "duration",
        ("worker", "keeper", "cron", "a2a", "mcp", "board"),
        "how long a daemon's orderly stop may take after SIGTERM/SIGINT before it exits anyway "
        "(capped at 2.5s: every daemon is gone within 3s of the signal)",
        "2s",
    ),
    _v(
        "AGAP_WORKER_ID",
        "str",
        ("worker", "cli", "mcp"),
        "the worker identity: agap worker's and agap mcp serve's owner, and the owner agap claim, "
        "heartbeat, complete, fail and ask use when --owner is not given",
        note="agent@host:pid; for the CLI agent@host",
    ),
    _v(
        "LITELLM_LOCAL_MODEL_COST_MAP",
        "str",
        "worker",
        "read by litellm (sdk mode): use its bundled price list, never fetch one at import",
        "True",
    ),
    # Live events
    _v(
        "AGAP_EVENTS_URL",
        "url",
        "events",
        "live events broker (mqtt://, mqtts://, nats://, tls://)",
        grammar="mqtt://, mqtts://, nats:// or tls://HOST[:PORT]",
    ),
    _v(
        "AGAP_EVENTS_SECRET",
        "secret",
        "events",
        "the fabric secret each task's event-signing token is derived from (never sent)",
        grammar="16 or more characters, never printed",
    ),
    _v(
        "AGAP_EVENTS_PREFIX",
        "str",
        "events",
        "the events' topic prefix",
        "agap",
        grammar="1 to 4 levels of letters, digits, _ and - (1 to 64 each), joined by /",
    ),
    _v("AGAP_EVENTS_USERNAME", "str", "events", "the broker user (else the URL's)"),
    _v("AGAP_EVENTS_PASSWORD", "secret", "events", "the broker password (else the URL's)"),
    _v(
        "AGAP_EVENTS_TLS",
        "bool",
        "events",
        "TLS for an mqtt:// or nats:// URL (mqtts:// and tls:// always use it)",
        "0",
    ),
    _v("AGAP_EVENTS_CA", "path", "events", "CA bundle that verifies the broker"),
    _v("AGAP_EVENTS_CERT", "path", "events", "client certificate for the broker"),
    _v("AGAP_EVENTS_KEY", "path", "events", "the client certificate's key file"),
    _v(
        "AGAP_EVENTS_JETSTREAM",
        "bool",
        "events",
        "NATS: use JetStream when the server has it (0: core NATS only)",
        "1",
    ),
    _v(
        "AGAP_EVENTS_WEBHOOK",
        "str",
        "events",
        "a worker's Kanboard webhook listener (wake-up hints only)",
        grammar="HOST:PORT",
    ),
    _v(
        "AGAP_EVENTS_WEBHOOK_TOKEN",
        "secret",
        "events",
        "the token Kanboard's webhook URL must carry (?token=…)",
    ),
    # The keeper
    _v(
        "AGAP_KEEPER_LEASES_EVERY",
        "duration",
        "keeper",
        _EVERY.format("leases") + " (requeue expired leases)",
        "15s",
    ),
    _v(
        "AGAP_KEEPER_BACKLOG_EVERY",
        "duration",
        "keeper",
        _EVERY.format("backlog") + " (keep each lane's Queued cell short, the rest in Backlog)",
        "2s",
    ),
    _v(
        "AGAP_KEEPER_GAPS_EVERY", "duration", "keeper", _EVERY.format("gaps") + " (resolve epoch gaps)", "30s"
    ),
    _v(
        "AGAP_KEEPER_GESTURES_EVERY",
        "duration",
        "keeper",
        _EVERY.format("gestures") + " (card moves by people)",
        "20s",
    ),
    _v(
        "AGAP_KEEPER_INBOX_EVERY",
        "duration",
        "keeper",
        _EVERY.format("inbox") + " (notify gates and questions)",
        "30s",
    ),
    _v(
        "AGAP_KEEPER_DEADLINES_EVERY",
        "duration",
        "keeper",
        _EVERY.format("deadlines") + " (escalate overdue tasks)",
        "60s",
    ),
    _v(
        "AGAP_KEEPER_REMINDERS_EVERY",
        "duration",
        "keeper",
        _EVERY.format("reminders") + " (re-remind ignored gates)",
        "5m",
    ),
    _v("AGAP_KEEPER_GC_EVERY", "duration", "keeper", _EVERY.format("gc") + " (remove old lock tags)", "24h"),
    _v(
        "AGAP_KEEPER_POLICY_EVERY",
        "duration",
        "keeper",
        _EVERY.format("policy") + " (dead letters, parked queues)",
        "60s",
    ),
    _v(
        "AGAP_KEEPER_MATRIX_EVERY",
        "duration",
        "keeper",
        _EVERY.format("matrix") + " (people's replies to notifications in their Matrix rooms)",
        "10s",
    ),
    _v(
        "AGAP_KEEPER_MEMORY_EVERY",
        "duration",
        "keeper",
        _EVERY.format("memory") + " (retain done results into the Hindsight banks of cards' memory.retain)",
        "30s",
    ),
    _v(
        "AGAP_KEEPER_RETAIN_ATTEMPTS",
        "int",
        "keeper",
        "how many times the keeper tries a retain into Hindsight (down, 401, 404, 422, …) "
        "before it gives up with one line in the task's journal",
        "3",
    ),
    _v(
        "AGAP_KEEPER_RETAIN_BACKOFF",
        "duration",
        "keeper",
        "the least time between two of the keeper's attempts at one retain",
        "2m",
    ),
    _v(
        "AGAP_KEEPER_LEASE_GRACE",
        "duration",
        "keeper",
        "an expired lease is requeued only this long after it ran out",
        "5s",
    ),
    _v(
        "AGAP_KEEPER_MOVE_TOLERANCE",
        "duration",
        "keeper",
        "a card moved within this of the fabric's own latest move is that move, not a "
        "gesture (PostgreSQL's deadlock retries delay moves by seconds)",
        "15s",
    ),
    _v(
        "AGAP_KEEPER_REPAIR_AFTER",
        "duration",
        "keeper",
        "half-submitted tasks are repaired after this long",
        "60s",
    ),
    _v(
        "AGAP_KEEPER_REMIND_EVERY",
        "duration",
        "keeper",
        "a gate or question ignored this long is reminded again",
        "4h",
    ),
    _v(
        "AGAP_KEEPER_RETENTION",
        "duration",
        "keeper",
        "lock tags of tasks closed longer than this are removed",
        "30d",
    ),
    _v(
        "AGAP_KEEPER_DIGEST_AT",
        "str",
        "keeper",
        "when the daily digest is written",
        "07:00",
        grammar="HH:MM, 24-hour",
    ),
    _v(
        "AGAP_KEEPER_DIGEST_TZ",
        "str",
        "keeper",
        "the digest's time zone",
        "UTC",
        grammar="an IANA time zone, e.g. Europe/Paris",
    ),
    _v(
        "AGAP_KEEPER_ESCALATE_TO",
        "str",
        ("keeper", "worker", "mcp", "a2a", "cli"),
        "who overdue tasks go to, and who verifies done ones, when no person is responsible "
        "(card id or username)",
        note="the first human card",
    ),
    _v(
        "AGAP_KEEPER_BACKOFF",
        "duration",
        "keeper",
        "the keeper's first retry delay after a board failure (doubles each time)",
        "5s",
    ),
    _v("AGAP_KEEPER_BACKOFF_CAP", "duration", "keeper", "the keeper's longest retry delay", "5m"),
    _v("AGAP_KEEPER_METRICS_HOST", "str", "keeper", "keeper metrics address", "127.0.0.1"),
    _v("AGAP_KEEPER_METRICS_PORT", "int", "keeper", "keeper metrics port (0 = off)", "0"),
    _v("AGAP_KEEPER_METRICS_TOKEN", "secret", "keeper", "bearer token for keeper metrics"),
    # The names `agap household init` gives the people's channels (token_env in their
    # cards); a household's own cards may name others.
    _v(
        "AGAP_MATRIX_TOKEN",
        "secret",
        "keeper",
        "the fabric's Matrix account token (household cards' token_env)",
    ),
    _v(
        "AGAP_WEBHOOK_TOKEN",
        "secret",
        "keeper",
        "the bearer token webhook receivers expect (household cards)",
    ),
    _v(
        "AGAP_KEEPER_METRICS_ALLOW",
        "list",
        "keeper",
        "client addresses or CIDRs that may read the metrics without the token",
    ),
    _v(
        "AGAP_KEEPER_NOTIFY_ALLOW",
        "list",
        "keeper",
        "private or loopback webhook targets notifications may reach (CIDRs)",
    ),
    _v(
        "AGAP_KEEPER_HOOK_HOST",
        "str",
        "keeper",
        "address of the receiver for Kanboard's webhook",
        "127.0.0.1",
    ),
    _v(
        "AGAP_KEEPER_HOOK_PORT",
        "int",
        "keeper",
        "port of the receiver for Kanboard's webhook: a person's gesture is acted on at once (0 = off)",
        "0",
    ),
    _v(
        "AGAP_KEEPER_HOOK_TOKEN",
        "secret",
        ("keeper", "board"),
        "the token Kanboard's webhook sends (its webhook_token setting); required with the port",
    ),
    _v(
        "AGAP_KEEPER_OPENCLAW_TOKEN",
        "secret",
        "keeper",
        "the bearer token OpenClaw's run-finished webhook sends (its cron.webhookToken) to "
        "POST /openclaw on the receiver of AGAP_KEEPER_HOOK_PORT (unset: no such route)",
    ),
    # The A2A server and client
    _v("AGAP_A2A_TOKENS", "secret", "a2a", "A2A clients: caller:token,…"),
    _v("AGAP_A2A_TOKENS_FILE", "path", "a2a", "file with A2A clients' tokens"),
    _v("AGAP_A2A_PUSH_ALLOW", "list", "a2a", "push targets allowed on private addresses (hosts or CIDRs)"),
    _v("AGAP_A2A_TOKEN", "secret", "a2a", "the bearer token agap a2a call sends (or --token)"),
    _v(
        "AGAP_A2A_GRPC_PORT",
        "str",
        "a2a",
        "port of agap a2a serve's gRPC binding, on --host (or --grpc-port; 0 = a free port)",
        note="empty: no gRPC listener (JSON-RPC and HTTP+JSON only)",
    ),
    _v(
        "AGAP_A2A_GRPC_PUBLIC",
        "str",
        "a2a",
        "the host:port gRPC clients reach the server at, for the cards (or --grpc-public)",
        note="empty: the bound host:port",
    ),
    # The MCP server (agap mcp serve)
    _v("AGAP_MCP_TOKEN", "secret", "mcp", "the bearer token agap mcp serve --transport http requires"),
    _v(
        "AGAP_MCP_TASK_KEY",
        "secret",
        "mcp",
        "the key MCP task handles are signed with (handles outlive a restart only with one)",
        note="over HTTP, derived from AGAP_MCP_TOKEN; else random per process",
    ),
    _v(
        "AGAP_MCP_USER",
        "str",
        "mcp",
        "the person (card id or username) using the MCP client: their questions go to the client "
        "as elicitation, everyone else's stay in their Kanboard inbox; honoured only when "
        "AGAP_USER signs that person in",
        note="nobody (AGAP_USER alone does not make the client theirs)",
    ),
    _v(
        "AGAP_MCP_WATCH_EVERY",
        "duration",
        "mcp",
        "how often agap mcp serve reads the board for the tasks a client listens to "
        "(notifications/tasks) while live events are off or the broker is away "
        "(with the broker up: on each event, and every 30 times this, 30s at least)",
        "1s",
    ),
    # The ops-agent (agap ops): Zabbix problems become mitigations or tasks
    _v("AGAP_ZABBIX_URL", "url", "ops", "Zabbix's api_jsonrpc.php URL (agap up starts agap ops when set)"),
    _v(
        "AGAP_ZABBIX_TOKEN",
        "secret",
        "ops",
        "a Zabbix API token for agap ops (problem.get, event.acknowledge)",
    ),
    _v("AGAP_OPS_POLL_EVERY", "duration", "ops", "how often agap ops asks Zabbix for problems", "30s"),
    # Schedules
    _v("AGAP_SCHEDULES", "path", "cron", "the schedule file agap cron reads", "schedules.yaml"),
    # Coding workspaces
    _v(
        "AGAP_WORKSPACE_ROOT",
        "path",
        ("workspace", "cli"),
        "where workspaces/<agent>/<task uid> live",
        note="AGAP_STATE_DIR",
    ),
    _v(
        "AGAP_FORGE_URL",
        "url",
        "workspace",
        "the Gitea base URL pull requests go to",
        note="the repository's host",
    ),
    _v("GITEA_TOKEN", "secret", "workspace", "the forge's access token (--token-env names another variable)"),
)

_BY_NAME: dict[str, Var] = {v.name: v for v in REGISTRY}


def find(name: str) -> Var | None:
    """The registered variable ``name``, or None."""
    return _BY_NAME.get(name)


def var(name: str) -> Var:
    """The registered variable ``name``; an unregistered name is a bug, not bad config."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not in fabric.settings.registry.REGISTRY") from None


def environ(env: Env = None) -> Mapping[str, str]:
    """``env``, or the process environment: for code that hands the mapping on to readers."""
    return os.environ if env is None else env


def named(name: str, env: Env = None) -> str:
    """A variable whose name a card or a flag gives (a provider key, a channel's token).

    Such names are the operator's to choose, so they are not registered. The value is
    read as a secret: "" when unset.
    """
    return environ(env).get(name, "")


def person_secret(template: str, username: str, env: Env = None) -> str:
    """A per-person secret such as ``AGAP_PASSWORD_<USER>`` for ``username`` ("" when
    unset): ``<USER>`` is the username in capitals, with anything but letters and digits
    as ``_`` (``anna-lena`` reads ``AGAP_PASSWORD_ANNA_LENA``)."""
    var(template)  # a registered family, not a name a card invents
    return environ(env).get(person_variable(template, username), "")


def person_variable(template: str, username: str) -> str:
    """The variable ``template`` names for ``username``."""
    return template.replace("<USER>", re.sub(r"[^A-Z0-9]", "_", username.upper()))


def get(name: str, env: Env = None) -> Value | None:
    """``name``'s value parsed by its type, its default when unset, else None."""
    v = var(name)
    text = _text(v, env)
    if text is None:
        if not v.default:
            return None
        text = v.default
    return _parse(v, text)


_T = TypeVar("_T")
_MISSING: object = object()


def _read(
    name: str, env: Env, kinds: tuple[Kind, ...], fallback: object, empty: object, *, as_text: bool = False
) -> object:
    v = var(name)
    if v.kind not in kinds:
        raise TypeError(f"{name} is a {v.kind}, not one of {', '.join(kinds)}")
    text = _text(v, env)
    if text is None:
        if fallback is not _MISSING:
            return fallback
        if not v.default:
            if empty is _MISSING:
                raise ConfigError(f"{name} is not set", where=name, hint=f"expected {v.expected}")
            return empty
        text = v.default
    # A path read as text stays as written (Path("./x") would print as "x").
    return text if as_text and v.kind == "path" else _parse(v, text)


@overload
def get_str(name: str, env: Env = None) -> str: ...
@overload
def get_str(name: str, env: Env = None, *, fallback: _T) -> str | _T: ...
def get_str(name: str, env: Env = None, *, fallback: object = _MISSING) -> object:
    """The text of a str, secret, url or path variable ("" when unset without a default).

    ``fallback``, here and below: what unset means to this reader when that is not the
    registered default (the card's value, a computed one).
    """
    return _read(name, env, ("str", "secret", "url", "path"), fallback, "", as_text=True)


@overload
def get_int(name: str, env: Env = None) -> int: ...
@overload
def get_int(name: str, env: Env = None, *, fallback: _T) -> int | _T: ...
def get_int(name: str, env: Env = None, *, fallback: object = _MISSING) -> object:
    """An int variable; unset without a default or a fallback is a :class:`ConfigError`."""
    return _read(name, env, ("int",), fallback, _MISSING)


@overload
def get_float(name: str, env: Env = None) -> float: ...
@overload
def get_float(name: str, env: Env = None, *, fallback: _T) -> float | _T: ...
def get_float(name: str, env: Env = None, *, fallback: object = _MISSING) -> object:
    """A float variable; unset without a default or a fallback is a :class:`ConfigError`."""
    return _read(name, env, ("float",), fallback, _MISSING)


@overload
def get_duration(name: str, env: Env = None) -> float: ...
@overload
def get_duration(name: str, env: Env = None, *, fallback: _T) -> float | _T: ...
def get_duration(name: str, env: Env = None, *, fallback: object = _MISSING) -> object:
    """A duration in seconds; unset without a default or a fallback is a ConfigError."""
    return _read(name, env, ("duration",), fallback, _MISSING)


def get_bool(name: str, env: Env = None) -> bool:
    """A bool variable (False when unset without a default)."""
    value = _read(name, env, ("bool",), _MISSING, False)
    assert isinstance(value, bool)
    return value


@overload
def get_path(name: str, env: Env = None) -> Path: ...
@overload
def get_path(name: str, env: Env = None, *, fallback: _T) -> Path | _T: ...
def get_path(name: str, env: Env = None, *, fallback: object = _MISSING) -> object:
    """A path variable; unset without a default or a fallback is a :class:`ConfigError`."""
    return _read(name, env, ("path",), fallback, _MISSING)


def get_list(name: str, env: Env = None) -> tuple[str, ...]:
    """A list variable's items, stripped, empty ones dropped (() when unset without a default)."""
    value = _read(name, env, ("list",), _MISSING, ())
    assert isinstance(value, tuple)
    return value


def _text(v: Var, env: Env) -> str | None:
    text = environ(env).get(v.name)
    if text is None or (text == "" and not v.empty):
        return None
    return text


def _parse(v: Var, text: str) -> Value:
    value = _READERS[v.kind](v, text)
    if value is not None:
        return value
    shown = _USERINFO.sub(r"\1\2****@", text) if v.kind == "url" else text  # never echo a password
    raise ConfigError(f"cannot read {shown!r} as {_AS[v.kind]}", where=v.name, hint=f"expected {v.expected}")


# Each kind's reader: the value, or None when ``text`` is not one.
def _as_int(v: Var, text: str) -> Value | None:
    compact = text.strip()
    return int(compact) if _INT.match(compact) else None


def _as_float(v: Var, text: str) -> Value | None:
    compact = text.strip()
    return float(compact) if _FLOAT.match(compact) else None


def _as_bool(v: Var, text: str) -> Value | None:
    compact = text.strip().lower()
    return compact in _TRUE if compact in _TRUE | _FALSE else None


def _as_duration(v: Var, text: str) -> Value | None:
    try:
        return parse_duration(text.strip())
    except InvalidInput:
        return None


def _as_url(v: Var, text: str) -> Value | None:
    compact = text.strip()
    try:
        parts = urlsplit(compact)
        ok = bool(parts.scheme and parts.netloc and parts.hostname)
    except ValueError:  # e.g. an unclosed [IPv6 bracket
        return None
    return compact if ok else None


_READERS: dict[Kind, Callable[[Var, str], Value | None]] = {
    "str": lambda v, text: text,
    "secret": lambda v, text: text,
    "path": lambda v, text: Path(text),
    "list": lambda v, text: tuple(p.strip() for p in text.split(v.sep) if p.strip()),
    "int": _as_int,
    "float": _as_float,
    "bool": _as_bool,
    "duration": _as_duration,
    "url": _as_url,
}


# ---------------------------------------------------------------------------------------
# The README's table

MARKDOWN_BEGIN = (
    "<!-- BEGIN generated by `agap config show --all --markdown` from "
    "fabric/settings/registry.py: edit that, not this table -->"
)
MARKDOWN_END = "<!-- END generated -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """Every registered variable as the README's Markdown table, between its markers."""
    lines = [MARKDOWN_BEGIN, "| variable | read by | type | default | meaning |", "|---|---|---|---|---|"]
    for v in REGISTRY:
        kind = f"{v.kind} ({v.expected})" if v.expected != GRAMMAR[v.kind] else v.kind
        default = f"`{v.default}`" if v.default else v.note
        if v.empty:
            default += f"{'; ' if default else ''}empty: {v.empty}"
        lines.append(
            f"| `{v.name}` | {', '.join(v.readers)} | {_cell(kind)} | {_cell(default)} | {_cell(v.meaning)} |"
        )
    lines += [
        "",
        f"A duration is {GRAMMAR['duration']}. A bool is {GRAMMAR['bool']}. A list "
        f"is {GRAMMAR['list']} unless its type says otherwise. A secret is never printed. "
        "An empty value counts as unset, unless the default column says what it means.",
    ]
    lines.append(MARKDOWN_END)
    return "\n".join(lines) + "\n"


__all__ = [
    "COMPONENTS",
    "GRAMMAR",
    "MARKDOWN_BEGIN",
    "MARKDOWN_END",
    "REGISTRY",
    "Var",
    "environ",
    "find",
    "get",
    "get_bool",
    "get_duration",
    "get_float",
    "get_int",
    "get_list",
    "get_path",
    "get_str",
    "markdown",
    "named",
    "parse_duration",
    "var",
]
