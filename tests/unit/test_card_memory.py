"""A card's ``memory.retain`` is judged when the cards load: a bank of another person's
domain, a bank no owner rule names, two banks of one domain, a ref that is not a bank, an
untrusted agent's results: each one line naming the file, its line and the field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fabric.cards import CardErrors, load_cards
from fabric.memorybanks import bank_domains, check_memory
from tests.conftest import ROOT


def cards_with(tmp_path: Path, card: str, memory: str, **replace: str) -> Path:
    shutil.copytree(ROOT / "cards", tmp_path / "cards")
    (tmp_path / "souls").symlink_to(ROOT / "souls")
    path = tmp_path / "cards" / f"{card}.yaml"
    text = path.read_text()
    for old, new in replace.items():
        text = text.replace(old.replace("_", " "), new)
    path.write_text(text + memory)
    return tmp_path / "cards"


def problem(directory: Path) -> str:
    """The first problem, as `agap cards validate` says it (one line); the card that has it
    is left out, and what refers to it."""
    with pytest.raises(CardErrors) as caught:
        check_memory(load_cards(directory))
    line = str(caught.value.problems[0])
    assert len(line.splitlines()) == 1
    return line


def test_the_banks_of_the_domains_a_card_works_in_load(tmp_path: Path) -> None:
    d = cards_with(tmp_path, "adolf", "memory:\n  retain: hindsight://adolf-alvis/\n  consolidate: true\n")
    card = load_cards(d).get("adolf")
    assert card.memory is not None and card.memory.consolidate
    assert bank_domains(card, d) == [("hindsight://adolf-alvis/", "private:alvis")]


def test_a_bank_of_another_persons_domain_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    # Alvis's own card works in private:alvis only; elizaveta's bank is never his.
    d = cards_with(tmp_path, "alvis", "memory:\n  retain:\n    - hindsight://adolf-elizaveta/\n")
    n = (d / "alvis.yaml").read_text().splitlines().index("    - hindsight://adolf-elizaveta/") + 1
    line = problem(d)
    assert line.startswith(
        f"cards/alvis.yaml:{n}: memory.retain.0: hindsight://adolf-elizaveta/ is private:elizaveta's"
    )
    assert "never across people" in line


def test_a_bank_no_rule_names_two_of_one_domain_and_a_query_are_refused(tmp_path: Path) -> None:
    for i, (memory, text) in enumerate(
        (
            ("memory: {retain: hindsight://Adolf-Alvis/}\n", "no owner rule names this bank"),
            ("memory: {retain: [hindsight://adolf-alvis/, hindsight://adolf-alvis/]}\n", "listed twice"),
            ("memory: {retain: hindsight://adolf-alvis/recent}\n", "a whole bank"),
            ("memory: {retain: file:///srv/agap/private/alvis/}\n", "not a bank"),
        )
    ):
        line = problem(cards_with(tmp_path / str(i), "adolf", memory))
        assert line.startswith("cards/adolf.yaml") and "memory.retain" in line and text in line, line


def test_two_banks_of_one_domain_are_refused(tmp_path: Path) -> None:
    policy = tmp_path / "cards" / "_policy.yaml"
    d = cards_with(tmp_path, "adolf", "memory: {retain: [hindsight://adolf-alvis/, hindsight://alvis-2/]}\n")
    policy.write_text(
        policy.read_text().replace(
            '  "hindsight://adolf-alvis/": private:alvis\n',
            '  "hindsight://adolf-alvis/": private:alvis\n  "hindsight://alvis-2/": private:alvis\n',
        )
    )
    assert (
        "memory.retain.1: hindsight://alvis-2/ is of private:alvis, like hindsight://adolf-alvis/"
        in problem(d)
    )


def test_an_untrusted_agents_results_never_become_memory(tmp_path: Path) -> None:
    d = cards_with(tmp_path, "researcher", "memory: {retain: hindsight://adolf-alvis/}\n")
    line = problem(d)
    assert "memory" in line and "taint.retain" in line, line
