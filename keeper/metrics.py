"""The keeper's metrics, served over HTTP for Zabbix (JSON) and Prometheus (text).

Values come from the keeper's last sweeps: a scrape never calls the board. The endpoint
binds to 127.0.0.1 by default and refuses to start without a bearer token
(``AGAP_KEEPER_METRICS_TOKEN``) unless an explicit allow-list of client addresses is set
(``AGAP_KEEPER_METRICS_ALLOW``). There is no unauthenticated listener.

* ``GET /metrics`` — Prometheus text format 0.0.4;
* ``GET /metrics.json`` — one JSON document for Zabbix's HTTP agent item (queues as a
  list, for low-level discovery).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fabric.errors import ConfigError
from fabric.kanboard.layout import META_CRON_PREFIX
from fabric.kanboard.rows import BoardTask
from fabric.kanboard.taskboard import TaskView
from fabric.task import State
from keeper.serving import BackgroundServer

log = logging.getLogger("agap.keeper.metrics")


@dataclass
class JobStats:
    runs_total: int = 0
    errors_total: int = 0
    skipped_total: int = 0
    last_run: float = 0.0
    last_success: float = 0.0
    last_error: str = ""
    last_duration: float = 0.0


@dataclass
class QueueStats:
    queue: str
    depth: int = 0  # queued tasks (waiting for a worker)
    oldest_age: float = 0.0  # seconds since the oldest queued task was submitted
    working: int = 0
    waiting: int = 0  # waiting on a human (gates and questions)
    dead_letters: int = 0
    parked: int = 0
    park_reason: str = ""
    park_until: float = 0.0
    park_since: float = 0.0
    park_overdue: float = 0.0  # seconds a parked queue is past its expected reset


@dataclass
class ModelStats:
    """A model endpoint's park, as the queues that call it published it."""

    model: str
    parked: int = 0
    park_reason: str = ""
    park_until: float = 0.0
    queues: list[str] = field(default_factory=list)  # the parked queues that name it


