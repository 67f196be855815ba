"""Every name and value the fabric stores fits every Kanboard backend, for any legal input.

PostgreSQL and MySQL Kanboards hold a metadata name in 50 characters and a value in 255,
and every backend holds a task reference in 191 (KANBOARD.md, "Database backends
differ"). These tests drive each transition of the ledger, submit and the keeper with
adversarial text (the longest intent, many refs, long owners, long result URLs, a
person's 2,000-character answer, long reasons, ``~`` and JSON-breaking characters) through
a port that records and checks every write before the board sees it, and read every
value back whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabric.cards import CardSet
from fabric.embedded.local import LocalPort
from fabric.errors import InvalidInput
from fabric.kanboard.fit import NAME_MAX, REFERENCE_MAX, VALUE_MAX, pack, unpack
from fabric.kanboard.port import Call, Outcome, RoundTrips
from fabric.settings.keeper import KeeperConfig
from fabric.task import State, storable_text
from keeper.daemon import Keeper
from keeper.notify import Notifier
from tests.conftest import FakeClock, make_fabric

SAVES = ("saveTaskMetadata", "saveProjectMetadata", "saveUserMetadata")


class LimitPort:
    """A port that fails the test on any write a PostgreSQL/MySQL Kanboard would refuse."""

    def __init__(self, inner: LocalPort) -> None:
        self.inner = inner
        self.stats: RoundTrips = inner.stats
        self.longest_name = 0
        self.longest_value = 0
        self.writes = 0

    def call(self, method: str, params: Any = None) -> Any:
        return self.batch([Call(method, params)])[0].unwrap()

    def batch(self, calls: Sequence[Call]) -> list[Outcome]:
        for c in calls:
            params = c.params if isinstance(c.params, dict) else {}
            if c.method in SAVES:
                for name, value in dict(params.get("values") or {}).items():
                    assert len(name) <= NAME_MAX, (c.method, name)
                    assert len(str(value)) <= VALUE_MAX, (c.method, name, len(str(value)))
                    self.longest_name = max(self.longest_name, len(name))
                    self.longest_value = max(self.longest_value, len(str(value)))
                    self.writes += 1
            if c.method in ("createTask", "updateTask") and "reference" in params:
                assert len(str(params["reference"])) <= REFERENCE_MAX, params["reference"]
            for value in params.values():
                if isinstance(value, str):
                    assert "\x00" not in value, c.method
        return self.inner.batch(calls)


# Text as hostile as a caller can make it: any code point (NUL and lone surrogates
# included), chunk marks, quotes, backslashes, newlines, fences.
HOSTILE = st.text(alphabet=st.characters(codec=None), max_size=40) | st.sampled_from(
    ["~", "~1.deadbeef~", "```json fabric-spec", '"', "\\", "\n", "\x00", "\ud800", "é", "🦊"]
)


def long_text(min_size: int, max_size: int, *, storable: bool = False) -> st.SearchStrategy[str]:
    """Long hostile text, built from pieces so hypothesis reaches the long end cheaply.

    ``storable`` leaves out NULs and lone surrogates, which a task's spec refuses with a
    clear error (tested below) where free text in records keeps a replacement character.
    """
    pieces = HOSTILE.map(storable_text) if storable else HOSTILE
    return (
        st.lists(pieces, min_size=1, max_size=12)
        .map("".join)
        .flatmap(
            lambda piece: st.integers(min_size, max_size).map(
                lambda n: ((piece or "x") * (n // max(1, len(piece or "x")) + 1))[:n]
            )
        )
    )


def fabric_on(cards: CardSet, clock: FakeClock) -> tuple[Any, LimitPort]:
    port = LimitPort(LocalPort(clock=clock))
    return make_fabric(port, cards, clock), port


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    intent=long_text(1, 4000, storable=True),
    ref_tail=long_text(1, 300, storable=True),
    nrefs=st.integers(0, 25),
    key=long_text(1, 600, storable=True).filter(str.strip),  # a blank key is refused
    actor=long_text(1, 200, storable=True).filter(str.strip),  # a blank actor is refused
    owner=long_text(1, 300),
    reason=long_text(0, 3000),
    answer=long_text(1, 2000),
    result_tail=long_text(1, 2000),
    op=st.from_regex(r"[a-z][a-z0-9-]{0,120}", fullmatch=True),
)
def test_every_transition_stores_only_what_every_backend_holds(
    cards: CardSet,
    intent: str,
    ref_tail: str,
    nrefs: int,
    key: str,
    actor: str,
    owner: str,
    reason: str,
    answer: str,
    result_tail: str,
    op: str,
) -> None:
    clock = FakeClock()
    fab, port = fabric_on(cards, clock)
    if not intent.strip():  # a blank intent is refused (tested elsewhere)
        intent = ("x" + intent)[:4000]  # still within the 4000-character limit
    if not key.strip():  # a blank key is refused (tested elsewhere)
        key = "k" + key
    refs = [f"https://example.org/{i}/{ref_tail}" for i in range(nrefs)]
    r = fab.submit(intent, target="kimi", refs=refs, key=key, actor=actor)
    view = fab.board.read(r.task_id)
    assert view.spec is not None and not view.problems
    assert view.spec.actor == actor and view.spec.action_id == key
    assert len(view.spec.refs) == nrefs
    # The same key again finds the same task: the hashed reference is found back.
    assert fab.submit(intent, target="kimi", refs=refs, key=key, actor=actor).task_id == r.task_id

    led = fab.ledger
    lease = led.claim(view, owner, lease_seconds=60)
    lease = led.renew(lease, lease_seconds=120)
    lease = led.checkpoint(lease, f"https://example.org/ckpt/{result_tail}")
    effect = led.effect(lease, op)
    led.effect_done(lease, effect, receipt=reason or "r")
    # The receipt is kept in the owner's record, as free text is.
    assert led.effect(lease, op).receipt == storable_text(reason or "r")
    led.ask(lease, f"question: {reason}", "alvis")
    led.resume(r.task_id, "alvis", answer)
    view = fab.board.read(r.task_id)
    assert view.current is not None and not view.problems
    assert view.current.reason == storable_text(answer)

    lease = led.claim(view, owner, lease_seconds=60)
    led.fail(lease, reason or "failed")
    clock.advance(3600)
    lease = led.claim(fab.board.read(r.task_id), owner, lease_seconds=60)
    led.keep_evidence(lease, reason * 3)
    result = f"https://example.org/result/{result_tail}"
    led.complete(lease, result, note=reason or None)
    led.reopen(r.task_id, "alvis", reason or "again")
    lease = led.claim(fab.board.read(r.task_id), owner, lease_seconds=60)
    led.complete(lease, result)
    led.verify(r.task_id, "alvis", reason)
    view = fab.board.read(r.task_id)
    assert view.current is not None and view.current.state == State.CLOSED
    assert view.current.result_ref == storable_text(result) and not view.problems

    other = fab.submit(f"second {intent}"[:4000], target="kimi")
    led.dead_letter(other.task_id, "keeper", reason or "poison")
    led.revive(other.task_id, "alvis", reason)
    led.cancel(other.task_id, "alvis", reason)
    assert fab.board.read(other.task_id).current.reason == storable_text(reason)

    # The keeper's own state (watch lists, digests, escalations) fits too.
    k = Keeper.for_fabric(fab, KeeperConfig(), notifier=Notifier(fab.cards))
    for job in KeeperConfig().intervals:
        k.run_job(job)
    assert port.longest_name <= NAME_MAX and port.longest_value <= VALUE_MAX


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bad=st.sampled_from(["\x00", "\ud800", "a\udcff"]),
    field=st.sampled_from(["intent", "key", "actor", "ref"]),
)
def test_text_no_backend_can_store_is_refused_with_a_clear_line(cards: CardSet, bad: str, field: str) -> None:
    fab, port = fabric_on(cards, FakeClock())
    port.writes = 0  # what `agap init` wrote does not count
    kw: dict[str, Any] = {"intent": "fine", "key": None, "actor": None, "refs": []}
    if field == "ref":
        kw["refs"] = [f"https://example.org/{bad}"]
    else:
        kw[field] = bad if field != "intent" else f"x{bad}"
    try:
        fab.submit(kw.pop("intent"), target="kimi", **kw)
    except InvalidInput as exc:
        assert "cannot store" in exc.line() and "\n" not in exc.line()
    else:
        raise AssertionError("an unstorable character was accepted")
    assert port.writes == 0  # nothing half-written


@given(
    values=st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9._-]{0,45}", fullmatch=True),
        st.text(max_size=3000) | long_text(0, 2000),
        max_size=6,
    )
)
def test_chunks_round_trip_and_fit(values: dict[str, str]) -> None:
    stored = pack(values)
    assert all(len(k) <= NAME_MAX for k in stored)
    assert all(len(v) <= VALUE_MAX for v in stored.values())
    assert unpack(stored) == values


@given(first=long_text(256, 3000), second=long_text(0, 1000))
def test_a_shorter_value_written_over_a_longer_one_reads_as_the_shorter(first: str, second: str) -> None:
    stored = pack({"fabric.e1": first})
    stored.update(pack({"fabric.e1": second}))  # one upsert: leftover chunks stay behind
    assert unpack(stored) == {"fabric.e1": second}


def test_a_damaged_chunk_reads_as_unreadable_not_as_another_value() -> None:
    stored = pack({"fabric.e1": "{" + "x" * 600 + "}"})
    stored["fabric.e1~1"] = "y" * 255
    assert unpack(stored)["fabric.e1"].startswith("~")  # not JSON: a reader reports it
    del stored["fabric.e1~2"]
    assert unpack(stored)["fabric.e1"].startswith("~")
