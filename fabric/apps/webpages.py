"""The embedded board's stand-ins for two of Kanboard's pages, at Kanboard's own URLs.

Cards link a task as ``?controller=TaskViewController&action=show&task_id=T`` and a result
as ``?controller=FileViewerController&action=show&task_id=T&file_id=F``
(:mod:`fabric.kanboard.weblinks`). On a real Kanboard those are its task page and its file
viewer; on the embedded board the web view (:mod:`fabric.apps.web`) answers them with
these read-only pages, so the same link works on both. A card's Markdown is rendered with
HTML off (as Kanboard's Parsedown in safe mode does); a result is shown as escaped text:
it comes from a model.
"""

from __future__ import annotations

import base64
import binascii
import html
from collections.abc import Mapping

from markdown_it import MarkdownIt

from fabric.kanboard.cardtext import APPROVALS
from fabric.kanboard.gestures import commands
from fabric.kanboard.taskboard import TaskBoard, TaskNotFound, TaskView
from fabric.task import State

HTML_TYPE = "text/html; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"
Page = tuple[int, str, bytes]
STYLE = (
    "body{margin:0 auto;max-width:960px;padding:20px;font:14px/1.5 system-ui,sans-serif;color:#172b4d}"
    "pre{white-space:pre-wrap;word-break:break-word;background:#f4f5f7;padding:12px;border-radius:6px}"
    "a{color:#0052cc}code{background:#f4f5f7;padding:1px 5px;border-radius:3px}"
    ".card{background:#fff;border:1px solid #dfe1e6;border-radius:6px;padding:4px 16px}"
    ".turn{font-size:16px;font-weight:600}"
)


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _page(title: str, body: str) -> Page:
    head = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; form-action 'none'; base-uri 'none'\">"
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>"
    )
    return 200, HTML_TYPE, (head + body + "</body></html>").encode()


def _int(query: Mapping[str, list[str]], name: str) -> int:
    try:
        return int(query.get(name, ["0"])[0])
    except ValueError:
        return 0


def kanboard_page(board: TaskBoard, query: Mapping[str, list[str]]) -> Page | None:
    """The page Kanboard's ``controller``/``action`` query names, or None if not one of ours."""
    controller, action = query.get("controller", [""])[0], query.get("action", ["show"])[0]
    if action != "show":
        return None
    if controller == "TaskViewController":
        return task_page(board, _int(query, "task_id"))
    if controller == "FileViewerController":
        return file_page(board, _int(query, "task_id"), _int(query, "file_id"))
    return None


def _missing(what: str) -> Page:
    return 404, TEXT_TYPE, f"{what} does not exist on this board\n".encode()


_MD = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")


def task_page(board: TaskBoard, task_id: int) -> Page:
    """A task as a person reads it: whose turn it is, what can be done from a shell (this
    view is read-only), the card rendered as Kanboard renders it (Markdown, no HTML, no
    sealed spec), and its files as links."""
    try:
        view = board.read(task_id)
    except TaskNotFound:
        return _missing(f"task #{task_id}")
    rec, spec = view.current, view.spec
    files = board.files(task_id)
    links = board.links
    items = "".join(
        f'<li><a href="{_e(links.file(task_id, f.id))}">{_e(f.name)}</a></li>'
        if links
        else f"<li>{_e(f.name)}</li>"
        for f in files
    )
    body = f"<h1>#{task_id} {_e(view.task.title)}</h1><p class=turn>{_e(turn(view))}</p>"
    if rec is not None and spec is not None:
        waiting = rec.state == State.QUEUED and bool(rec.assignee)
        cmds = commands(task_id, rec.state, waiting=waiting, approval=spec.actor in APPROVALS)
        if cmds:
            body += (
                "<h2>From a shell</h2><p>This view is read-only: in Kanboard you would use the "
                "gestures the card names; here, the same from <code>agap</code>:</p><ul>"
                + "".join(f"<li><code>{_e(c)}</code></li>" for c in cmds)
                + "</ul>"
            )
    body += f'<div class="card">{_MD.render(board.body(view))}</div>'
    if files:
        body += f"<h2>Attachments</h2><ul>{items}</ul>"
    return _page(f"#{task_id} {view.task.title}", body)


def turn(view: TaskView) -> str:
    """Whose turn it is, in a few words."""
    rec = view.current
    if rec is None:
        return "not a fabric task (or its submit is in flight)"
    who = f"@{rec.assignee}" if rec.assignee else "a person"
    return {
        State.QUEUED: f"waiting on {who}"
        if rec.assignee
        else f"queued for {view.spec.target if view.spec else '?'}",
        State.WORKING: f"being worked on by {rec.owner}",
        State.INPUT_REQUIRED: f"asking {who}: {rec.reason or ''}",
        State.DONE: f"done: waiting for {who} to verify it",
        State.DEAD: f"dead letter: {rec.reason or 'it gave up'}",
    }.get(rec.state, rec.state.value)


def file_page(board: TaskBoard, task_id: int, file_id: int) -> Page:
    """One attachment of a task, as text (a file of another task is not found, as in
    Kanboard)."""
    name = next((f.name for f in board.files(task_id) if f.id == file_id), None)
    if name is None:
        return _missing(f"file {file_id} of task #{task_id}")
    try:
        text = base64.b64decode(board.download(file_id)).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        text = "(this file is not text)"
    body = f"<h1>{_e(name)}</h1><p>task #{task_id}</p><pre>{_e(text)}</pre>"
    return _page(name, body)