@dataclass
class Metrics:
    """Everything the endpoint serves; updated by the daemon, read by scrapes."""

    clock: Callable[[], float] = time.time
    board_up: int = 1
    board_errors_total: int = 0
    lease_expiries_total: int = 0
    dead_lettered_total: int = 0
    gaps_resolved_total: int = 0
    gestures_total: int = 0
    repairs_total: int = 0
    escalations_total: int = 0
    reminders_total: int = 0
    notifications_total: int = 0
    notification_failures_total: int = 0
    gc_removed_total: int = 0
    quota_slots_in_use: int = 0
    quota_slots_returned_total: int = 0
    corrupted_tasks: int = 0
    sweep_trips: int = 0
    sweep_seconds: float = 0.0
    active_tasks: int = 0
    jobs: dict[str, JobStats] = field(default_factory=dict)
    queues: dict[str, QueueStats] = field(default_factory=dict)
    models: dict[str, ModelStats] = field(default_factory=dict)
    schedules: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def job(self, name: str) -> JobStats:
        return self.jobs.setdefault(name, JobStats())

    def observe(
        self,
        queues: Iterable[str],
        views: Iterable[TaskView],
        dead_rows: Iterable[BoardTask],
        parks: dict[str, dict[str, Any]],
        queue_of: Callable[[BoardTask], str | None],
        now: float,
        models: Iterable[str] = (),
        backlog: Iterable[BoardTask] = (),
    ) -> None:
        """Rebuild the per-queue and per-model figures from a snapshot's views and rows
        (``backlog``: the rows of the cards waiting in Backlog, queued all)."""
        stats = {q: QueueStats(q) for q in queues}

        def cell(q: str | None) -> QueueStats | None:
            if not q:
                return None
            return stats.setdefault(q, QueueStats(q))

        active = 0
        for v in views:
            q = cell(v.spec.queue if v.spec is not None else queue_of(v.task))
            if q is not None and v.current is not None:
                active += 1
                _count(q, v, now)
        for r in dead_rows:
            d = cell(queue_of(r))
            if d is not None:
                d.dead_letters += 1
        _count_waiting(cell, queue_of, backlog, now)
        by_model = {m: ModelStats(m) for m in models}
        for name, st in parks.items():
            p = cell(name)
            if p is not None and st.get("parked"):
                _park(p, st, now)
                _model_parks(by_model, name, st)
        with self.lock:
            self.queues = stats
            self.models = by_model
            self.active_tasks = active

    def observe_schedules(self, project_meta: dict[str, str], now: float) -> None:
        """Cron schedules as the cron submitter published them (``fabric.cron.<name>``).

        ``missed`` counts the missed runs of a schedule that must not be missed: every one
        the submitter recorded on the board (it compares the schedule with the tasks made,
        after a restart too), plus one while its next planned time is past by more than its
        grace (the cron process itself is down; it records that run when it is back). It
        does not go back down when the schedule fires again: the fabric never re-fires a
        missed run, Zabbix raises each new one, and a person decides.
        """
        out = []
        for key, raw in sorted(project_meta.items()):
            if not key.startswith(META_CRON_PREFIX) or not raw:
                continue
            try:
                e = json.loads(raw)
            except ValueError:
                continue
            if isinstance(e, dict):
                out.append(_schedule(e, key[len(META_CRON_PREFIX) :], now))
        with self.lock:
            self.schedules = out

    # -- rendering -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        with self.lock:
            queues = [asdict(q) for q in sorted(self.queues.values(), key=lambda q: q.queue)]
            models = [asdict(m) for m in sorted(self.models.values(), key=lambda m: m.model)]
            jobs = {k: asdict(v) for k, v in sorted(self.jobs.items())}
            scalars = {k: getattr(self, k) for k in _SCALARS}
            schedules = [dict(x) for x in self.schedules]
        last = max((j["last_success"] for j in jobs.values()), default=0.0)
        return {
            "up": 1,
            "generated_at": self.clock(),
            "last_success": last,
            **scalars,
            "queued": sum(q["depth"] for q in queues),
            "working": sum(q["working"] for q in queues),
            "waiting_on_humans": sum(q["waiting"] for q in queues),
            "dead_letters": sum(q["dead_letters"] for q in queues),
            "parked_queues": sum(q["parked"] for q in queues),
            "parked_models": sum(m["parked"] for m in models),
            "models": models,
            "jobs": jobs,
            "job_list": [{"job": k, **v} for k, v in jobs.items()],
            "queues": queues,
            "schedules": schedules,
            "missed_schedules": sum(1 for x in schedules if x["missed"]),
        }

    def to_prometheus(self) -> str:
        data = self.to_json()
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lab = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
                lines.append(f"{name}{{{lab}}} {_fmt(value)}" if lab else f"{name} {_fmt(value)}")

        metric("keeper_up", "gauge", "1 while the keeper process runs.", [({}, 1)])
        metric(
            "keeper_board_up", "gauge", "0 after a job failed to reach the board.", [({}, data["board_up"])]
        )
        for name, kind, help_ in _PROM_SCALARS:
            metric(f"keeper_{name}", kind, help_, [({}, data[name])])
        jobs = data["jobs"]
        for key, kind, help_ in (
            ("last_success", "gauge", "Unix time of the job's last successful run."),
            ("runs_total", "counter", "Job runs."),
            ("errors_total", "counter", "Job runs that failed."),
            ("last_duration", "gauge", "Seconds the job's last run took."),
        ):
            name = "keeper_last_success_timestamp" if key == "last_success" else f"keeper_job_{key}"
            if key == "last_duration":
                name = "keeper_job_last_duration_seconds"
            metric(name, kind, help_, [({"job": j}, s[key]) for j, s in jobs.items()])
        queues = data["queues"]
        for key, name, help_ in (
            ("depth", "keeper_queue_depth", "Queued tasks waiting for a worker."),
            ("oldest_age", "keeper_queue_oldest_age_seconds", "Age of the oldest queued task."),
            ("working", "keeper_queue_working", "Tasks being worked on."),
            ("waiting", "keeper_queue_waiting_on_humans", "Tasks waiting on a human."),
            ("dead_letters", "keeper_queue_dead_letters", "Open dead letters."),
            (
                "park_overdue",
                "keeper_queue_park_overdue_seconds",
                "Seconds a parked queue is past its expected reset.",
            ),
        ):
            metric(name, "gauge", help_, [({"queue": q["queue"]}, q[key]) for q in queues])
        metric(
            "keeper_queue_parked",
            "gauge",
            "1 while the queue is parked (a(t)=0).",
            [({"queue": q["queue"], "reason": q["park_reason"]}, q["parked"]) for q in queues],
        )
        metric(
            "keeper_model_parked",
            "gauge",
            "1 while a queue calling the model endpoint parks for it (quota, budget, 429, node).",
            [({"model": m["model"], "reason": m["park_reason"]}, m["parked"]) for m in data["models"]],
        )
        metric(
            "keeper_queue_park_until_timestamp",
            "gauge",
            "When a parked queue expects to reset.",
            [({"queue": q["queue"]}, q["park_until"]) for q in queues if q["parked"]],
        )
        schedules = data["schedules"]
        for key, name, help_ in (
            (
                "missed",
                "keeper_cron_missed",
                "Missed runs of a schedule that must not be missed (recorded, plus one overdue now); "
                "never re-fired by the fabric.",
            ),
            ("last_missed", "keeper_cron_last_missed_timestamp", "The schedule's latest missed planned run."),
            ("last_planned", "keeper_cron_last_planned_timestamp", "The schedule's last planned firing."),
            ("last_fired", "keeper_cron_last_fired_timestamp", "The schedule's last actual firing."),
            ("next_planned", "keeper_cron_next_planned_timestamp", "The schedule's next planned firing."),
        ):
            metric(name, "gauge", help_, [({"schedule": x["schedule"]}, x[key]) for x in schedules])
        return "\n".join(lines) + "\n"


