"""fabric.cardcache: checked cards read back from the snapshot only while nothing they were
read from changed; any change is checked afresh and refused exactly as before."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from fabric import cardcache
from fabric.cards import CardErrors, load_cards, models
from fabric.memorybanks import check_memory
from fabric.policy_file import policy_config

ROOT = Path(__file__).resolve().parents[2]


def _no_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any card check from here on fails the test: the snapshot must be read."""

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("the cards were checked again")

    monkeypatch.setattr(models, "check_card", refuse)


def _same(a: Any, b: Any) -> None:
    assert [c.id for c in a] == [c.id for c in b]
    for x, y in zip(a, b, strict=True):
        assert x == y and asdict(x) == asdict(y)
    assert a.base_dir == b.base_dir and a.directory == b.directory
    assert {c.queue_name for c in a} == {c.queue_name for c in b}


def test_unchanged_cards_are_read_back_as_checked(cards_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = cardcache.checked_cards(cards_copy)
    _same(first, check_memory(load_cards(cards_copy)))
    policy = policy_config(cards_copy)
    _no_check(monkeypatch)
    again = cardcache.checked_cards(cards_copy)
    _same(again, first)
    quota, was = again.get("kimi").availability[0], first.get("kimi").availability[0]
    assert quota.shape == "quota" and quota == was
    assert policy_config(cards_copy) == policy
    daemon, problems = cardcache.daemon_cards(cards_copy)
    assert problems == []
    _same(daemon, first)


@pytest.mark.parametrize(
    ("path", "edit"),
    [
        ("cards/kimi.yaml", lambda t: t.replace("lease_seconds: 120", "lease_seconds: 121")),
        ("cards/_policy.yaml", lambda t: t.replace("max_depth: 8", "max_depth: 5")),
        ("cards/golden/adolf.yaml", lambda t: t + "\n"),
        ("souls/adolf.md", lambda t: t + "\nOne more line.\n"),
    ],
)
def test_any_change_is_read_afresh(cards_copy: Path, path: str, edit: Any) -> None:
    cardcache.checked_cards(cards_copy)
    changed = cards_copy.parent / path
    changed.write_text(edit(changed.read_text()))
    again = cardcache.checked_cards(cards_copy)
    _same(again, check_memory(load_cards(cards_copy)))
    assert again.get("kimi").runtime.lease_seconds == load_cards(cards_copy).get("kimi").runtime.lease_seconds
    assert policy_config(cards_copy).max_depth == (5 if path.endswith("_policy.yaml") else 8)


def test_a_bad_edit_is_refused_as_without_the_snapshot(cards_copy: Path) -> None:
    cardcache.checked_cards(cards_copy)
    card = cards_copy / "kimi.yaml"
    card.write_text(card.read_text().replace("lease_seconds: 120", "lease_seconds: 1"))
    with pytest.raises(CardErrors) as plain:
        check_memory(load_cards(cards_copy))
    with pytest.raises(CardErrors) as cached:
        cardcache.checked_cards(cards_copy)
    assert cached.value.line() == plain.value.line()
    assert "lease_seconds: must be at least 5" in cached.value.line()
    # A daemon runs without the bad card, and says why; nothing good enough to remember.
    cards, problems = cardcache.daemon_cards(cards_copy)
    assert "kimi" not in cards and [p.field for p in problems] == ["runtime.lease_seconds"]
    (soul := cards_copy.parent / "souls" / "adolf.md").unlink()
    with pytest.raises(CardErrors) as gone:
        cardcache.checked_cards(cards_copy)
    assert "souls/adolf.md" in gone.value.line() and not soul.exists()


def test_a_damaged_snapshot_is_a_miss(cards_copy: Path) -> None:
    cardcache.checked_cards(cards_copy)
    (snapshot,) = (cards_copy.parents[1] / "cache" / "agap").glob("cards-*.json")
    snapshot.write_text(snapshot.read_text()[:100])
    _same(cardcache.checked_cards(cards_copy), load_cards(cards_copy))


def test_the_snapshot_is_keyed_by_the_code_that_checks() -> None:
    # A file renamed away would hash as absent, the same every time: a silent stale key.
    assert all(p.is_file() for p in cardcache._CODE)
    names = {p.name for p in cardcache._CODE}
    assert {"models.py", "schema.py", "policy_file.py", "policy_models.py", "memorybanks.py"} <= names
