"""Where a coding task's pull request is opened: a forge (Gitea's REST API).

A workspace (:mod:`fabric.apps.workspace`) pushes its task branch and asks a
:class:`Forge` to open the pull request; opening is idempotent per head and base (an open
pull request for the same branches is returned instead of a second one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import quote

import requests

from fabric.errors import EXIT_FAILED, ConfigError, FabricError, InvalidInput
from fabric.settings import registry


class ForgeError(FabricError):
    """The forge refused or failed a request (a workspace step that failed)."""

    exit_code = EXIT_FAILED


class Forge(Protocol):
    """Where pull requests are opened. Implementations must be idempotent per head/base."""

    def open_pull_request(self, repo: str, head: str, base: str, title: str, body: str) -> str:
        """Open (or find the open) pull request of ``head`` into ``base``; return its URL."""
        ...


class GiteaForge:
    """Gitea's REST API (``/api/v1``), authenticated with ``Authorization: token <token>``.

    The token is read from the environment variable ``token_env`` at call time; it is
    never stored in the repository or in the workspace.
    """

    def __init__(
        self,
        base_url: str,
        token_env: str = "GITEA_TOKEN",
        *,
        session: requests.Session | None = None,
        timeout: float = 15.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token_env = token_env
        self.session = session or requests.Session()
        self.timeout = timeout
        self._env = env

    def _headers(self) -> dict[str, str]:
        token = registry.named(self.token_env, self._env)
        if not token:
            raise ConfigError(
                f"{self.token_env} is not set",
                where="forge",
                hint=f"export {self.token_env} with a Gitea access token (scope: write:repository)",
            )
        return {"Authorization": f"token {token}", "Accept": "application/json"}

    def _pulls_url(self, repo: str) -> str:
        owner, _, name = repo.partition("/")
        if not owner or not name:
            raise InvalidInput(f"{repo!r} is not owner/name", where="forge")
        return f"{self.base_url}/api/v1/repos/{quote(owner, safe='')}/{quote(name, safe='')}/pulls"

    def _request(self, method: str, url: str, **kw: Any) -> requests.Response:
        try:
            reply = self.session.request(method, url, headers=self._headers(), timeout=self.timeout, **kw)
        except requests.RequestException as exc:
            raise ForgeError(
                f"{method} {url} failed: {exc}", where="forge", hint="is the forge reachable from here?"
            ) from None
        if reply.status_code in (401, 403):
            raise ForgeError(
                f"the forge refused the token ({reply.status_code})",
                where=url,
                hint=f"check {self.token_env}",
            )
        return reply

    def find_open_pull_request(self, repo: str, head: str, base: str) -> str | None:
        """The URL of an open pull request of ``head`` into ``base``, if there is one."""
        url = self._pulls_url(repo)
        for page in range(1, 51):
            reply = self._request("GET", url, params={"state": "open", "page": page, "limit": 50})
            if reply.status_code != 200:
                raise ForgeError(f"listing pull requests: HTTP {reply.status_code}", where=url)
            pulls = reply.json()
            if not isinstance(pulls, list) or not pulls:
                return None
            for pr in pulls:
                if (pr.get("head") or {}).get("ref") == head and (pr.get("base") or {}).get("ref") == base:
                    return str(pr["html_url"])
        return None

    def open_pull_request(self, repo: str, head: str, base: str, title: str, body: str) -> str:
        existing = self.find_open_pull_request(repo, head, base)
        if existing:
            return existing
        url = self._pulls_url(repo)
        reply = self._request("POST", url, json={"head": head, "base": base, "title": title, "body": body})
        if reply.status_code == 201:
            return str(reply.json()["html_url"])
        if reply.status_code == 409:  # Gitea: a pull request for these branches exists
            existing = self.find_open_pull_request(repo, head, base)
            if existing:
                return existing
        raise ForgeError(f"opening a pull request: HTTP {reply.status_code} {reply.text[:200]}", where=url)


__all__ = ["Forge", "ForgeError", "GiteaForge"]
