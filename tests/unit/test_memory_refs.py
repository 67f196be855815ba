"""``hindsight://`` refs against the Hindsight stand-in, over loopback HTTP: the request
Hindsight's API gets, the text the prompt gets, and every failure typed."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from tests.fakes.hindsight_stub import HindsightStub, Memory
from workers.memory import HindsightRecall, parse_recall
from workers.refs import MAX_REF_BYTES, RefResolver, RefUnavailable, UnresolvableRef
from workers.stores import store_readers

FACTS = [
    Memory("m1", "Alvis booked the dentist for Monday.", "experience", "calendar", "2026-11-30T18:00:00Z"),
    Memory("m2", "The boiler service is due in January.", "world", "house", "2026-11-20T08:00:00Z"),
]


@pytest.fixture
def stub() -> Iterator[HindsightStub]:
    with HindsightStub({"adolf-alvis": list(FACTS)}, api_key="hs-key-1") as s:
        yield s


def resolver(url: str, key: str = "hs-key-1") -> RefResolver:
    return RefResolver(schemes={"hindsight": HindsightRecall(url, key)}, http_timeout=5)


def test_a_recall_posts_hindsights_request_and_renders_the_results(stub: HindsightStub) -> None:
    text = resolver(stub.url).resolve(
        "hindsight://adolf-alvis/when%20is%20the%20dentist?budget=low&max_tokens=1200"
    )
    assert stub.recalls == [{"query": "when is the dentist", "budget": "low", "max_tokens": 1200}]
    call = stub.requests[-1]
    assert call.path == "/v1/default/banks/adolf-alvis/memories/recall"
    assert call.authorization == "Bearer hs-key-1"
    assert text is not None
    assert text.splitlines()[0] == "Hindsight bank adolf-alvis, recall 'when is the dentist': 1 memory"
    assert "- Alvis booked the dentist for Monday. [experience; calendar; 2026-11-30T18:00:00Z]" in text
    assert "boiler" not in text


def test_defaults_and_no_key_send_no_authorization() -> None:
    with HindsightStub({"b": list(FACTS)}) as open_stub:
        text = resolver(open_stub.url, key="").resolve("hindsight://b/anything")
        assert open_stub.requests[-1].authorization is None
        assert open_stub.recalls == [{"query": "anything", "budget": "mid", "max_tokens": 4096}]
        # Nothing matched: no memories, as Hindsight answers (never "the newest" instead).
        assert text == "Hindsight bank b, recall 'anything': 0 memories\n"


def test_the_bank_is_the_host_as_written_case_and_all() -> None:
    assert parse_recall("HINDSIGHT://Adolf-Alvis/x").bank == "Adolf-Alvis"  # ids are case-sensitive
    assert parse_recall("hindsight://adolf%2Dalvis/a%2Fb").bank == "adolf-alvis"
    assert parse_recall("hindsight://adolf%2Dalvis/a%2Fb").query == "a/b"
    assert parse_recall("hindsight://adolf::telegram::ada/q").bank == "adolf::telegram::ada"
    assert parse_recall("hindsight://adolf%3A%3Atg%3A%3Aada/q").bank == "adolf::tg::ada"


def test_a_bank_is_looked_up_as_written(stub: HindsightStub) -> None:
    stub.add("Adolf-Upper", Memory("u1", "The upper floor's radiator leaks.", "world"))
    stub.add("adolf::tg::ada", Memory("t1", "Ada's radiator is fine.", "world"))
    text = resolver(stub.url).resolve("hindsight://Adolf-Upper/radiator")
    assert stub.requests[-1].path == "/v1/default/banks/Adolf-Upper/memories/recall"
    assert text is not None and "upper floor" in text and "Ada" not in text
    with pytest.raises(UnresolvableRef, match="no bank 'adolf-upper'"):
        resolver(stub.url).resolve("hindsight://adolf-upper/radiator")
    text = resolver(stub.url).resolve("hindsight://adolf::tg::ada/radiator")
    assert stub.requests[-1].path == "/v1/default/banks/adolf%3A%3Atg%3A%3Aada/memories/recall"
    assert text is not None and "Ada's radiator" in text


def test_time_windows_and_types_become_hindsights_own_fields(stub: HindsightStub) -> None:
    clock = 1_764_640_800.0  # 2025-12-02T02:00:00Z
    reader = HindsightRecall(stub.url, "hs-key-1", clock=lambda: clock)
    text = RefResolver(schemes={"hindsight": reader}).resolve(
        "hindsight://adolf-alvis/dentist?types=experience,world&since=6h&budget=low"
    )
    assert stub.recalls[-1] == {
        "query": "dentist",
        "budget": "low",
        "max_tokens": 4096,
        "types": ["experience", "world"],
        "query_timestamp": "2025-12-02T02:00:00Z",
        "temporal_window": {"start": "2025-12-01T20:00:00Z", "end": "2025-12-02T02:00:00Z"},
    }
    assert text is not None and "(types experience,world; since 6h ago): 1 memory" in text
    RefResolver(schemes={"hindsight": reader}).resolve("hindsight://adolf-alvis/dentist?types=world")
    assert stub.recalls[-1]["types"] == ["world"]  # the dentist is an experience: not asked for
    assert "0 memories" in (
        RefResolver(schemes={"hindsight": reader}).resolve("hindsight://adolf-alvis/dentist?types=world")
        or ""
    )


def test_newest_lists_the_bank_newest_first_through_the_list_api(stub: HindsightStub) -> None:
    now = datetime(2026, 12, 1, 1, 0, tzinfo=UTC).timestamp()
    stub.add(
        "adolf-alvis", Memory("m3", "The plumber comes on Friday.", "world", "house", "2026-12-01T00:30:00Z")
    )
    reader = HindsightRecall(stub.url, "hs-key-1", clock=lambda: now)
    resolve = RefResolver(schemes={"hindsight": reader}).resolve
    text = resolve("hindsight://adolf-alvis/?newest=2") or ""
    listed = [r for r in stub.requests if "/memories/list" in r.path]
    assert (
        listed[-1].method == "GET"
        and listed[-1].path == "/v1/default/banks/adolf-alvis/memories/list?limit=2"
    )
    lines = text.splitlines()
    assert lines[0] == "Hindsight bank adolf-alvis, the newest 2: 2 memories"
    assert "plumber" in lines[1] and "dentist" in lines[2]  # newest first
    text = resolve("hindsight://adolf-alvis/?newest=10&since=6h") or ""
    assert "plumber" in text and "dentist" not in text and "boiler" not in text  # only the window
    text = resolve("hindsight://adolf-alvis/?newest=10&types=world") or ""
    assert "dentist" not in text and "boiler" in text and "plumber" in text
    assert "type=world" in stub.requests[-1].path


def test_via_reflect_asks_hindsights_reflect(stub: HindsightStub) -> None:
    text = resolver(stub.url).resolve(
        "hindsight://adolf-alvis/when%20is%20the%20dentist?via=reflect&budget=low"
    )
    (call,) = [r for r in stub.requests if r.path.endswith("/reflect")]
    assert call.body == {"query": "when is the dentist", "budget": "low", "max_tokens": 4096}
    assert text is not None and text.startswith("Hindsight bank adolf-alvis, reflect 'when is the dentist':")
    assert "dentist for Monday" in text


def test_a_failed_reflect_is_not_retried_where_its_llm_may_have_run(stub: HindsightStub) -> None:
    stub.fail_next(1, 500, on="/reflect")
    with pytest.raises(UnresolvableRef):  # final: a retry would spend Hindsight's LLM quota again
        resolver(stub.url).resolve("hindsight://adolf-alvis/dentist?via=reflect")
    stub.fail_next(1, 429, on="/reflect")
    with pytest.raises(RefUnavailable):  # a 429 spent nothing: a later attempt may
        resolver(stub.url).resolve("hindsight://adolf-alvis/dentist?via=reflect")
    # The listing a reflect asks first runs no LLM: its 500 is retried, and no reflect went out.
    reflects = len([r for r in stub.requests if r.path.endswith("/reflect")])
    stub.fail_next(1, 500, on="/memories/list")
    with pytest.raises(RefUnavailable):
        resolver(stub.url).resolve("hindsight://adolf-alvis/dentist?via=reflect")
    assert len([r for r in stub.requests if r.path.endswith("/reflect")]) == reflects


def test_a_reflect_on_an_unknown_bank_is_unresolvable_and_makes_no_bank(stub: HindsightStub) -> None:
    # Hindsight would make the bank and answer from nothing: the reader asks the list first.
    with pytest.raises(UnresolvableRef, match="no bank 'adolf-archive'"):
        resolver(stub.url).resolve("hindsight://adolf-archive/dentist?via=reflect")
    assert "adolf-archive" not in stub.banks
    assert not [r for r in stub.requests if r.path.endswith("/reflect")]


def test_a_query_without_a_word_character_is_refused_by_hindsight(stub: HindsightStub) -> None:
    with pytest.raises(UnresolvableRef, match=r"HTTP 422.*word character"):
        resolver(stub.url).resolve("hindsight://adolf-alvis/%3F%3F%3F")


@pytest.mark.parametrize(
    "ref",
    [
        "hindsight://adolf-alvis/",  # no query
        "hindsight:///query",  # no bank
        "hindsight://adolf-alvis%2F..%2Fother/q",  # a path in the bank
        "hindsight://a..b/q",
        "hindsight://x@adolf-alvis/q",
        "hindsight://adolf-alvis:8888/q",  # one colon: a port, not a part
        "hindsight://adolf:::x/q",
        "hindsight://::adolf/q",
        "hindsight://adolf-alvis/?newest=0",
        "hindsight://adolf-alvis/q?newest=5",  # a listing takes no query
        "hindsight://adolf-alvis/q?types=world,bogus",
        "hindsight://adolf-alvis/q?types=world,world",
        "hindsight://adolf-alvis/q?since=soon",
        "hindsight://adolf-alvis/q?since=6h&since=1h",
        "hindsight://adolf-alvis/q?via=magic",
        "hindsight://adolf-alvis/q?via=reflect&types=world",
        "hindsight://adolf-alvis/q?tags=x",
        "hindsight://adolf-alvis/q?budget=huge",
        "hindsight://adolf-alvis/q?max_tokens=0",
        "hindsight://adolf-alvis/q?max_tokens=99999",
        "hindsight://adolf-alvis/q#frag",
    ],
)
def test_malformed_refs_are_unresolvable(ref: str) -> None:
    with pytest.raises(UnresolvableRef):
        parse_recall(ref)


def test_an_unknown_bank_is_unresolvable(stub: HindsightStub) -> None:
    with pytest.raises(UnresolvableRef, match="no bank 'nobody'"):
        resolver(stub.url).resolve("hindsight://nobody/q")


def test_a_wrong_key_is_unresolvable_with_a_hint(stub: HindsightStub) -> None:
    with pytest.raises(UnresolvableRef, match="credentials") as err:
        resolver(stub.url, key="wrong").resolve("hindsight://adolf-alvis/q")
    assert "AGAP_HINDSIGHT_KEY" in err.value.hint


@pytest.mark.parametrize("status", [503, 500, 429])
def test_a_busy_or_failing_hindsight_is_retryable(stub: HindsightStub, status: int) -> None:
    stub.fail_next(1, status)
    with pytest.raises(RefUnavailable):
        resolver(stub.url).resolve("hindsight://adolf-alvis/q")
    assert resolver(stub.url).resolve("hindsight://adolf-alvis/dentist")  # the next attempt reads


def test_an_unreachable_hindsight_is_retryable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    with pytest.raises(RefUnavailable, match="Hindsight at"):
        resolver(f"http://127.0.0.1:{port}").resolve("hindsight://adolf-alvis/q")


def test_the_text_is_capped(stub: HindsightStub) -> None:
    for i in range(400):
        stub.add("adolf-alvis", Memory(f"x{i}", "dentist " + "word " * 60))
    text = resolver(stub.url).resolve("hindsight://adolf-alvis/dentist?max_tokens=16384")
    assert text is not None and "truncated by agap" in text
    assert len(text.encode()) < MAX_REF_BYTES + 200


def test_store_readers_follow_the_settings(stub: HindsightStub) -> None:
    readers = store_readers({"AGAP_HINDSIGHT_URL": stub.url, "AGAP_HINDSIGHT_KEY": "hs-key-1"})
    assert set(readers) == {"hindsight", "git+file"}
    text = RefResolver(schemes=readers).resolve("hindsight://adolf-alvis/boiler")
    assert text is not None and "boiler" in text
    assert stub.requests[-1].authorization == "Bearer hs-key-1"


def test_an_unregistered_scheme_names_the_registered_ones() -> None:
    with pytest.raises(UnresolvableRef, match="unknown scheme 'hindsight'"):
        RefResolver().resolve("hindsight://adolf-alvis/q")
    with pytest.raises(UnresolvableRef) as err:
        RefResolver(schemes=store_readers({})).resolve("s3://bucket/key")
    assert "hindsight://" in err.value.hint and "git+file://" in err.value.hint
