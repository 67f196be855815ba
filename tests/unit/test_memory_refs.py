"""``hindsight://`` refs against the Hindsight stand-in, over loopback HTTP: the request
Hindsight's API gets, the text the prompt gets, and every failure typed."""

from __future__ import annotations

import socket
from collections.abc import Iterator

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
        assert text is not None and "2 memories" in text  # nothing matched: the newest


def test_the_bank_is_the_canonical_host() -> None:
    assert parse_recall("HINDSIGHT://Adolf-Alvis/x").bank == "adolf-alvis"
    assert parse_recall("hindsight://adolf%2Dalvis/a%2Fb").bank == "adolf-alvis"
    assert parse_recall("hindsight://adolf%2Dalvis/a%2Fb").query == "a/b"


@pytest.mark.parametrize(
    "ref",
    [
        "hindsight://adolf-alvis/",  # no query
        "hindsight:///query",  # no bank
        "hindsight://adolf-alvis%2F..%2Fother/q",  # a path in the bank
        "hindsight://a..b/q",
        "hindsight://x@adolf-alvis/q",
        "hindsight://adolf-alvis:8888/q",
        "hindsight://adolf-alvis/q?budget=huge",
        "hindsight://adolf-alvis/q?max_tokens=0",
        "hindsight://adolf-alvis/q?max_tokens=99999",
        "hindsight://adolf-alvis/q?types=world",
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
