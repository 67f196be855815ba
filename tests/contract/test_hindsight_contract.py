"""Hindsight's wire contract, as the fabric relies on it: one set of assertions, run
against every Hindsight.

``hindsight`` is parametrised over:

* ``stand-in``: :class:`fabric.embedded.hindsight.HindsightStandIn` (what ``agap up`` embeds
  and the tests use) on a loopback port, with a key: always;
* ``real``: a real Hindsight when ``AGAP_TEST_HINDSIGHT_URL`` names one (and
  ``AGAP_TEST_HINDSIGHT_TOKEN`` its ``HINDSIGHT_API_TENANT_API_KEY``, if it has one); skipped
  with the reason otherwise. ``AGAP_HINDSIGHT_URL`` is never read: a shell pointing at a
  household's memory sends no test there. docs/HINDSIGHT.md says how to run one.

Every test makes its own banks (a fresh uuid in the name) and retains what it recalls, so
the suite runs unchanged against a shared Hindsight. Retains go through Hindsight's LLM
(a loopback stand-in when run as docs/HINDSIGHT.md says), so the texts are chosen to come
back as they went in: one plain statement per item, with a rare word to find it by.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pytest
import requests
import yaml

from fabric.embedded.hindsight import HindsightStandIn
from fabric.hindsight import HindsightClient, HindsightRefused
from tests.conftest import ROOT
from workers.memory import HindsightRecall
from workers.refs import RefResolver

REAL_URL = "AGAP_TEST_HINDSIGHT_URL"
REAL_TOKEN = "AGAP_TEST_HINDSIGHT_TOKEN"
REAL_SKIP = (
    f"{REAL_URL} not set: name a scratch Hindsight with it (and {REAL_TOKEN}) to run the "
    "contract on a real one (docs/HINDSIGHT.md); AGAP_HINDSIGHT_URL is never used by a test"
)
TIMEOUT = 120  # a retain waits for Hindsight's LLM


@dataclass
class Hindsight:
    """One Hindsight under test: its URL, key and raw HTTP access."""

    kind: str
    url: str
    key: str

    def bank(self, stem: str = "agap-test") -> str:
        return f"{stem}-{uuid.uuid4().hex[:10]}"

    def http(self, method: str, bank: str, tail: str = "", *, key: str | None = None, **kw: Any) -> Any:
        path = f"{self.url}/v1/default/banks/{quote(bank, safe='')}" + (f"/{tail}" if tail else "")
        token = self.key if key is None else key
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.request(method, path, headers=headers, timeout=TIMEOUT, **kw)

    def retain(self, bank: str, *texts: str) -> None:
        items = [
            {"content": t, "context": "agap contract", "document_id": f"d{i}"} for i, t in enumerate(texts)
        ]
        resp = self.http("POST", bank, "memories", json={"items": items})
        assert resp.status_code == 200, resp.text

    def recall(self, bank: str, query: str, **body: Any) -> list[dict[str, Any]]:
        resp = self.http("POST", bank, "memories/recall", json={"query": query, **body})
        assert resp.status_code == 200, resp.text
        results = resp.json()["results"]
        assert isinstance(results, list)
        return results

    def client(self) -> HindsightClient:
        return HindsightClient(self.url, self.key, timeout=TIMEOUT)


@pytest.fixture(params=["stand-in", "real"])
def hindsight(request: pytest.FixtureRequest) -> Iterator[Hindsight]:
    if request.param == "real":
        url = os.environ.get(REAL_URL, "").rstrip("/")
        if not url:
            pytest.skip(REAL_SKIP)
        yield Hindsight("real", url, os.environ.get(REAL_TOKEN, ""))
        return
    with HindsightStandIn(api_key="contract-key") as stand_in:
        yield Hindsight("stand-in", stand_in.url, "contract-key")


def test_a_recall_that_matches_nothing_returns_no_memories(hindsight: Hindsight) -> None:
    bank = hindsight.bank()
    hindsight.retain(bank, "The zorbleflax kettle is kept in the attic.")
    assert any("zorbleflax" in r["text"] for r in hindsight.recall(bank, "zorbleflax"))
    # The queries the shipped schedules used to send: never "the newest" instead.
    for query in ("recent", "yesterday", "last six hours"):
        assert hindsight.recall(bank, query) == [], query


def test_bank_ids_are_case_sensitive_and_may_hold_double_colons(hindsight: Hindsight) -> None:
    bank = hindsight.bank("Agap-Upper")
    hindsight.retain(bank, "The quibbleware radiator upstairs leaks.")
    assert any("quibbleware" in r["text"] for r in hindsight.recall(bank, "quibbleware"))
    lower = hindsight.http("POST", bank.lower(), "memories/recall", json={"query": "quibbleware"})
    assert lower.status_code == 404
    assert lower.json() == {"detail": f"Bank '{bank.lower()}' not found"}
    colons = f"agap::telegram::{uuid.uuid4().hex[:10]}"  # Hindsight's OpenClaw plugin's naming
    hindsight.retain(colons, "The snorkelbatch boiler was serviced.")
    assert any("snorkelbatch" in r["text"] for r in hindsight.recall(colons, "snorkelbatch"))


def test_an_unknown_bank_is_a_404_for_recall_list_and_consolidate(hindsight: Hindsight) -> None:
    bank = hindsight.bank("nobody")
    expected = {"detail": f"Bank '{bank}' not found"}
    for method, tail, kw in (
        ("POST", "memories/recall", {"json": {"query": "anything"}}),
        ("GET", "memories/list", {}),
        ("POST", "consolidate", {"json": {}}),
    ):
        resp = hindsight.http(method, bank, tail, **kw)
        assert (resp.status_code, resp.json()) == (404, expected), tail


def test_a_retain_makes_its_bank(hindsight: Hindsight) -> None:
    bank = hindsight.bank("fresh")
    hindsight.retain(bank, "The wibbleton recycling goes out on Tuesday.")
    assert hindsight.http("GET", bank, "memories/list").status_code == 200


def test_a_document_retained_again_replaces_its_memories(hindsight: Hindsight) -> None:
    bank = hindsight.bank()
    for text in ("The first gizmoplank report.", "The second gizmoplank report."):
        resp = hindsight.http(
            "POST", bank, "memories", json={"items": [{"content": text, "document_id": "agap-task-1"}]}
        )
        assert resp.status_code == 200, resp.text
    listed = hindsight.http("GET", bank, "memories/list").json()
    assert [i["text"] for i in listed["items"]] == ["The second gizmoplank report."]


def test_a_query_without_a_word_character_is_a_422(hindsight: Hindsight) -> None:
    bank = hindsight.bank()
    hindsight.retain(bank, "The flumph garden gate squeaks.")
    for query in ("???", "", "  ", "!?-"):
        resp = hindsight.http("POST", bank, "memories/recall", json={"query": query})
        assert resp.status_code == 422, query
        (err,) = resp.json()["detail"]
        assert err["loc"] == ["body", "query"] and "word character" in err["msg"]


def test_bad_fields_are_refused_with_fastapis_shapes(hindsight: Hindsight) -> None:
    bank = hindsight.bank()
    hindsight.retain(bank, "The grommetvale shed is locked.")
    budget = hindsight.http("POST", bank, "memories/recall", json={"query": "shed", "budget": "huge"})
    assert budget.status_code == 422 and budget.json()["detail"][0]["loc"] == ["body", "budget"]
    types = hindsight.http("POST", bank, "memories/recall", json={"query": "shed", "types": ["bogus"]})
    assert types.status_code == 422 and types.json()["detail"].startswith("Invalid fact type(s): bogus")
    stamp = hindsight.http("POST", bank, "memories/recall", json={"query": "shed", "query_timestamp": "soon"})
    assert stamp.status_code == 400 and stamp.json()["detail"].startswith("Invalid query_timestamp format")
    missing = hindsight.http("POST", bank, "memories/recall", json={"budget": "low"})
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["body", "query"]


def test_the_fields_the_refs_send_are_accepted(hindsight: Hindsight) -> None:
    bank = hindsight.bank()
    hindsight.retain(bank, "The plinketty dentist moved to Monday.")
    body = {
        "budget": "low",
        "max_tokens": 1200,
        "types": ["world", "experience"],
        "query_timestamp": "2026-12-02T03:00:00Z",
        "temporal_window": {"start": "2026-12-01T21:00:00Z", "end": "2026-12-02T03:00:00Z"},
    }
    found = hindsight.recall(bank, "plinketty", **body)
    assert any("plinketty" in r["text"] for r in found)
    assert all(r["type"] in ("world", "experience") for r in found)
    assert hindsight.recall(bank, "plinketty", types=["observation"]) == [] or all(
        r["type"] == "observation" for r in hindsight.recall(bank, "plinketty", types=["observation"])
    )


def test_the_list_api_gives_the_newest_first(hindsight: Hindsight) -> None:
    bank = hindsight.bank()
    items = [
        {"content": "The old quarnish clock was repaired.", "timestamp": "2026-11-01T08:00:00Z"},
        {"content": "The new quarnish lamp was delivered.", "timestamp": "2026-12-01T08:00:00Z"},
    ]
    assert hindsight.http("POST", bank, "memories", json={"items": items}).status_code == 200
    resp = hindsight.http("GET", bank, "memories/list", params={"limit": 10})
    assert resp.status_code == 200
    listed = resp.json()
    assert {"items", "total", "limit", "offset"} <= set(listed)
    texts = [i["text"] for i in listed["items"]]
    assert "lamp" in texts[0] and any("clock" in t for t in texts[1:]), texts
    assert all({"fact_type", "mentioned_at", "text"} <= set(i) for i in listed["items"])
    dates = [i["mentioned_at"] for i in listed["items"]]
    assert dates[0].startswith("2026-12-01T08:00:00")
    typed = hindsight.http("GET", bank, "memories/list", params={"type": "observation", "limit": 10})
    assert typed.status_code == 200 and all(i["fact_type"] == "observation" for i in typed.json()["items"])


def test_refused_credentials_are_a_401_with_hindsights_body(hindsight: Hindsight) -> None:
    if not hindsight.key:
        pytest.skip(f"{REAL_TOKEN} not set: this Hindsight's authentication is not under test")
    bank = hindsight.bank()
    for key in ("wrong-key", ""):
        resp = hindsight.http("POST", bank, "memories/recall", key=key, json={"query": "anything"})
        assert resp.status_code == 401
        assert resp.json() == {"detail": "Authentication failed: Invalid API key"}


def test_reflect_and_consolidate_answer(hindsight: Hindsight) -> None:
    bank = hindsight.bank()
    hindsight.retain(bank, "The vorpalink piano lesson moved to Thursday.")
    reflect = hindsight.http("POST", bank, "reflect", json={"query": "When is the vorpalink piano lesson?"})
    assert reflect.status_code == 200, reflect.text
    assert isinstance(reflect.json()["text"], str) and reflect.json()["text"]
    consolidate = hindsight.http("POST", bank, "consolidate", json={})
    assert consolidate.status_code == 200, consolidate.text
    assert isinstance(consolidate.json()["operation_id"], str)


def test_the_fabrics_client_reads_what_each_answers(hindsight: Hindsight) -> None:
    client = hindsight.client()
    bank = hindsight.bank("Client::Bank")
    assert client.retain(bank, [{"content": "The jabberwick bins go out on Friday."}])["success"] is True
    assert any("jabberwick" in r["text"] for r in client.recall(bank, {"query": "jabberwick"}))
    assert client.recall(bank, {"query": "recent"}) == []
    assert any("jabberwick" in m["text"] for m in client.list_memories(bank, limit=5))
    with pytest.raises(HindsightRefused, match="no bank") as missing:
        client.recall(bank.lower(), {"query": "jabberwick"})
    assert missing.value.status == 404
    with pytest.raises(HindsightRefused, match="word character") as no_word:
        client.recall(bank, {"query": "?!"})
    assert no_word.value.status == 422


def reader(hindsight: Hindsight) -> Any:
    """The worker's resolver of ``hindsight://`` refs, pointed at this Hindsight."""
    return RefResolver(
        schemes={"hindsight": HindsightRecall(hindsight.url, hindsight.key)}, http_timeout=TIMEOUT
    ).resolve


