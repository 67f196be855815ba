"""A read-only web page of the fabric for the embedded board: columns by swimlanes.

Real deployments look at tasks in Kanboard's own UI. The embedded board has no UI, so
``agap board serve`` and ``agap up`` also serve this page, behind the same token as the
API (a browser logs in with user ``jsonrpc`` and the board's token).

* ``GET /`` is the page: one row per queue (swimlane), one cell per column, and in each
  cell the open tasks with their state, epoch, owner, age and priority. Parked queues
  are shown in a banner and on their row. The page reloads itself every few seconds.
* ``GET /board.json`` is the same snapshot as JSON, for scripts.
* ``GET /?controller=TaskViewController&action=show&task_id=T`` and
  ``…FileViewerController…&file_id=F`` are the task and attachment pages the links on
  cards open (Kanboard's own URLs: :mod:`fabric.apps.webpages`).

The page is a projection and nothing more: it has no forms, no scripts, and no GET
changes anything. It reads the board in process, through the board's own API on the
same store (no HTTP to itself), and parses what it reads with the fabric's parsers.
Every piece of task text is escaped: titles come from agents.
"""

from __future__ import annotations

import html
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fabric.apps.webpages import kanboard_page, turn
from fabric.embedded.local import LocalPort
from fabric.embedded.rpc import BoardApi
from fabric.errors import ConfigError
from fabric.kanboard.bootstrap import load_layout
from fabric.kanboard.layout import COLUMN_ORDER, Column, column_fits
from fabric.kanboard.taskboard import TaskBoard, TaskView
from fabric.kanboard.weblinks import links_for
from fabric.settings.resolve import Settings
from fabric.task import PRIORITY_NAMES, State

log = logging.getLogger("agap.board.view")

REFRESH_SECONDS = 5
HTML_TYPE = "text/html; charset=utf-8"
JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"
DEFAULT_SWIMLANE = "Default swimlane"

Response = tuple[int, str, bytes]


