"""A persona's backbone is resolved from its constraints: editing them swaps the model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fabric.cards import CardErrors, load_cards
from fabric.cards.backbone import backbone_choices, resolve_backbone
from tests.conftest import ROOT


def copy_cards(tmp: Path) -> Path:
    d = tmp / "cards"
    shutil.copytree(ROOT / "cards", d)
    for sub in ("souls",):
        if (ROOT / sub).exists():
            shutil.copytree(ROOT / sub, tmp / sub)
    return d


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_each_persona_thinks_with_the_closest_fitting_model_card() -> None:
    cards = load_cards(ROOT / "cards", base_dir=ROOT)
    assert cards.get("adolf").runtime.model == cards.get("kimi").runtime.model
    assert cards.get("torgash").runtime.model == cards.get("qwen-remote").runtime.model
    assert cards.get("router").runtime.model == cards.get("gemma-local").runtime.model


def test_editing_a_tier_constraint_swaps_the_backbone(tmp_path: Path) -> None:
    d = copy_cards(tmp_path)
    edit(d / "torgash.yaml", "tier: medium", "tier: large")
    cards = load_cards(d, base_dir=tmp_path)
    assert cards.get("torgash").runtime.model == cards.get("kimi").runtime.model


def test_a_private_persona_never_lands_on_a_shared_only_model(tmp_path: Path) -> None:
    d = copy_cards(tmp_path)
    edit(d / "adolf.yaml", "tier: large", "tier: medium")  # qwen-remote fits the tier...
    cards = load_cards(d, base_dir=tmp_path)
    adolf = cards.get("adolf")
    chosen = resolve_backbone(adolf, cards)
    assert chosen is not None and chosen.id == "kimi"  # ...but may not see alvis's context
    why = {c.card.id: c.why for c in backbone_choices(adolf, cards)}
    assert why["qwen-remote"].startswith("may not see private:")


def test_a_runtime_model_that_disagrees_with_the_backbone_is_a_card_problem(tmp_path: Path) -> None:
    d = copy_cards(tmp_path)
    edit(d / "torgash.yaml", "  concurrency: 1", "  model: openai/kimi-k2\n  concurrency: 1")
    with pytest.raises(CardErrors) as err:
        load_cards(d, base_dir=tmp_path)
    assert "the backbone decides" in str(err.value.problems)


def test_constraints_nothing_fits_name_each_card_and_why(tmp_path: Path) -> None:
    d = copy_cards(tmp_path)
    edit(d / "torgash.yaml", "capabilities: [tools]", "capabilities: [vision]")
    with pytest.raises(CardErrors) as err:
        load_cards(d, base_dir=tmp_path)
    text = str(err.value.problems)
    assert "no model card satisfies" in text and "kimi: lacks vision" in text
