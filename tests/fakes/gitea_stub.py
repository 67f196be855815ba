"""A loopback stand-in for a **Gitea** forge's pull-request REST API (``/api/v1``).

It stands in for the household's Gitea server, which the workspace lease opens pull
requests on (``fabric.apps.forge.GiteaForge``). Only the part of the API the fabric uses is
served, with Gitea's shapes:

* ``GET  /api/v1/repos/{owner}/{repo}/pulls?state=open&page=N&limit=M`` — a JSON list of
  pull requests (``number``, ``html_url``, ``state``, ``title``, ``body``,
  ``head: {ref, label}``, ``base: {ref, label}``);
* ``POST /api/v1/repos/{owner}/{repo}/pulls`` with ``{head, base, title, body}`` — ``201``
  and the new pull request; ``409`` (Gitea's "pull request already exists for these
  targets") when an open one has the same head and base; ``422`` without head/base/title.

Every request needs ``Authorization: token <token>`` (else ``401`` with Gitea's
``{"message": …, "url": …}`` body). Unknown repositories answer ``404``. Every request
(method, path, query, lower-cased headers, parsed body) is kept in :attr:`requests`.
Binds 127.0.0.1 on an ephemeral port; ``with GiteaStub(repos={"alvis/agap"}) as forge: …``.
It does not look at git data: branches are taken on trust.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.fakes.loopback import JsonHandler, Loopback


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclass
class GiteaStub:
    token: str = "gitea-stub-token"
    repos: set[str] = field(default_factory=lambda: {"alvis/agap"})
    requests: list[RecordedRequest] = field(default_factory=list)
    pulls: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._http: Loopback | None = None

    @property
    def url(self) -> str:
        assert self._http is not None, "start the stub first"
        return self._http.url

    def created(self) -> list[RecordedRequest]:
        """The POSTs that created a pull request (201)."""
        return [r for r in self.requests if r.method == "POST" and r.body.get("_status") == 201]

    def start(self) -> GiteaStub:
        stub = self

        class Handler(JsonHandler):
            def _send(self, status: int, data: Any) -> None:
                self.send_json(status, data, content_type="application/json;charset=utf-8")

            def _handle(self, method: str) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {"_unparsed": raw.decode(errors="replace")}
                if not isinstance(body, dict):
                    body = {"_body": body}
                rec = RecordedRequest(
                    method,
                    parts.path,
                    parse_qs(parts.query),
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                )
                with stub._lock:
                    stub.requests.append(rec)
                status, data = stub._answer(method, parts.path, rec)
                rec.body["_status"] = status
                self._send(status, data)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self._http = Loopback(Handler, "gitea-stub").start()
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()
            self._http = None

    def __enter__(self) -> GiteaStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the API -----------------------------------------------------------------------

    def _answer(self, method: str, path: str, rec: RecordedRequest) -> tuple[int, Any]:
        if rec.headers.get("authorization") != f"token {self.token}":
            return 401, {"message": "token is required", "url": f"{self.url}/api/swagger"}
        segs = [unquote(s) for s in path.split("/") if s]
        if len(segs) != 6 or segs[:3] != ["api", "v1", "repos"] or segs[5] != "pulls":
            return 404, {"message": "The target couldn't be found.", "url": self.url, "errors": []}
        repo = f"{segs[3]}/{segs[4]}"
        if repo not in self.repos:
            return 404, {"message": "The target couldn't be found.", "url": self.url, "errors": []}
        with self._lock:
            pulls = self.pulls.setdefault(repo, [])
            if method == "GET":
                state = (rec.query.get("state") or ["open"])[0]
                page = int((rec.query.get("page") or ["1"])[0])
                limit = int((rec.query.get("limit") or ["30"])[0])
                chosen = [p for p in pulls if state == "all" or p["state"] == state]
                return 200, chosen[(page - 1) * limit : page * limit]
            body = rec.body
            if not all(isinstance(body.get(k), str) and body.get(k) for k in ("head", "base", "title")):
                return 422, {
                    "message": "[Head]: Required; [Base]: Required; [Title]: Required",
                    "url": self.url,
                }
            for p in pulls:
                if (
                    p["state"] == "open"
                    and p["head"]["ref"] == body["head"]
                    and p["base"]["ref"] == body["base"]
                ):
                    return 409, {
                        "message": "pull request already exists for these targets "
                        f"[id: {p['id']}, issue_id: {p['number']}, head_repo_id: 1,"
                        " base_repo_id: 1, head_branch: "
                        f"{body['head']}, base_branch: {body['base']}]",
                        "url": self.url,
                    }
            number = len(pulls) + 1
            pr = {
                "id": 1000 + number,
                "number": number,
                "state": "open",
                "title": body["title"],
                "body": body.get("body", ""),
                "html_url": f"{self.url}/{repo}/pulls/{number}",
                "url": f"{self.url}/api/v1/repos/{repo}/pulls/{number}",
                "head": {"ref": body["head"], "label": body["head"]},
                "base": {"ref": body["base"], "label": body["base"]},
                "merged": False,
            }
            pulls.append(pr)
            return 201, pr