def age_text(seconds: float) -> str:
    """``42s``, ``7m``, ``3h``, ``2d``: the largest whole unit."""
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def _clock_text(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _e(value: Any) -> str:
    """Escape for HTML text and attribute values (quotes included)."""
    return html.escape("" if value is None else str(value), quote=True)


class WebView:
    """``view(path) -> (status, content type, body)``, for :meth:`EmbeddedBoard.set_view`."""

    def __init__(
        self,
        api: BoardApi,
        settings: Settings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        refresh_seconds: int = REFRESH_SECONDS,
    ) -> None:
        self.api = api
        self.settings = settings or Settings()
        self.clock = clock
        self.refresh_seconds = refresh_seconds

    def __call__(self, path: str) -> Response:
        parts = urlsplit(path)
        query = parse_qs(parts.query)
        include_closed = query.get("all", ["0"])[0] not in ("", "0", "false", "no")
        try:
            if parts.path in ("/", "/index.html") and "controller" in query:
                page = self.kanboard_page(query)
                if page is not None:
                    return page
            if parts.path in ("/", "/index.html"):
                snap = self.snapshot(include_closed=include_closed)
                return 200, HTML_TYPE, render_page(snap, self.refresh_seconds).encode()
            if parts.path == "/board.json":
                snap = self.snapshot(include_closed=include_closed)
                return 200, JSON_TYPE, json.dumps(snap, sort_keys=True).encode()
        except Exception:
            log.exception("board view failed")
            return 500, TEXT_TYPE, b"the board view failed; see the board's log\n"
        return 404, TEXT_TYPE, b"not found: the board view is at / (and /board.json)\n"

    def kanboard_page(self, query: dict[str, list[str]]) -> Response | None:
        """Kanboard's task or file page at its own URL (the links on cards), or None."""
        port = LocalPort(self.api)
        try:
            layout = load_layout(port, self.settings)
        except ConfigError:
            return None
        links = links_for(self.settings.board_url, self.settings.web_url)
        return kanboard_page(TaskBoard(port, layout, clock=self.clock, links=links), query)

    # -- reading -------------------------------------------------------------------------

    def snapshot(self, *, include_closed: bool = False) -> dict[str, Any]:
        """What the page shows, as plain data (also served as ``/board.json``)."""
        now = self.clock()
        port = LocalPort(self.api)  # one per request: requests are served on many threads
        try:
            layout = load_layout(port, self.settings)
        except ConfigError as exc:
            return {"initialised": False, "project": self.settings.project, "now": now, "problem": exc.what}
        board = TaskBoard(port, layout, clock=self.clock)
        rows, parks = board.search_with_parks("" if include_closed else "status:open")
        views = board.read_meta_many(rows)
        by_column_id = {cid: col for col, cid in layout.columns.items()}
        lanes = [name for name, _ in sorted(layout.swimlanes.items(), key=lambda kv: kv[1])]
        tasks = [self._card(v, by_column_id, layout.queue_of, now) for v in views]
        used = {t["queue"] for t in tasks}
        lanes = [q for q in lanes if q != DEFAULT_SWIMLANE or q in used]
        lanes += sorted(q for q in used if q not in lanes)
        order = {c.value: i for i, c in enumerate(COLUMN_ORDER)}
        tasks.sort(key=lambda t: (order.get(t["column"], 99), -t["priority"], t["id"]))
        parked = {q: p for q, p in sorted(parks.items()) if p.get("parked")}
        return {
            "initialised": True,
            "project": layout.project_name,
            "now": now,
            "columns": [c.value for c in COLUMN_ORDER],
            "queues": lanes,
            "parked": parked,
            "tasks": tasks,
            "include_closed": include_closed,
        }

    @staticmethod
    def _card(
        view: TaskView, by_column_id: dict[int, Column], queue_of: Callable[[int], str | None], now: float
    ) -> dict[str, Any]:
        row = view.task
        rec = view.current
        column = by_column_id.get(row.column_id)
        state = rec.state.value if rec else None
        owner = None
        if rec is not None:
            if rec.state == State.WORKING:
                owner = rec.owner
            elif rec.state == State.INPUT_REQUIRED and rec.assignee:
                owner = f"@{rec.assignee}"
            else:
                owner = rec.owner
        # A keeper's gate or decision card is queued for a person: it waits in their column;
        # a queued card may wait in Backlog (the keeper's overflow of a long queue).
        lagging = bool(column and rec and not column_fits(column, rec.state, rec.assignee))
        return {
            "id": view.id,
            "title": row.title,
            "queue": queue_of(row.swimlane_id) or row.swimlane_name or "?",
            "column": column.value if column else row.column_name or "?",
            "state": state,
            "epoch": view.epoch,
            "owner": owner,
            "by": rec.by if rec else None,
            "attempt": rec.attempt if rec else 0,
            "lease_left": (
                max(0.0, rec.lease_until - now)
                if rec and rec.state == State.WORKING and rec.lease_until
                else None
            ),
            "priority": row.priority,
            "age_seconds": max(0, int(now - (row.created_at or now))),
            "open": row.is_open,
            "result_ref": rec.result_ref if rec else None,
            "reason": rec.reason if rec else None,
            # A column that disagrees with the record: a person's move not acted on yet,
            # or a lagging projection (the keeper repairs both).
            "moved": lagging,
            "problems": list(view.problems),
            "turn": turn(view),  # whose turn it is: the question, the gate, the verifier
        }


# -- rendering ----------------------------------------------------------------------------

STYLE = """
:root { --bg:#f4f5f7; --ink:#172b4d; --muted:#5e6c84; --line:#dfe1e6; --card:#fff; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
       background:var(--bg); color:var(--ink); }
header { display:flex; align-items:baseline; gap:16px; padding:14px 20px; background:#253858;
         color:#fff; }
header h1 { margin:0; font-size:18px; font-weight:600; }
header .meta { color:#b3bac5; font-size:12px; }
header .counts { margin-left:auto; display:flex; gap:8px; }
.count { background:rgba(255,255,255,.12); border-radius:10px; padding:2px 9px; font-size:12px; }
.parked { margin:12px 20px 0; padding:10px 14px; border-radius:6px; background:#fff4e5;
          border:1px solid #ffab00; color:#7a4b00; }
.parked b { color:#5a3500; }
.parked ul { margin:4px 0 0; padding-left:18px; }
main { padding:12px 20px 20px; overflow-x:auto; }
table.board { border-collapse:separate; border-spacing:6px; width:100%; table-layout:fixed; }
th { text-align:left; font-size:12px; text-transform:uppercase; letter-spacing:.04em;
     color:var(--muted); padding:4px 8px; }
th.lane { width:150px; }
td { vertical-align:top; background:#ebecf0; border-radius:6px; padding:6px; min-height:40px; }
td.lane { background:transparent; padding:8px 4px; }
td.lane .name { font-weight:600; word-break:break-word; }
td.lane .sub { color:var(--muted); font-size:12px; }
.badge.lane-parked { background:#ff8b00; margin-left:4px; vertical-align:1px; }
tr.is-parked td { background:#fff7e6; }
.card { background:var(--card); border-radius:5px; padding:7px 9px; margin-bottom:6px;
        box-shadow:0 1px 1px rgba(9,30,66,.25); border-left:4px solid #97a0af; }
.card:last-child { margin-bottom:0; }
.card .top { display:flex; gap:6px; align-items:center; font-size:12px; color:var(--muted); }
.card .id { font-weight:600; color:var(--ink); }
.card .title { margin:3px 0 5px; word-break:break-word; }
.card .title a { color:var(--ink); text-decoration:none; } .card .title a:hover { text-decoration:underline; }
.card .turn { font-size:12px; color:#7a4b00; margin-bottom:3px; }
.card .facts { display:flex; flex-wrap:wrap; gap:4px 10px; font-size:12px; color:var(--muted); }
.badge { display:inline-block; border-radius:3px; padding:0 6px; font-size:11px; font-weight:600;
         text-transform:uppercase; letter-spacing:.03em; color:#fff; background:#97a0af; }
.badge.prio-urgent { background:#de350b; } .badge.prio-high { background:#ff8b00; }
.badge.prio-normal { background:#dfe1e6; color:#42526e; }
.badge.prio-low { background:#f4f5f7; color:#6b778c; }
.st-queued { border-left-color:#6554c0; } .badge.st-queued { background:#6554c0; }
.st-working { border-left-color:#0065ff; } .badge.st-working { background:#0065ff; }
.st-input_required { border-left-color:#ff991f; } .badge.st-input_required { background:#ff991f; }
.st-done { border-left-color:#36b37e; } .badge.st-done { background:#36b37e; }
.st-dead { border-left-color:#de350b; } .badge.st-dead { background:#de350b; }
.st-canceled { border-left-color:#97a0af; } .badge.st-canceled { background:#97a0af; }
.st-closed { border-left-color:#006644; } .badge.st-closed { background:#006644; }
.warn { color:#bf2600; font-size:12px; }
.empty { color:#a5adba; font-size:12px; text-align:center; padding:6px 0; }
footer { padding:0 20px 16px; color:var(--muted); font-size:12px; }
.notice { max-width:640px; margin:60px auto; background:#fff; padding:24px 28px; border-radius:8px;
          box-shadow:0 1px 3px rgba(9,30,66,.25); }
code { background:#f4f5f7; padding:1px 5px; border-radius:3px; }
"""


def _head(title: str, refresh: int) -> str:
    # No script may run on this page at all; styles are inline.
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src 'none'; form-action 'none'; base-uri 'none'\">"
        f'<meta http-equiv="refresh" content="{int(refresh)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{STYLE}</style></head>"
    )