def shipped_refs(name: str) -> list[str]:
    schedules = yaml.safe_load((ROOT / "schedules.example.yaml").read_text())["schedules"]
    (schedule,) = [s for s in schedules if s["name"] == name]
    return list(schedule["refs"])


@pytest.mark.parametrize("name", ["reflect", "consolidation"])
def test_the_shipped_schedules_refs_find_a_banks_recent_memories(hindsight: Hindsight, name: str) -> None:
    # The queries they used to send ("recent", "repeated or contradicting memories") found
    # nothing on a real bank; what they send now must find the last hours' memories.
    bank = hindsight.bank("Adolf::sched")
    stamp = datetime.fromtimestamp(time.time() - 3600, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = datetime.fromtimestamp(time.time() - 9 * 86400, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    items = [
        {"content": "The frabjous boiler was bled this morning.", "timestamp": stamp, "document_id": "new"},
        {"content": "The tulgey hedge was trimmed long ago.", "timestamp": old, "document_id": "old"},
    ]
    assert hindsight.http("POST", bank, "memories", json={"items": items}).status_code == 200
    resolve = reader(hindsight)
    texts = []
    for ref in shipped_refs(name):
        assert ref.startswith("hindsight://adolf-alvis/"), ref
        texts.append(resolve(ref.replace("adolf-alvis", bank, 1)) or "")
    text = "\n".join(texts)
    assert "frabjous boiler" in text, text
    assert "tulgey" not in text, text  # outside the schedule's window


def test_a_reflect_ref_gets_hindsights_own_answer(hindsight: Hindsight) -> None:
    bank = hindsight.bank()
    hindsight.retain(bank, "The mimsy piano lesson moved to Thursday.")
    resolve = reader(hindsight)
    text = (
        resolve(f"hindsight://{bank}/When%20is%20the%20mimsy%20piano%20lesson%3F?via=reflect&budget=low")
        or ""
    )
    assert text.startswith(f"Hindsight bank {bank}, reflect 'When is the mimsy piano lesson?':"), text
    assert len(text.splitlines()) >= 2


def test_a_reflect_on_an_unknown_bank_makes_the_bank_so_the_client_lists_first(hindsight: Hindsight) -> None:
    # Hindsight 1.1.0 answers a reflect on a bank it does not know with 200, having made the
    # bank and run its LLM on nothing. The fabric's client asks the list API (no LLM) first.
    bank = hindsight.bank("ghost")
    with pytest.raises(HindsightRefused, match="no bank") as missing:
        hindsight.client().reflect(bank, {"query": "Where is the kettle?", "budget": "low"})
    assert missing.value.status == 404
    assert hindsight.http("GET", bank, "memories/list").status_code == 404  # the client made none
    raw = hindsight.http("POST", bank, "reflect", json={"query": "Where is the kettle?", "budget": "low"})
    assert raw.status_code == 200, raw.text
    listed = hindsight.http("GET", bank, "memories/list")
    assert listed.status_code == 200 and listed.json()["items"] == []


def test_a_wrong_base_url_is_fastapis_not_found_not_a_missing_bank(hindsight: Hindsight) -> None:
    bank = hindsight.bank()
    headers = {"Authorization": f"Bearer {hindsight.key}"} if hindsight.key else {}
    wrong = f"{hindsight.url}/hindsight"
    resp = requests.post(
        f"{wrong}/v1/default/banks/{bank}/memories",
        json={"items": [{"content": "The wrongway kettle."}]},
        headers=headers,
        timeout=TIMEOUT,
    )
    assert (resp.status_code, resp.json()) == (404, {"detail": "Not Found"})
    with pytest.raises(HindsightRefused, match="no Hindsight API at this URL") as err:
        HindsightClient(wrong, hindsight.key, timeout=TIMEOUT).retain(bank, [{"content": "The x."}])
    assert "no bank" not in err.value.line() and len(err.value.line().splitlines()) == 1
    assert hindsight.http("GET", bank, "memories/list").status_code == 404


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"content": ""}, "content"),
        ({"content": " \n "}, "content"),
        ({"content": "The snickersnee clock.", "timestamp": "soon"}, "timestamp"),
        ({"content": "The snickersnee clock.", "timestamp": "9999-12-31T00:00:00Z"}, "timestamp"),
        ({"content": "The snickersnee clock.", "context": 5}, "context"),
        ({"content": "The snickersnee clock.", "document_id": 5}, "document_id"),
    ],
)
def test_a_retain_item_hindsight_refuses_is_a_422_and_makes_nothing(
    hindsight: Hindsight, item: dict[str, Any], field: str
) -> None:
    bank = hindsight.bank()
    resp = hindsight.http("POST", bank, "memories", json={"items": [item]})
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"][0]["loc"][:4] == ["body", "items", 0, field]
    assert hindsight.http("GET", bank, "memories/list").status_code == 404  # no bank made
    with pytest.raises(HindsightRefused, match=r"HTTP 422\): items\.0\.") as err:
        hindsight.client().retain(bank, [item])
    assert len(err.value.line().splitlines()) == 1
