"""A card has two forms: pydantic's, which checks a card file (fabric.cards.models), and the
plain classes every process reads (fabric.cards.schema), which a worker or ``agap claim``
builds straight from the checked snapshot (fabric.cardcache) without importing pydantic.
Here the two are held field for field alike: a field added, renamed or defaulted in one
and not the other fails, and so does any value the snapshot reads back otherwise than
pydantic checked it, for every shipped card and golden set."""

from __future__ import annotations

from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from fabric import cardcache
from fabric.cards import CardSet, load_golden, models, schema
from fabric.cards.backbone import read_record, with_backbone
from fabric.cards.dialect import parse
from fabric.cards.files import card_files

ROOT = Path(__file__).resolve().parents[2]
PLAIN = [cls for name in schema.__all__ if isinstance(cls := getattr(schema, name), type)]


def _same(checked: Any, plain: Any, where: str) -> None:
    """``plain`` holds what pydantic's ``checked`` holds, field for field, type for type."""
    if isinstance(checked, BaseModel):
        assert type(checked).__name__ == f"{type(plain).__name__}Check", where
        names = list(type(checked).model_fields)
        assert [f.name for f in fields(plain)] == names, where
        for name in names:
            _same(getattr(checked, name), getattr(plain, name), f"{where}.{name}")
    elif isinstance(checked, list):
        assert isinstance(plain, list) and len(plain) == len(checked), where
        for i, (a, b) in enumerate(zip(checked, plain, strict=True)):
            _same(a, b, f"{where}.{i}")
    else:
        assert type(plain) is type(checked) and plain == checked, (where, checked, plain)


def _yaml(path: Path) -> Any:
    data, problems = parse(path.read_text(), path.name)  # the cards' own dialect
    assert not problems
    return data


@pytest.mark.parametrize("cls", PLAIN, ids=lambda c: c.__name__)
def test_each_plain_class_has_a_check_with_the_same_fields_and_defaults(cls: type[Any]) -> None:
    check: type[BaseModel] = getattr(models, f"{cls.__name__}Check")
    theirs = check.model_fields
    ours = {f.name: f for f in fields(cls)}
    assert list(ours) == list(theirs)
    for name, f in ours.items():
        info = theirs[name]
        assert (f.default is MISSING and f.default_factory is MISSING) == info.is_required(), name
        if info.is_required():
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        _same(info.get_default(call_default_factory=True), default, f"{cls.__name__}.{name}")


def test_every_shipped_card_reads_back_from_the_snapshot_as_pydantic_checked_it(
    cards_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cardcache.checked_cards(cards_copy)  # checked, and remembered

    def refuse(*_: Any) -> Any:
        raise AssertionError("the cards were checked again: not read from the snapshot")

    monkeypatch.setattr(models, "check_card", refuse)
    kept = cardcache.checked_cards(cards_copy)
    monkeypatch.undo()

    files = card_files(cards_copy)
    assert len(files) == len(kept) >= 10
    checked = {p.stem: models.CardCheck.model_validate(_yaml(p)) for p in files}
    unresolved = [models.plain(c) for c in checked.values()]
    record = read_record(cards_copy)
    for agent, card in checked.items():
        # The set resolves a persona's backbone into its runtime (fabric.cards.backbone):
        # those three fields are the chosen model card's, as pydantic checked that card.
        resolved = with_backbone(models.plain(card), unresolved, record.get(agent)).runtime
        runtime = card.runtime.model_copy(
            update={k: getattr(resolved, k) for k in ("model", "api_base", "api_key_env")}
        )
        _same(card.model_copy(update={"runtime": runtime}), kept.get(agent), agent)
    assert any(c.backbone is not None for c in kept)  # the resolution above was exercised


def test_every_shipped_golden_set_reads_as_pydantic_checked_it() -> None:
    paths = sorted((ROOT / "cards" / "golden").glob("*.yaml"))
    assert paths
    for path in paths:
        checked = models.GoldenSetCheck.model_validate(_yaml(path))
        _same(checked, load_golden(path, base_dir=ROOT), path.name)


def test_a_plain_card_is_built_and_varied_without_a_check() -> None:
    runtime = schema.RuntimeSpec(mode="demo")
    card = schema.Card(id="m1", kind="model", name="M", tier="small", trust="trusted", runtime=runtime)
    assert card.availability == [schema.AlwaysSpec()] and card.queue_name == "m1"
    assert replace(card, queue="q").queue_name == "q" and card.queue is None
    assert CardSet([card]).get("m1") == card
