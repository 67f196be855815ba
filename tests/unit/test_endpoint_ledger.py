"""One a(t) per model endpoint: admitted calls never exceed a quota, whoever calls."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from fabric.availability import Availability, Verdict
from fabric.cards import CardSet, load_cards
from tests.conftest import ROOT
from workers.admission import Admitted, admit_call
from workers.endpoint import SharedShape, endpoint_card
from workers.probes import Probes, card_availability
from workers.quota import QuotaWindow

NOW = 1_800_000_000.0


def shared_quota(path: Path, limit: int = 3, reserve_interactive: float = 0.0) -> Availability:
    quota = QuotaWindow(limit, 3600, reserve_interactive=reserve_interactive)
    return Availability([SharedShape(quota, path)])


def test_eight_threads_racing_for_three_calls_get_exactly_three(tmp_path: Path) -> None:
    av = shared_quota(tmp_path / "m.quota0.json")
    barrier = threading.Barrier(8)
    admitted: list[bool] = []

    def race() -> None:
        barrier.wait(10)
        admitted.append(av.admit(NOW).available)

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(admitted) == [False] * 5 + [True] * 3
    assert len(json.loads((tmp_path / "m.quota0.json").read_text())["calls"]) == 3


_RACER = """
import sys, threading
from pathlib import Path
from fabric.availability import Availability
from workers.endpoint import SharedShape
from workers.quota import QuotaWindow
av = Availability([SharedShape(QuotaWindow(40, 3600), Path(sys.argv[1]))])
print("ready", flush=True)
sys.stdin.readline()  # every process starts racing when the test says go
won = []
def race():
    while av.admit(1_800_000_000.0).available:
        won.append(1)
ts = [threading.Thread(target=race) for _ in range(4)]
[t.start() for t in ts]
[t.join(60) for t in ts]
print(len(won), flush=True)
"""


def test_four_processes_of_four_slots_share_one_quota(tmp_path: Path) -> None:
    path = tmp_path / "m.quota0.json"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(path)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for p in procs:  # blocks until each has built its ledger and waits for go
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.close()
    won = []
    for p in procs:
        assert p.stdout is not None and p.wait(120) == 0
        won.append(int(p.stdout.read().strip()))
    assert sum(won) == 40, won
    assert len(json.loads(path.read_text())["calls"]) == 40


def test_a_refund_gives_the_slot_back_and_a_settle_keeps_it(tmp_path: Path) -> None:
    av = shared_quota(tmp_path / "m.json", limit=1)
    assert av.admit(NOW).available
    assert not av.admit(NOW + 1).available
    av.refund(NOW)  # a 429: the provider never ran it
    assert av.admit(NOW + 2).available
    av.settle(NOW + 3, cost_usd=0.01)  # it ran: the slot stays spent
    verdict = av.check(NOW + 4)
    assert not verdict.available and "quota spent: 1 of 1" in verdict.reason


def test_the_file_is_the_state_across_restarts_and_bad_files_start_fresh(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    assert shared_quota(path, limit=2).admit(NOW).available
    again = shared_quota(path, limit=2)  # a new process
    assert again.admit(NOW + 1).available and not again.admit(NOW + 2).available
    path.write_text("{not json")
    assert shared_quota(path, limit=2).admit(NOW + 3).available
    # A worker's own snapshot no longer carries the shared counters (the file does).
    assert again.snapshot()["shapes"][0]["state"] == {}


def test_the_interactive_reserve_is_shared_too(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    background = shared_quota(path, limit=4, reserve_interactive=0.5)
    interactive = shared_quota(path, limit=4, reserve_interactive=0.5)
    assert background.admit(NOW).available and background.admit(NOW).available
    refused = background.admit(NOW)
    assert not refused.available and refused.reason.startswith("reserved for interactive work")
    assert interactive.admit(NOW, interactive=True).available


def _cards() -> CardSet:
    return load_cards(ROOT / "cards", base_dir=ROOT)


def test_a_persona_spends_the_quota_of_the_model_card_serving_its_backbone(tmp_path: Path) -> None:
    cards = _cards()
    adolf, kimi = cards.get("adolf"), cards.get("kimi")
    assert endpoint_card(adolf, cards) is kimi
    for_adolf = card_availability(adolf, cards=cards, ledger_dir=tmp_path)
    for_kimi = card_availability(kimi, cards=cards, ledger_dir=tmp_path)
    for i in range(60):  # kimi's 60 per 5 hours, all spent by the interactive persona
        admitted = admit_call(for_adolf, NOW + i, interactive=True)
        assert isinstance(admitted, Admitted) and admitted.card(adolf).runtime.model == "openai/kimi-k2", i
    refused = admit_call(for_adolf, NOW + 60, interactive=True)
    assert isinstance(refused, Verdict) and refused.reason.startswith("every backbone is parked: kimi:")
    verdict = for_kimi.check(NOW + 61, interactive=True)
    assert not verdict.available and "quota spent: 60 of 60" in verdict.reason


def test_a_429_on_one_caller_parks_the_model_for_every_caller(tmp_path: Path) -> None:
    cards = _cards()
    for_adolf = card_availability(cards.get("adolf"), cards=cards, ledger_dir=tmp_path)
    for_kimi = card_availability(cards.get("kimi"), cards=cards, ledger_dir=tmp_path)
    for_kimi.on_rate_limited(NOW, retry_after=30)
    verdict = for_adolf.check(NOW + 1, interactive=True)
    assert not verdict.available and verdict.until == NOW + 30


def test_without_a_ledger_dir_counters_stay_in_the_process(tmp_path: Path) -> None:
    cards = _cards()
    local = card_availability(cards.get("kimi"))
    assert not any(isinstance(s, SharedShape) for s in local.shapes)
    assert list(tmp_path.iterdir()) == []


def test_a_persona_on_a_sleeping_node_wakes_it_itself(tmp_path: Path) -> None:
    """torgash's backbone is qwen-remote's node: torgash's queue probes and wakes it."""
    cards = _cards()
    probed: list[str] = []
    woken: list[bool] = []

    def health(url: str, timeout: float) -> tuple[bool, str]:
        probed.append(url)
        return False, "connection refused"

    probes = Probes(health=health, wake=lambda: woken.append(True))
    for_torgash = card_availability(cards.get("torgash"), probes=probes, cards=cards, ledger_dir=tmp_path)
    verdict = for_torgash.check(NOW)
    assert probed == [cards.get("qwen-remote").availability[0].health_url]  # type: ignore[union-attr]
    assert woken == [True]
    # kimi fits torgash's constraints too, so torgash is not parked while kimi is free.
    assert verdict.available
