"""Reading card files: which files are cards, their YAML (in the cards' dialect,
:mod:`fabric.cards.dialect`), golden sets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fabric.cards.problems import CardErrors, CardProblem, validation_problems
from fabric.cards.schema import GoldenSet

__all__ = ["card_files", "load_golden", "read_yaml", "shown_path"]


def read_yaml(path: Path, shown: str) -> tuple[Any, list[CardProblem]]:
    """The YAML in ``path`` (None if empty), or the problems reading it; ``shown`` names it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [CardProblem(shown, "", f"cannot read: {exc}")]
    from fabric.cards.dialect import parse  # here: yaml only where a file is parsed

    return parse(text, shown)


def shown_path(path: Path, base_dir: Path) -> str:
    """``path`` as a problem names it: relative to ``base_dir`` or the working directory."""
    for root in (base_dir, Path.cwd()):
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return path.as_posix()


def card_files(directory: Path) -> list[Path]:
    """The card files in ``directory``: ``*.yaml``/``*.yml``, not ``_*`` or ``.*``, no subfolders."""
    return sorted(
        p
        for p in directory.iterdir()
        if p.is_file() and p.suffix in (".yaml", ".yml") and not p.name.startswith(("_", "."))
    )


def load_golden(path: str | Path, *, base_dir: Path | None = None) -> GoldenSet:
    """Load a golden set (``{agent, cases: [{input, expect: {contains|exact|regex}}]}``)."""
    path = Path(path)
    shown = shown_path(path, base_dir or Path.cwd())
    data, problems = read_yaml(path, shown)
    if problems:
        raise CardErrors(problems)
    if not isinstance(data, dict):
        message = "a golden set must be a mapping with agent and cases"
        raise CardErrors([CardProblem(shown, "", message)])
    # Here, not at the top: checking a file is what needs pydantic.
    from fabric.cards.models import ValidationError, check_golden

    try:
        return check_golden(data)
    except ValidationError as exc:
        raise CardErrors(validation_problems(shown, exc)) from None
