"""A small Zabbix JSON-RPC client: the only module of the fabric that speaks Zabbix.

Zabbix 6.0 wants the token (or session) in the request body's ``auth`` member; 6.4 and
later take ``Authorization: Bearer`` and 7.2 drops ``auth``. The client asks
``apiinfo.version`` (which needs no auth) once and speaks the version's way.
"""

from __future__ import annotations

import itertools
from typing import Any

import requests

from fabric.errors import EXIT_UNREACHABLE, FabricError


class ZabbixError(FabricError):
    """Zabbix could not be reached, refused the call, or answered something unreadable."""

    exit_code = EXIT_UNREACHABLE


class ZabbixUnreachable(ZabbixError):
    """No answer at all (connection refused, time-out, an HTTP error status)."""


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


class ZabbixClient:
    """``call(method, params)`` against ``.../api_jsonrpc.php`` with an API token or session."""

    def __init__(self, url: str, token: str = "", *, timeout: float = 10.0) -> None:
        self.url = url
        self.token = token
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._http = requests.Session()
        self._version: tuple[int, ...] | None = None

    def close(self) -> None:
        self._http.close()

    def version(self) -> tuple[int, ...]:
        """The API's (major, minor), asked once."""
        if self._version is None:
            text = self.call("apiinfo.version", {}, auth=False)
            if not isinstance(text, str) or not _version_tuple(text):
                raise ZabbixError(f"apiinfo.version answered {text!r}", where=self.url)
            self._version = _version_tuple(text)
        return self._version

    def login(self, username: str, password: str) -> str:
        """A session for ``username`` (tests and setup; the ops-agent uses an API token)."""
        key = "username" if self.version() >= (5, 4) else "user"
        session = self.call("user.login", {key: username, "password": password}, auth=False)
        if not isinstance(session, str):
            raise ZabbixError(f"user.login answered {session!r}", where=self.url)
        self.token = session
        return session

    def call(self, method: str, params: dict[str, Any] | list[Any], *, auth: bool = True) -> Any:
        """The ``result`` of one call; a Zabbix ``error`` or an unreadable answer raises."""
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params, "id": next(self._ids)}
        headers = {"Content-Type": "application/json-rpc"}
        if auth and self.token:
            if self.version() >= (6, 4):
                headers["Authorization"] = f"Bearer {self.token}"
            else:
                body["auth"] = self.token
        try:
            resp = self._http.post(self.url, json=body, headers=headers, timeout=self.timeout)
        except requests.RequestException as exc:
            raise ZabbixUnreachable(
                f"cannot reach Zabbix ({type(exc).__name__})",
                where=self.url,
                hint="is the frontend serving api_jsonrpc.php there? (AGAP_ZABBIX_URL)",
            ) from None
        if resp.status_code >= 400:
            raise ZabbixUnreachable(f"HTTP {resp.status_code} from Zabbix", where=self.url)
        try:
            answer = resp.json()
        except ValueError:
            raise ZabbixError(
                f"{method}: the answer is not JSON ({resp.text[:60]!r})",
                where=self.url,
                hint="is AGAP_ZABBIX_URL the api_jsonrpc.php URL?",
            ) from None
        if not isinstance(answer, dict):
            raise ZabbixError(f"{method}: the answer is not a JSON-RPC object", where=self.url)
        if "error" in answer:
            err = answer["error"] if isinstance(answer["error"], dict) else {}
            raise ZabbixError(
                f"{method}: {err.get('message', 'error')} {err.get('data', '')}".strip(), where=self.url
            )
        if "result" not in answer:
            raise ZabbixError(f"{method}: the answer has no result", where=self.url)
        return answer["result"]
