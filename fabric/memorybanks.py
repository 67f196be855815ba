"""The banks a card's ``memory.retain`` names, judged with the owner rules of
``cards/_policy.yaml`` once the cards are loaded (``agap cards validate``, and every
command and daemon that connects: :meth:`fabric.core.Fabric.connect`). A result is
retained only into a bank of the task's own privacy domain, so a bank the card could
never rightly write is refused here, not found out at the first done task:

* a ref that is not a whole bank (``hindsight://<bank>/``);
* a bank no owner rule names is ``unknown`` (nobody may read it, nothing goes in);
* a bank of a domain the card does not work in (``privacy_domains``) would only ever
  receive results of another person's work;
* two banks of one domain leave it open which one a task's result goes into.

(The cards themselves cannot read the policy: they lie beneath it.)
"""

from __future__ import annotations

from pathlib import Path

from fabric.cards import Card, CardErrors, CardProblem, CardSet
from fabric.cards.files import shown_path
from fabric.errors import FabricError, InvalidInput
from fabric.hindsight import bank_of
from fabric.policy_file import POLICY_FILE, UNKNOWN, policy_config, rules_domain

__all__ = ["bank_domains", "check_memory", "memory_problems"]


def bank_domains(card: Card, directory: Path) -> list[tuple[str, str]]:
    """``(bank ref, its domain)`` for each bank of the card's ``memory.retain``."""
    if card.memory is None:
        return []
    cfg = policy_config(directory)
    return [(ref, rules_domain(cfg, bank_of(ref)[1])) for ref in card.memory.retain]


def memory_problems(cards: CardSet) -> list[CardProblem]:
    """Every problem of the cards' ``memory.retain`` banks (see the module)."""
    directory = cards.directory or Path("cards")
    try:
        cfg = policy_config(directory)
    except FabricError:
        return []  # the policy file does not load: its own error says so, wherever it is read
    problems: list[CardProblem] = []
    for card in cards:
        if card.memory is None:
            continue
        path = directory / f"{card.id}.yaml"
        shown = shown_path(path, cards.base_dir or directory.parent)
        seen: dict[str, str] = {}
        for i, ref in enumerate(card.memory.retain):
            line = _line_of(path, ref)
            try:
                domain = rules_domain(cfg, bank_of(ref)[1])
            except InvalidInput as exc:
                problems.append(CardProblem(shown, f"memory.retain.{i}", f"{ref}: {exc.what}", line=line))
                continue
            if domain == UNKNOWN:
                message = f"{ref}: no owner rule names this bank (domains: of {POLICY_FILE}): nothing goes in"
            elif domain not in card.privacy_domains:
                message = (
                    f"{ref} is {domain}'s, and {card.id} does not work in {domain} "
                    f"(privacy_domains: {', '.join(card.privacy_domains)}): never across people"
                )
            elif domain in seen:
                message = f"{ref} is of {domain}, like {seen[domain]}: one bank per domain"
            else:
                seen[domain] = ref
                continue
            problems.append(CardProblem(shown, f"memory.retain.{i}", message, line=line))
    return problems


def check_memory(cards: CardSet) -> CardSet:
    """``cards``, or :class:`CardErrors` listing the problems of their banks."""
    problems = memory_problems(cards)
    if problems:
        where = (cards.directory or Path("cards")).as_posix()
        raise CardErrors(problems, where=where, hint="fix them and run `agap cards validate`")
    return cards


def _line_of(path: Path, text: str) -> int | None:
    """The first line of ``path`` that holds ``text`` (for a problem's file:line)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    return next((n for n, line in enumerate(lines, 1) if text in line), None)