def render_page(snap: dict[str, Any], refresh: int = REFRESH_SECONDS) -> str:
    """The whole HTML page for a :meth:`WebView.snapshot`."""
    if not snap.get("initialised"):
        return _not_initialised(snap, refresh)
    now = float(snap["now"])
    tasks: list[dict[str, Any]] = snap["tasks"]
    parked: dict[str, dict[str, Any]] = snap["parked"]
    states: dict[str, int] = {}
    for t in tasks:
        states[t["state"] or "unknown"] = states.get(t["state"] or "unknown", 0) + 1
    counts = (
        "".join(
            f'<span class="count">{_e(s.replace("_", " "))} {n}</span>' for s, n in sorted(states.items())
        )
        or '<span class="count">no open tasks</span>'
    )
    out = [
        _head(f"{snap['project']} — board", refresh),
        "<body>",
        f"<header><h1>{_e(snap['project'])}</h1>"
        f'<span class="meta">read-only view · updated {_e(_clock_text(now))}'
        f" · refreshes every {int(refresh)} s</span>"
        f'<span class="counts">{counts}</span>'
        "</header>",
    ]
    if parked:
        items = []
        for q, p in parked.items():
            until = p.get("until")
            when = ""
            if isinstance(until, int | float) and until:
                when = f" — until {_clock_text(float(until))} (in {age_text(float(until) - now)})"
            items.append(f"<li><b>{_e(q)}</b>: {_e(p.get('reason') or 'parked')}{_e(when)}</li>")
        out.append(
            '<div class="parked" role="status"><b>Parked queues</b> — work waits, '
            f"nothing fails:<ul>{''.join(items)}</ul></div>"
        )
    out.append('<main><table class="board"><thead><tr><th class="lane">Queue</th>')
    out.extend(f"<th>{_e(c)}</th>" for c in snap["columns"])
    out.append("</tr></thead><tbody>")
    for queue in snap["queues"]:
        mine = [t for t in tasks if t["queue"] == queue]
        cls = ' class="is-parked"' if queue in parked else ""
        sub = f"{len(mine)} task{'s' if len(mine) != 1 else ''}"
        badge = '<span class="badge lane-parked">parked</span>' if queue in parked else ""
        out.append(
            f'<tr{cls}><td class="lane"><div class="name">{_e(queue)}{badge}</div>'
            f'<div class="sub">{_e(sub)}</div></td>'
        )
        for column in snap["columns"]:
            cell = [t for t in mine if t["column"] == column]
            inner = "".join(_card_html(t) for t in cell) or '<div class="empty">—</div>'
            out.append(f"<td>{inner}</td>")
        out.append("</tr>")
    out.append("</tbody></table></main>")
    scope = "all tasks, closed included" if snap.get("include_closed") else "open tasks"
    out.append(
        f"<footer>Showing {_e(scope)}. The records are the truth; the column is their "
        "projection. This view is read-only: open a card for the <code>agap</code> commands "
        "that act on it (in Kanboard, its gestures).</footer>"
    )
    out.append("</body></html>")
    return "".join(out)