def _count_waiting(
    cell: Callable[[str | None], QueueStats | None],
    queue_of: Callable[[BoardTask], str | None],
    rows: Iterable[BoardTask],
    now: float,
) -> None:
    """Count the cards waiting in Backlog (queued, by their rows) in their queues' depth."""
    for r in rows:
        q = cell(queue_of(r))
        if q is not None:
            q.depth += 1
            q.oldest_age = max(q.oldest_age, now - float(r.created_at or now))


def _count(q: QueueStats, v: TaskView, now: float) -> None:
    """Count an active task in its queue's figures."""
    cur = v.current
    assert cur is not None
    if cur.state == State.QUEUED and cur.assignee:
        q.waiting += 1
    elif cur.state == State.QUEUED:
        q.depth += 1
        q.oldest_age = max(q.oldest_age, now - float(v.task.created_at or now))
    elif cur.state == State.WORKING:
        q.working += 1
    elif cur.state == State.INPUT_REQUIRED:
        q.waiting += 1


def _model_parks(by_model: dict[str, ModelStats], queue: str, st: dict[str, Any]) -> None:
    """The models a parked queue's state names (``models``, written by its worker)."""
    names = st.get("models")
    for m in names if isinstance(names, list) else []:
        ms = by_model.setdefault(str(m), ModelStats(str(m)))
        if not ms.parked:
            ms.parked, ms.park_reason, ms.park_until = 1, str(st.get("reason") or ""), _num(st.get("until"))
        ms.queues.append(queue)


def _park(p: QueueStats, st: dict[str, Any], now: float) -> None:
    """A parked queue's published state in its figures."""
    p.parked = 1
    p.park_reason = str(st.get("reason") or "")
    p.park_until = _num(st.get("until"))
    p.park_since = _num(st.get("since"))
    p.park_overdue = max(0.0, now - p.park_until) if p.park_until else 0.0


_SCALARS = (
    "board_up",
    "board_errors_total",
    "lease_expiries_total",
    "dead_lettered_total",
    "gaps_resolved_total",
    "gestures_total",
    "repairs_total",
    "escalations_total",
    "reminders_total",
    "notifications_total",
    "notification_failures_total",
    "gc_removed_total",
    "quota_slots_in_use",
    "quota_slots_returned_total",
    "corrupted_tasks",
    "sweep_trips",
    "sweep_seconds",
    "active_tasks",
)
_PROM_SCALARS = (
    ("board_errors_total", "counter", "Job runs that could not reach the board."),
    ("lease_expiries_total", "counter", "Expired leases requeued or dead-lettered."),
    ("dead_lettered_total", "counter", "Tasks the keeper moved to dead letter."),
    ("gaps_resolved_total", "counter", "Epoch gaps resolved."),
    ("gestures_total", "counter", "Human card moves acted on through the ledger."),
    ("repairs_total", "counter", "Lagging projections put back."),
    ("escalations_total", "counter", "Overdue tasks escalated to a human."),
    ("reminders_total", "counter", "Gate reminders sent."),
    ("notifications_total", "counter", "Notifications delivered."),
    ("notification_failures_total", "counter", "Notifications that could not be delivered."),
    ("gc_removed_total", "counter", "Lock tags garbage-collected."),
    (
        "quota_slots_in_use",
        "gauge",
        "Slots of quotas kept across hosts that hold a call, at the last lease sweep.",
    ),
    (
        "quota_slots_returned_total",
        "counter",
        "Slots of quotas kept across hosts given back because the lease holding them died.",
    ),
    ("corrupted_tasks", "gauge", "Tasks skipped in the last sweep for unreadable metadata."),
    ("sweep_trips", "gauge", "Board round trips of the last lease sweep."),
    ("sweep_seconds", "gauge", "Seconds the last lease sweep took."),
    ("active_tasks", "gauge", "Active tasks (queued, working, waiting) in the last sweep."),
)


