"""What one ``hindsight://`` read costs the worker: on the embedded stand-in and on a real
Hindsight, through the worker's own reader (:class:`workers.memory.HindsightRecall`: the
HTTP request, the JSON, the rendering), on a kept-alive connection.

Two reads a shipped schedule makes: a **recall** (``POST …/memories/recall``, a query that
matches a few of the bank's memories) and the **newest** memories (``GET …/memories/list``,
``newest=50``). The bank holds :data:`MEMORIES` memories, retained once before timing.

A real Hindsight only when ``AGAP_BENCH_HINDSIGHT_URL`` names one (``AGAP_BENCH_HINDSIGHT_KEY``
its key): the run retains :data:`MEMORIES` memories into a bank of its own
(``agap-bench-<run>``; each retain runs Hindsight's LLM once), and deletes the bank after.
Run alone: ``python -m bench.hindsight [--quick]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import time
from typing import Any

import requests

from bench.env import latency_ms
from fabric.embedded.hindsight import HindsightStandIn, Memory
from fabric.hindsight import HindsightClient, HindsightError
from workers.memory import HindsightRecall
from workers.refs import MAX_REF_BYTES, ReadScope

MEMORIES = 40
WORDS = ("boiler", "dentist", "garden", "piano", "train", "budget", "recycling", "plumber")
READS = {
    "recall (one query)": "hindsight://{bank}/when%20is%20the%20dentist?budget=low",
    "newest 50 (list API)": "hindsight://{bank}/?newest=50",
}


def _texts() -> list[str]:
    return [f"Note {i}: the {WORDS[i % len(WORDS)]} needs attention on day {i}." for i in range(MEMORIES)]


def run(quick: bool) -> dict[str, Any]:
    n = 10 if quick else 100
    targets: dict[str, dict[str, Any]] = {}
    with HindsightStandIn() as stand_in:
        bank = "agap-bench"
        for i, text in enumerate(_texts()):
            stand_in.add(bank, Memory(f"m{i}", text, "world", "bench", f"2026-12-01T{i % 24:02d}:00:00Z"))
        targets["stand-in (embedded)"] = _measure(stand_in.url, "", bank, n)
    url = os.environ.get("AGAP_BENCH_HINDSIGHT_URL", "").rstrip("/")
    if url:
        key = os.environ.get("AGAP_BENCH_HINDSIGHT_KEY", "")
        try:
            targets[f"real Hindsight ({url})"] = _real(url, key, n)
        except (HindsightError, requests.RequestException) as exc:  # away: the stand-in's figures stay
            targets[f"real Hindsight ({url})"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return _report(n, targets)


def _real(url: str, key: str, n: int) -> dict[str, Any]:
    bank = f"agap-bench-{secrets.token_hex(4)}"
    client = HindsightClient(url, key, timeout=120)
    t0 = time.perf_counter()
    try:
        for i, text in enumerate(_texts()):
            client.retain(bank, [{"content": text, "document_id": f"bench-{i}", "context": "bench"}])
        retain_s = (time.perf_counter() - t0) / MEMORIES
        out = _measure(url, key, bank, n)
        out["retain one memory (seconds, mean)"] = round(retain_s, 3)
        return out
    finally:
        with contextlib.suppress(requests.RequestException):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            requests.delete(f"{url}/v1/default/banks/{bank}", headers=headers, timeout=60)


def _measure(url: str, key: str, bank: str, n: int) -> dict[str, Any]:
    session = requests.Session()
    reader = HindsightRecall(url, key, session=session)
    scope = ReadScope(roots=(), max_bytes=MAX_REF_BYTES, timeout=60, guard=None)
    out: dict[str, Any] = {}
    try:
        for label, ref in READS.items():
            ref = ref.format(bank=bank)
            first = reader.read(ref, scope)  # warm: the connection, Hindsight's caches
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                reader.read(ref, scope)
                times.append(time.perf_counter() - t0)
            out[label] = {**latency_ms(times), "memories": max(0, len(first.splitlines()) - 1)}
    finally:
        session.close()
    return out


def _report(n: int, targets: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows: list[list[Any]] = [["reads per target and kind", n], ["memories in the bank", MEMORIES]]
    for label, reads in targets.items():
        if "error" in reads:
            rows.append([f"{label}: failed", reads["error"]])
            continue
        for kind, r in reads.items():
            if isinstance(r, dict):
                rows.append(
                    [
                        f"{label}: {kind}, median / p95 ms (memories)",
                        f"{r['median_ms']} / {r['p95_ms']} ({r['memories']})",
                    ]
                )
            else:
                rows.append([f"{label}: {kind}", r])
    return {
        "title": "One hindsight:// read through the worker's reader (loopback)",
        "rows": rows,
        "data": targets,
    }


__all__ = ["run"]

if __name__ == "__main__":
    result = run("--quick" in sys.argv)
    print(json.dumps(result["data"], indent=2))
    for row in result["rows"]:
        print(" | ".join(str(x) for x in row))
