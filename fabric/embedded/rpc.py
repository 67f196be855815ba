"""The embedded board's JSON-RPC dispatcher, with Kanboard's semantics.

Each procedure keeps Kanboard's name, parameter names and order, and its way of
failing: ``false`` for validation errors and duplicates, ``0`` for a failed insert,
``null`` for a getter that finds nothing. Each call commits on its own, so a batch is
ordered but not atomic, exactly as in Kanboard. The behaviours reproduced here were
measured against a real Kanboard 1.2.53 (see ``tests/contract``); PHP's loose typing is
imitated where the API exposes it (an int param may arrive as ``"2"``, a named ``null``
is passed as ``null``, a non-array where PHP types ``array`` is an HTTP 500:
:mod:`fabric.embedded.php`). What depends on Kanboard's database backend follows the
API's flavour (:mod:`fabric.embedded.flavour`; ``strict`` unless told otherwise).

The procedures live in :mod:`fabric.embedded.procedures`, one module per group of
Kanboard's API reference; this module binds a request's params to one and answers.
"""

from __future__ import annotations

import base64
import hmac
import inspect
import json
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from fabric.embedded import flavour as fl
from fabric.embedded import procedures  # noqa: F401  imported to register every procedure
from fabric.embedded.flavour import Flavour, SqlError
from fabric.embedded.permissions import check
from fabric.embedded.procedures.activity import caller
from fabric.embedded.procedures.base import REGISTRY, Board, ProcedureSpec
from fabric.embedded.store import Store, password_matches

#: Kanboard's BRUTEFORCE_LOCKDOWN and BRUTEFORCE_LOCKDOWN_DURATION defaults: the failed
#: sign-ins in a row a user may have before the next locks it, and for how long.
LOCKDOWN = 6
LOCKDOWN_MINUTES = 15


def procedure_names() -> frozenset[str]:
    """Every procedure the board answers: Kanboard's method names."""
    return frozenset(REGISTRY)


class InvalidParams(Exception):
    """Kanboard's -32602: a missing argument or the wrong number of them."""


