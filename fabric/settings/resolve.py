"""Settings: one resolution order for every setting, and what ``agap config show`` lists.

Resolution order (first wins):

1. the process environment;
2. an env file named by ``AGAP_ENV_FILE`` — a missing or malformed file is an error
   (fail closed), never a silent fallback — and then no other file;
3. else a project file, ``.agap.env``, found by walking up from the working directory;
4. else the user's file, ``$XDG_CONFIG_HOME/agap/env`` (``~/.config/agap/env``): what a
   process started with no working directory of ours and a bare environment finds (an
   OpenClaw stdio MCP server gets only HOME, PATH, PWD, SHELL and TERM).

Files hold ``KEY=VALUE`` lines (``#`` comments, optional ``export``, optional quotes).
The CLI applies them to its own environment at start (:func:`apply_config_files`), so
every part of the fabric, and every process it starts, sees the same settings.
Secrets come only from the environment or these files, never from the repository.
Which variables exist, their types and defaults: :mod:`fabric.settings.registry`.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import field
from pathlib import Path
from urllib.parse import urlsplit

from fabric.errors import ConfigError
from fabric.plain import Plain
from fabric.settings import registry
from fabric.settings.registry import Var

ENV_FILE_VAR = "AGAP_ENV_FILE"
PROJECT_FILE = ".agap.env"
USER_FILE = Path("agap") / "env"  # under $XDG_CONFIG_HOME, default ~/.config

_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")
_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")

# What `agap config show` lists without --all, in this order: the settings it has always
# listed (the registry holds every other variable, and --all shows them).
KNOWN: tuple[Var, ...] = tuple(
    registry.var(name)
    for name in (
        "KANBOARD_URL",
        "KANBOARD_API_TOKEN",
        "AGAP_CARDS_DIR",
        "AGAP_STATE_DIR",
        "AGAP_PROJECT",
        "AGAP_LOCKS_PROJECT",
        "AGAP_ACTOR",
        "AGAP_MODEL_MODE",
        "AGAP_LITELLM_URL",
        "LITELLM_MASTER_KEY",
        "AGAP_LITELLM_KEY",
        "AGAP_RESULT_STORE",
        "AGAP_RESULT_DIR",
        "AGAP_REF_ROOTS",
        "AGAP_POLL_SECONDS",
        "AGAP_OUTAGE_GRACE",
        "AGAP_BOARD_PORT",
        "AGAP_BOARD_TOKEN",
        "AGAP_EVENTS_URL",
        "AGAP_EVENTS_SECRET",
        "AGAP_KEEPER_METRICS_PORT",
        "AGAP_KEEPER_METRICS_TOKEN",
        "AGAP_A2A_TOKENS",
        "AGAP_A2A_TOKENS_FILE",
        ENV_FILE_VAR,
    )
)


def is_secret(name: str) -> bool:
    """True for a setting whose value must never be printed."""
    known = registry.find(name)
    return (known is not None and known.secret) or any(w in name.upper() for w in _SECRET_WORDS)


def mask(name: str, value: str) -> str:
    """The value as it may be shown: secrets as ``****`` plus their length."""
    if not value or not is_secret(name):
        return value
    return f"**** ({len(value)} chars)"


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` pairs of an env file; a malformed line is an error naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the env file: {exc.strerror}",
            where=str(path),
            hint=f"fix the path in {ENV_FILE_VAR} or unset it",
        ) from None
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise ConfigError(
                "not a KEY=VALUE line", where=f"{path}:{number}", hint="write NAME=value (quotes optional)"
            )
        value = m.group(2)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[m.group(1)] = value
    return values


def find_project_file(start: Path) -> Path | None:
    """The nearest ``.agap.env`` in ``start`` or a parent directory."""
    for folder in (start, *start.parents):
        candidate = folder / PROJECT_FILE
        if candidate.is_file():
            return candidate
    return None


def user_file(environ: Mapping[str, str]) -> Path | None:
    """``$XDG_CONFIG_HOME/agap/env``, else ``$HOME/.config/agap/env`` (None without either)."""
    base = registry.get_str("XDG_CONFIG_HOME", environ, fallback="")
    if not base:
        home = environ.get("HOME", "")
        if not home:
            return None
        base = str(Path(home) / ".config")
    return Path(base).expanduser() / USER_FILE


class Resolved(Plain, frozen=False):
    """Effective settings and where each came from (``environment`` or a file path)."""

    values: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def resolve(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Resolved:
    """Merge the environment and one env file: the named one, else the project file, else
    the user's file.

    A named file is the only file: ``.agap.env`` discovery is off then, so a file left
    in a parent directory never fills in what the named file leaves out; and a project
    file found is the only one too (the user's file fills in nothing beside it).
    """
    env = dict(os.environ if environ is None else environ)
    out = Resolved(dict(env), {k: "environment" for k in env})
    named = registry.get_str(ENV_FILE_VAR, env)
    path = Path(named).expanduser() if named else find_project_file((cwd or Path.cwd()).resolve())
    if path is None:
        mine = user_file(env)
        path = mine if mine is not None and mine.is_file() else None
    if named and path is not None and not path.is_file():
        raise ConfigError(
            f"{ENV_FILE_VAR} names a file that does not exist",
            where=str(path),
            hint="create it, fix the path, or unset the variable",
        )
    if path is not None:
        for key, value in read_env_file(path).items():
            if key not in out.values:
                out.values[key] = value
                out.sources[key] = str(path)
    return out


def apply_config_files(
    environ: MutableMapping[str, str] | None = None, cwd: Path | None = None, *, named: str | None = None
) -> Resolved:
    """Add settings from the env files to ``environ`` (never overriding it); ``named``
    (``agap --env-file``) becomes its ``AGAP_ENV_FILE`` first, for the processes it starts too."""
    global _applied
    target = os.environ if environ is None else environ
    if named is not None:
        target[ENV_FILE_VAR] = named
    resolved = resolve(target, cwd)
    for key, value in resolved.values.items():
        target.setdefault(key, value)
    if environ is None:
        _applied = resolved
    return resolved


_applied: Resolved | None = None


def effective() -> Resolved:
    """The settings with their sources: as applied at start, else resolved now."""
    return _applied if _applied is not None else resolve()


# The schemes that carry no TLS, and what to use instead.
_PLAIN_SCHEMES = {
    "http": "use an https:// URL",
    "ws": "use a wss:// URL",
    "mqtt": "use mqtts:// (or set AGAP_EVENTS_TLS=1)",
    "tcp": "use mqtts:// (or set AGAP_EVENTS_TLS=1)",
    "nats": "use tls:// (or set AGAP_EVENTS_TLS=1)",
}
_warned_at: set[tuple[str, str]] = set()  # (what, where): each warns once per process


def warn_if_plaintext(url: str, what: str, *, tls: bool = False) -> bool:
    """Warn once on stderr when ``url`` reaches a non-loopback host without TLS.

    The one check for the board, the events broker and the LiteLLM proxy: every command
    that connects to one calls it first (and ``agap config show`` for all three).
    ``tls`` says TLS is on by other means (``AGAP_EVENTS_TLS`` for an mqtt:// URL).
    Host names are judged as written, never resolved: only an IP loopback address and
    ``localhost`` count as loopback.
    """
    if not url or tls:
        return False
    parts = urlsplit(url)
    scheme, host = parts.scheme.lower(), parts.hostname or ""
    hint = _PLAIN_SCHEMES.get(scheme)
    try:
        where = f"{scheme}://{host}" + (f":{parts.port}" if parts.port else "")
    except ValueError:  # a bad port: the reader of the URL reports it
        return False
    if hint is None or _is_loopback(host) or (what, where) in _warned_at:
        return False
    _warned_at.add((what, where))
    sys.stderr.write(
        f"agap: warning: {what} at {where} is reached without TLS, so tokens and tasks cross"
        f" the network in clear text; {hint}\n"
    )
    return True


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# The registered defaults ({}: no environment).
_CARDS_DIR = registry.get_path("AGAP_CARDS_DIR", {})
_STATE_DIR = registry.get_path("AGAP_STATE_DIR", {})


class Settings(Plain):
    """Where the board is, how to log in, and where cards and state live."""

    board_url: str = ""
    board_token: str = field(default="", repr=False)
    cards_dir: Path = _CARDS_DIR
    state_dir: Path = _STATE_DIR
    project: str = registry.get_str("AGAP_PROJECT", {})
    locks_project: str = registry.get_str("AGAP_LOCKS_PROJECT", {})
    quota_project: str = registry.get_str("AGAP_QUOTA_PROJECT", {})
    actor: str = registry.get_str("AGAP_ACTOR", {})
    web_url: str = ""  # KANBOARD_WEB_URL; "" = derived from board_url (fabric.kanboard.weblinks)
    board_user: str = ""  # AGAP_BOARD_USER: sign in as this user, not with the app token
    board_password: str = field(default="", repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the settings through the resolution order (environment, env file, project file)."""
        e = resolve(env).values
        return cls(
            board_url=registry.get_str("KANBOARD_URL", e),
            board_token=registry.get_str("KANBOARD_API_TOKEN", e),
            cards_dir=registry.get_path("AGAP_CARDS_DIR", e),
            state_dir=registry.get_path("AGAP_STATE_DIR", e),
            project=registry.get_str("AGAP_PROJECT", e),
            locks_project=registry.get_str("AGAP_LOCKS_PROJECT", e),
            quota_project=registry.get_str("AGAP_QUOTA_PROJECT", e),
            actor=registry.get_str("AGAP_ACTOR", e),
            web_url=registry.get_str("KANBOARD_WEB_URL", e, fallback=""),
            board_user=registry.get_str("AGAP_BOARD_USER", e, fallback=""),
            board_password=registry.get_str("AGAP_BOARD_PASSWORD", e, fallback=""),
        )

    def require_board(self) -> tuple[str, str]:
        """The board URL and token, or a :class:`ConfigError` that says how to set them."""
        if not self.board_url:
            raise ConfigError(
                "KANBOARD_URL is not set",
                hint="start the embedded board with `agap board serve` and export what it prints",
            )
        if self.board_user and not self.board_password:
            raise ConfigError(
                f"AGAP_BOARD_USER is {self.board_user!r} but AGAP_BOARD_PASSWORD is not set",
                hint="set the user's password, or unset AGAP_BOARD_USER to use the application token",
            )
        if not self.board_token and not self.board_user:
            raise ConfigError(
                "KANBOARD_API_TOKEN is not set",
                hint="use the token `agap board serve` printed, or Kanboard's API token",
            )
        warn_if_plaintext(self.board_url, "the board")
        return self.board_url, self.board_token
