"""Loading the cards in a directory: every file parsed, every card checked, and every
problem found across all files reported at once."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from fabric.cards.cardset import CardSet
from fabric.cards.checks import cross_card_problems
from fabric.cards.files import card_files, read_yaml, shown_path
from fabric.cards.gpu import gpu_problems
from fabric.cards.problems import CardErrors, CardProblem, validation_problems
from fabric.cards.schema import Card

__all__ = ["load_cards"]


def load_cards(directory: str | Path = "cards", *, base_dir: Path | None = None) -> CardSet:
    """Load and check every card in ``directory``.

    ``base_dir`` is what ``persona`` and ``golden`` paths are relative to (the repository
    root); it defaults to the parent of ``directory``. Raises :class:`CardErrors` listing
    every problem found, across all files.
    """
    directory = Path(directory)
    base = Path(base_dir) if base_dir is not None else directory.resolve().parent
    shown_dir = directory.as_posix()
    files = _files(directory, shown_dir)
    problems: list[CardProblem] = []
    loaded: list[tuple[str, Card]] = []
    broken: set[str] = set()  # stems of files that did not load
    for path in files:
        shown = shown_path(path, base)
        broken.add(path.stem)
        card, found = _load_card(path, shown)
        if card is None:
            problems.extend(found)
            continue
        loaded.append((shown, card))
        broken.discard(path.stem)

    problems.extend(cross_card_problems(loaded, base, broken))
    if not broken:
        problems.extend(gpu_problems(loaded, directory, base))
    if problems:
        raise CardErrors(problems, where=shown_dir, hint="fix them and run `agap cards validate`")
    return CardSet((c for _, c in loaded), base_dir=base, directory=directory)


def _files(directory: Path, shown_dir: str) -> list[Path]:
    """The card files in ``directory``; :class:`CardErrors` if there is none to load."""
    if not directory.is_dir():
        what = "no such directory" if not directory.exists() else "not a directory"
        raise CardErrors(
            [
                CardProblem(
                    shown_dir,
                    "",
                    f"{what} (run from the repository root, or pass --dir / set "
                    "AGAP_CARDS_DIR to the folder holding the agent cards)",
                )
            ]
        )
    files = card_files(directory)
    if not files:
        raise CardErrors(
            [
                CardProblem(
                    shown_dir,
                    "",
                    "no agent cards here (expected one <id>.yaml per agent; files starting "
                    "with '_' and subfolders are skipped)",
                )
            ]
        )
    return files


def _load_card(path: Path, shown: str) -> tuple[Card | None, list[CardProblem]]:
    """The card in ``path``, or None and what is wrong with the file."""
    data, found = read_yaml(path, shown)
    if found:
        return None, found
    if data is None:
        return None, [CardProblem(shown, "", "empty file")]
    if not isinstance(data, dict):
        return None, [CardProblem(shown, "", "a card must be a YAML mapping of key: value")]
    try:
        card = Card.model_validate(data)
    except ValidationError as exc:
        return None, validation_problems(shown, exc)
    if card.id != path.stem:
        return None, [CardProblem(shown, "id", f"{card.id!r} must equal the file name {path.stem!r}")]
    return card, []