def _schedule(e: dict[str, Any], name: str, now: float) -> dict[str, Any]:
    """One schedule's figures from its published record (see :meth:`Metrics.observe_schedules`)."""
    nxt, grace = _num(e.get("next_planned")), _num(e.get("grace")) or 60.0
    overdue = bool(nxt) and now > nxt + grace
    recorded = int(_num(e.get("missed")))
    must = bool(e.get("must_not_miss"))
    runs = [r for r in e.get("missed_runs") or [] if isinstance(r, list) and len(r) >= 3]
    return {
        "schedule": str(e.get("schedule") or name),
        "must_not_miss": int(must),
        "last_planned": _num(e.get("last_planned")),
        "last_fired": _num(e.get("last_actual")),
        "next_planned": nxt,
        "missed_total": recorded,
        "missed": recorded + int(overdue) if must else 0,
        "missed_capped": int(bool(e.get("missed_capped"))),
        "last_missed": _num(e.get("last_missed")),
        "missed_runs": [
            {
                "first": _iso(r[0]),
                "last": _iso(r[1]),
                "count": int(_num(r[2])),
                "capped": bool(r[3:4] == [True]),
            }
            for r in runs
        ],
    }


def _iso(ts: Any) -> str:
    return datetime.fromtimestamp(_num(ts), UTC).isoformat()


def _num(v: Any) -> float:
    try:
        return float(v or 0)
    except (TypeError, ValueError):
        return 0.0


def _fmt(v: float) -> str:
    f = float(v)
    return str(int(f)) if f.is_integer() else repr(f)


def _esc(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# -- the endpoint ------------------------------------------------------------------------------


class MetricsServer(BackgroundServer):
    """A small threaded HTTP server for :class:`Metrics` with bearer or allow-list auth."""

    thread_name = "keeper-metrics"

    def __init__(
        self,
        metrics: Metrics,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str = "",
        allow: Iterable[str] = (),
    ) -> None:
        allow = tuple(allow)
        if not token and not allow:
            raise ConfigError(
                "the metrics endpoint needs a token",
                where="AGAP_KEEPER_METRICS_TOKEN",
                hint="set AGAP_KEEPER_METRICS_TOKEN, or AGAP_KEEPER_METRICS_ALLOW "
                "to a list of client addresses",
            )
        try:
            nets = [ipaddress.ip_network(a, strict=False) for a in allow]
        except ValueError as exc:
            raise ConfigError(str(exc), where="AGAP_KEEPER_METRICS_ALLOW") from None
        self.metrics = metrics
        super().__init__(ThreadingHTTPServer((host, port), _handler(metrics, token, nets)))


def _handler(
    metrics: Metrics, token: str, nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network]
) -> type[BaseHTTPRequestHandler]:
    expected = f"Bearer {token}".encode() if token else b""

    class Handler(BaseHTTPRequestHandler):
        server_version = "agap-keeper"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("metrics %s: " + format, self.client_address[0], *args)

        def _allowed(self) -> bool:
            got = (self.headers.get("Authorization") or "").encode()
            return _authorised(got, str(self.client_address[0]), expected, nets)

        def do_GET(self) -> None:
            if not self._allowed():
                self._send(
                    401,
                    b'{"error": "unauthorized"}\n',
                    "application/json",
                    {"WWW-Authenticate": 'Bearer realm="agap-keeper"'},
                )
                return
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, metrics.to_prometheus().encode(), "text/plain; version=0.0.4")
            elif path == "/metrics.json":
                self._send(200, json.dumps(metrics.to_json(), sort_keys=True).encode(), "application/json")
            else:
                self._send(404, b'{"error": "not found"}\n', "application/json")

        def _send(self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

    return Handler


def _authorised(
    got: bytes, client: str, expected: bytes, nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network]
) -> bool:
    """The expected bearer token, or a client address in the allow-list."""
    if expected and hmac.compare_digest(got, expected):
        return True
    try:
        ip = ipaddress.ip_address(client)
    except ValueError:
        return False
    return any(ip in n for n in nets if n.version == ip.version)


__all__ = ["JobStats", "Metrics", "MetricsServer", "QueueStats"]