class BoardApi(Board):
    """Dispatches decoded JSON-RPC payloads to the procedures over one :class:`Store`.

    ``flavour`` is the backend imitated (default: the store's, itself ``strict`` unless
    told otherwise).
    """

    def __init__(
        self,
        store: Store,
        token: str,
        *,
        clock: Callable[[], float] = time.time,
        flavour: str | Flavour | None = None,
    ):
        super().__init__(store, clock=clock, flavour=flavour)
        self.token = token

    # -- auth and dispatch ----------------------------------------------------------

    def check_basic_auth(self, header: str | None) -> bool:
        """True when ``Authorization: Basic`` carries ``jsonrpc:<token>`` or a user's password."""
        return self.caller_of(header) is not None

    def caller_of(self, header: str | None) -> int | None:
        """Who ``Authorization: Basic`` names: 0 for ``jsonrpc:<token>`` (the application),
        a user's id for ``<username>:<password>`` (user-auth JSON-RPC), None when refused."""
        if not header or not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
            return None
        if user == "jsonrpc":
            return 0 if hmac.compare_digest(password.encode(), self.token.encode()) else None
        return self._user_auth(user, password)

    def _user_auth(self, user: str, secret: str) -> int | None:
        """Kanboard 1.2.53's user sign-in over the API (``AuthenticationMiddleware``): a
        locked user is refused whatever it sends; else the password (``DatabaseAuth``: not
        for a user whose login form is disabled) or the personal API token
        (``ApiAccessTokenAuth``) of an active user. Each failure counts; the one after
        ``LOCKDOWN`` in a row locks the user for ``LOCKDOWN_MINUTES``; a success clears the
        count (``AuthSubscriber``)."""
        now = int(self.clock())
        with self.store.read() as db:
            row = db.execute(
                "SELECT id, password, is_active, disable_login_form, is_ldap_user, api_access_token,"
                " nb_failed_login, lock_expiration_date FROM users WHERE username = ?",
                (user,),
            ).fetchone()
        if row is None:
            return None  # Kanboard counts the failure against no row: nothing changes
        if (row["lock_expiration_date"] or 0) >= now:
            return None
        by_password = (
            not row["disable_login_form"]
            and not row["is_ldap_user"]
            and password_matches(row["password"], secret)
        )
        token = row["api_access_token"]
        by_token = bool(token) and hmac.compare_digest(str(token).encode(), secret.encode())
        if row["is_active"] == 1 and (by_password or by_token):
            if row["nb_failed_login"] or row["lock_expiration_date"]:  # else nothing to clear
                with self.store.write() as db:
                    db.execute(
                        "UPDATE users SET nb_failed_login = 0, lock_expiration_date = 0 WHERE id = ?",
                        (row["id"],),
                    )
            return int(row["id"])
        with self.store.write() as db:
            db.execute("UPDATE users SET nb_failed_login = nb_failed_login + 1 WHERE id = ?", (row["id"],))
            db.execute(
                "UPDATE users SET lock_expiration_date = ? WHERE id = ? AND nb_failed_login > ?",
                (now + LOCKDOWN_MINUTES * 60, row["id"], LOCKDOWN),
            )
        return None

    def handle(self, payload: Any) -> Any:
        """Answer one request or a batch (a list), in order. ``None`` means no reply.

        Raises :class:`~fabric.embedded.php.Fatal` where PHP would die with an HTTP 500
        (the whole reply is lost, but earlier batch items stay committed), and
        :class:`~fabric.embedded.permissions.Forbidden` where Kanboard refuses a signed-in
        user (HTTP 403; earlier batch items stay committed, later ones never run).
        """
        if isinstance(payload, list) and payload:
            replies = [
                self._one(item) if isinstance(item, dict) else _error(None, -32700, "Parse error")
                for item in payload
            ]
            kept = [r for r in replies if r is not None]
            return kept or None
        if isinstance(payload, dict | list):
            return self._one(payload)
        return _error(None, -32700, "Parse error")

    def handle_bytes(self, raw: bytes) -> bytes | None:
        """Decode, answer and encode; raises :class:`~fabric.embedded.php.Fatal` for an HTTP 500."""
        try:
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            payload = None
        reply = self.handle(payload)
        if reply is None:
            return None
        return encode(reply)

    def _one(self, req: Any) -> Any:
        if (
            not isinstance(req, dict)
            or req.get("jsonrpc") != "2.0"
            or not isinstance(req.get("method"), str)
            or not isinstance(req.get("params", []), list | dict | None)
        ):
            return _error(None, -32600, "Invalid Request")
        rpc_id = req.get("id")
        notification = rpc_id is None
        spec = REGISTRY.get(req["method"])
        if spec is None:
            return None if notification else _error(rpc_id, -32601, "Method not found")
        try:
            args = _bind(spec, req.get("params"))
        except InvalidParams as exc:
            return None if notification else _error(rpc_id, -32602, "Invalid params", str(exc))
        if self.flavour.cut_nul:
            args = fl.cut_nul(args)
        named = dict(zip(spec.names, args, strict=True))
        try:
            fl.check_int32(self.flavour, req["method"], named)
            # A refusal (permissions.Forbidden) ends the whole request: see handle().
            verdict = check(self, caller(), req["method"], named)
            result = spec.fn(self, *args) if verdict.run else verdict.result
        except SqlError as exc:
            # The statement failed and Kanboard rolled its transaction back (Store.write
            # did the same); PDO's message reaches the caller as a code 0 error.
            return None if notification else _error(rpc_id, 0, exc.message)
        except sqlite3.OperationalError as exc:
            # Kanboard (PDO) reports SQL errors as a JSON-RPC error with code 0; the
            # statement may or may not have committed, as far as the caller knows.
            message = f"SQL Error[HY000]: SQLSTATE[HY000]: General error: 5 {exc}"
            return None if notification else _error(rpc_id, 0, message)
        if notification:
            return None
        return {"jsonrpc": "2.0", "result": result, "id": rpc_id}


# What json.dumps(reply, separators=(",", ":"), ensure_ascii=...) builds on every call.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_JSON_ASCII = json.JSONEncoder(separators=(",", ":"))


def encode(reply: Any) -> bytes:
    """JSON as Kanboard sends it (unescaped slashes and unicode)."""
    text = _JSON.encode(reply)
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate came in; escape rather than fail
        return _JSON_ASCII.encode(reply).encode()


def _error(rpc_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data:
        err["data"] = data
    return {"jsonrpc": "2.0", "error": err, "id": rpc_id}


def _bind(spec: ProcedureSpec, params: Any) -> list[Any]:
    """Kanboard's argument binding (JsonRPC ProcedureHandler).

    The number of params is checked first: fewer than the required count is "Wrong
    number of arguments", more than the total is "Too many arguments" (named params
    included, unknown keys counted). Then positional params bind in order, and named
    ones by exact, case-sensitive name ("Missing argument: <name>"); unknown names are
    ignored and a named ``null`` is passed as ``null``.
    """
    if not params:
        params = []
    n = len(params)
    if n < spec.required:
        raise InvalidParams("Wrong number of arguments")
    if n > len(spec.names):
        raise InvalidParams("Too many arguments")
    if isinstance(params, dict):
        if list(params) == [str(i) for i in range(n)]:
            params = list(params.values())  # PHP sees {"0":..,"1":..} as a list
        else:
            args: list[Any] = []
            for name, default in zip(spec.names, spec.defaults, strict=True):
                if name in params:
                    args.append(params[name])
                elif default is not inspect.Parameter.empty:
                    args.append(default)
                else:
                    raise InvalidParams(f"Missing argument: {name}")
            return args
    return [*params, *spec.defaults[n:]]
