"""Prompt assembly: a task's intent, its resolved context refs and the agent's persona.

``system`` is the persona's soul file (or :data:`DEFAULT_SYSTEM`); ``user`` is the intent
followed by one delimited block per ref::

    === ref 1: file:///srv/notes/a.md [3f2a9c1b] ===
    ...content...
    === end ref 1 [3f2a9c1b] ===

The bracketed tag is derived from the content, so the prompt stays deterministic (same task,
same prompt) while a ref cannot fake the end of its own block.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from fabric.cards import Card, CardSet

__all__ = ["DEFAULT_SYSTEM", "build_messages", "persona_for", "persona_text"]

DEFAULT_SYSTEM = (
    "You are an agent working tasks from a shared task board. Do the task you are given, "
    "using the context blocks that follow it. Answer with the result itself (plain text or "
    "Markdown). If something you need is missing, say exactly what."
)


def build_messages(
    spec_intent: str, refs: Mapping[str, str], persona_text: str | None = None
) -> list[dict[str, str]]:
    """``[system, user]`` chat messages for one task."""
    system = persona_text.strip() if persona_text and persona_text.strip() else DEFAULT_SYSTEM
    parts = [spec_intent.strip() or "(no intent given)"]
    if refs:
        parts.append(f"Context ({len(refs)} ref{'s' if len(refs) != 1 else ''}):")
    for i, (uri, content) in enumerate(refs.items(), start=1):
        tag = hashlib.sha256(f"{uri}\n{content}".encode()).hexdigest()[:8]
        while f"[{tag}]" in content:  # vanishingly rare; keep the fence unique
            tag = hashlib.sha256(tag.encode()).hexdigest()[:8]
        body = content if content.endswith("\n") else content + "\n"
        parts.append(f"=== ref {i}: {uri} [{tag}] ===\n{body}=== end ref {i} [{tag}] ===")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def persona_text(persona: str | None, base_dir: Path) -> str | None:
    """The soul file's text for a card's ``persona`` path (relative to ``base_dir``), or None."""
    if not persona:
        return None
    path = base_dir / persona
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def persona_for(card: Card, cards: CardSet) -> str | None:
    """``card``'s soul file text (its path relative to the cards' base folder), or None."""
    return persona_text(card.persona, cards.base_dir or Path.cwd())