def _card_html(t: dict[str, Any]) -> str:
    state = t["state"] or "unknown"
    prio = PRIORITY_NAMES.get(int(t["priority"]), str(t["priority"]))
    facts = [f"<span>epoch {int(t['epoch'])}</span>"]
    if t["owner"]:
        facts.append(f"<span>owner {_e(t['owner'])}</span>")
    elif t["by"]:
        facts.append(f"<span>by {_e(t['by'])}</span>")
    facts.append(f"<span>age {_e(age_text(t['age_seconds']))}</span>")
    if t["lease_left"] is not None:
        facts.append(f"<span>lease {_e(age_text(t['lease_left']))} left</span>")
    if t["attempt"]:
        facts.append(f"<span>attempt {int(t['attempt'])}</span>")
    warn = ""
    if t["moved"]:
        warn += '<div class="warn">column differs from the record (moved by hand?)</div>'
    if t["problems"]:
        warn += f'<div class="warn">{_e("; ".join(t["problems"]))}</div>'
    if not t["open"]:
        facts.append("<span>closed</span>")
    return (
        f'<div class="card st-{_e(state)}" data-task="{int(t["id"])}">'
        f'<div class="top"><span class="id">#{int(t["id"])}</span>'
        f'<span class="badge st-{_e(state)}">{_e(state.replace("_", " "))}</span>'
        f'<span class="badge prio-{_e(prio)}">{_e(prio)}</span></div>'
        f'<div class="title"><a href="{_e(task_href(int(t["id"])))}">{_e(t["title"])}</a></div>'
        f'<div class="turn">{_e(t.get("turn") or "")}</div>'
        f'<div class="facts">{"".join(facts)}</div>{warn}</div>'
    )


def task_href(task_id: int) -> str:
    """The card's page, at Kanboard's own URL (served here by fabric.apps.webpages)."""
    return f"/?controller=TaskViewController&action=show&task_id={task_id}"


def _not_initialised(snap: dict[str, Any], refresh: int) -> str:
    return (
        _head("Agent fabric — not initialised", refresh)
        + '<body><div class="notice"><h2>The fabric is not set up on this board yet</h2>'
        f"<p>There is no project <b>{_e(snap.get('project'))}</b> here. Run "
        "<code>agap init</code> with <code>KANBOARD_URL</code> and "
        "<code>KANBOARD_API_TOKEN</code> pointing at this board (or start everything with "
        "<code>agap up</code>, which does it for you).</p>"
        f'<p class="warn">{_e(snap.get("problem"))}</p>'
        f"<p>This page checks again every {int(refresh)} seconds.</p></div></body></html>"
    )
