"""Loading the cards in a directory: every file parsed, every card checked, and every
problem found across all files reported at once.

The checks (:mod:`fabric.cards.models`, pydantic) are imported when a load runs, not with
this module: ``from fabric.cards import load_cards`` costs a process that then reads the
checked snapshot (:mod:`fabric.cardcache`) nothing."""

from __future__ import annotations

from pathlib import Path

from fabric.cards.cardset import CardSet
from fabric.cards.checks import cross_card_problems
from fabric.cards.files import card_files, read_yaml, shown_path
from fabric.cards.gpu import gpu_problems
from fabric.cards.problems import CardErrors, CardProblem, validation_problems
from fabric.cards.schema import Card

__all__ = ["load_cards", "load_cards_keeping_going"]


def load_cards(directory: str | Path = "cards", *, base_dir: Path | None = None) -> CardSet:
    """Load and check every card in ``directory``.

    ``base_dir`` is what ``persona`` and ``golden`` paths are relative to (the repository
    root); it defaults to the parent of ``directory``. Raises :class:`CardErrors` listing
    every problem found, across all files: the files that do not load first, then what
    follows from them.
    """
    cards, problems = load_cards_keeping_going(directory, base_dir=base_dir)
    if problems:
        raise CardErrors(
            problems, where=Path(directory).as_posix(), hint="fix them and run `agap cards validate`"
        )
    return cards


def load_cards_keeping_going(
    directory: str | Path = "cards", *, base_dir: Path | None = None
) -> tuple[CardSet, list[CardProblem]]:
    """The cards that load and check, and the problems of the others (for a daemon that
    runs what it can: one bad card stops only what needs it). A card that refers to a
    broken one is left out too, until what is left is consistent."""
    directory = Path(directory)
    base = Path(base_dir) if base_dir is not None else directory.resolve().parent
    files = _files(directory, directory.as_posix())
    problems: list[CardProblem] = []
    loaded: list[tuple[str, Card]] = []
    broken: set[str] = set()  # stems of files that did not load
    for path in files:
        shown = shown_path(path, base)
        card, found = _load_card(path, shown)
        if card is None:
            problems.extend(found)
            broken.add(path.stem)
            continue
        loaded.append((shown, card))
    file_problems = list(problems)
    later: list[CardProblem] = []
    for _ in range(len(loaded) + 1):  # each round drops at least one card, or ends
        found = cross_card_problems(loaded, base, broken)
        if not broken:
            found.extend(gpu_problems(loaded, directory, base))
        later += [p for p in found if p not in later]
        bad = {p.file for p in found}
        dropped = [shown for shown, _ in loaded if shown in bad]
        if not dropped:
            break  # what is left is consistent (a golden set's problem is its file's alone)
        broken |= {Path(shown).stem for shown in dropped}
        loaded = [(shown, c) for shown, c in loaded if shown not in bad]
    cards = CardSet((c for _, c in loaded), base_dir=base, directory=directory)
    if not broken:  # the ops-agent's playbooks name cards: checked once the cards are whole
        from fabric.cards.playbooks import playbook_problems  # here: its models are pydantic's

        later += playbook_problems(directory, base, cards)
    return cards, file_problems + collapse(later)


def collapse(problems: list[CardProblem]) -> list[CardProblem]:
    """Many files missing under one folder (a cards folder copied without souls/ and its
    golden sets) are one problem, said once with what to do."""
    missing = [p for p in problems if p.message.endswith(")") and " does not exist (under " in p.message]
    if len(missing) < 3:
        return problems
    base = missing[0].message.rsplit("(under ", 1)[1].rstrip(")")
    named = ", ".join(p.message.split(" does not exist", 1)[0] for p in missing[:3])
    one = CardProblem(
        base,
        "",
        f"{len(missing)} persona or golden files are missing ({named}, …): they are read relative "
        "to the folder above the cards; copy souls/ and cards/golden/ with them, or run from the repository",
    )
    return [p for p in problems if p not in missing] + [one]


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
    # Here, not at the top: only a load from the files checks, and needs pydantic.
    from fabric.cards.models import ValidationError, check_card

    try:
        card = check_card(data)
    except ValidationError as exc:
        return None, validation_problems(shown, exc)
    if card.id != path.stem:
        return None, [CardProblem(shown, "id", f"{card.id!r} must equal the file name {path.stem!r}")]
    return card, []
