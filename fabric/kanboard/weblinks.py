"""Links a person clicks: Kanboard's own pages for a task and for a task's attachment.

Kanboard 1.2.53 shows a task at ``?controller=TaskViewController&action=show&task_id=T``
(what its Markdown makes of ``#T``) and a task's file at
``?controller=FileViewerController&action=show&task_id=T&file_id=F`` (the "View file" of
the task's attachments: Markdown rendered, text as text). The query form works with and
without URL rewriting, and the embedded board's web view serves the same two pages.

The base is ``KANBOARD_WEB_URL``, else ``KANBOARD_URL`` without ``jsonrpc.php``: in the
compose stack the fabric reaches Kanboard by a name no browser knows, so set it there.
"""

from __future__ import annotations

from urllib.parse import urlencode, urlsplit

from fabric.plain import Plain

API_PAGE = "jsonrpc.php"


def web_base(board_url: str, web_url: str = "") -> str:
    """The address people open Kanboard at, ending in ``/``; "" when there is none (a
    board reached in process, or not over http(s))."""
    url = (web_url or board_url).strip()
    if urlsplit(url).scheme not in ("http", "https"):
        return ""
    if not web_url and url.rstrip("/").endswith(API_PAGE):
        url = url.rstrip("/")[: -len(API_PAGE)]
    return url if url.endswith("/") else url + "/"


class WebLinks(Plain):
    """Kanboard page URLs under one base (see :func:`web_base`)."""

    base: str

    def _page(self, controller: str, **params: int) -> str:
        return f"{self.base}?{urlencode({'controller': controller, 'action': 'show', **params})}"

    def task(self, task_id: int) -> str:
        """The task's page in Kanboard."""
        return self._page("TaskViewController", task_id=task_id)

    def file(self, task_id: int, file_id: int) -> str:
        """One of the task's attachments, opened in Kanboard's file viewer."""
        return self._page("FileViewerController", task_id=task_id, file_id=file_id)


def links_for(board_url: str, web_url: str = "") -> WebLinks | None:
    """The links for a board, or None when people cannot open it in a browser."""
    base = web_base(board_url, web_url)
    return WebLinks(base) if base else None
