"""The checked cards, remembered: what ``agap claim``, ``heartbeat`` and a worker start with.

Checking the cards imports pydantic and builds its validators, which cost a short-lived
process more than all its other work (docs/BENCHMARKS.md, "Worker memory and CLI start").
Cards are code: between two deploys every process reads the same files. So once the cards
load and check with no problem at all, the cards as checked and the policy file as read
are kept in a snapshot (JSON, in the user's cache); a process whose inputs are the same,
byte for byte, reads them back as the plain classes of :mod:`fabric.cards.schema`,
without checking again and without importing pydantic or yaml. Any difference (a card, a
persona or golden file, ``_policy.yaml``, anything under the cards folder, this code or
the cards' code, pydantic's version) is a miss, and the cards are checked as ever: a
refusal is the same refusal, said the same way. The snapshot is trusted as the layout
cache beside it is: it is in the user's own cache folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from fabric.cards import CardSet, load_cards, load_cards_keeping_going, schema
from fabric.errors import FabricError
from fabric.memorybanks import check_memory
from fabric.policy_file import POLICY_FILE, PolicyConfig, Quota, policy_config, remember_policy
from fabric.settings import registry

FORMAT = 2  # 2: the plain classes of fabric.cards.schema, by name and fields
# The code whose change can change what the cards check to: a snapshot made by other code
# is a miss.
_CODE = (
    Path(__file__),
    *sorted((Path(__file__).parent / "cards").glob("*.py")),
    Path(__file__).parent / "memorybanks.py",
    Path(__file__).parent / "policy_file.py",
    Path(__file__).parent / "policy_models.py",  # the policy file's check
)


def checked_cards(directory: str | Path) -> CardSet:
    """The cards in ``directory``, loaded and checked with their memory banks (as
    ``check_memory(load_cards(directory))``), from the snapshot when nothing changed."""
    directory = Path(directory)
    kept = _read(directory)
    if kept is not None:
        return kept
    cards = check_memory(load_cards(directory))
    _write(directory, cards)
    return cards


def daemon_cards(directory: str | Path) -> tuple[CardSet, list[Any]]:
    """``load_cards_keeping_going(directory)``, from the snapshot when nothing changed (a
    snapshot holds only cards with no problem at all); a clean load is remembered."""
    directory = Path(directory)
    kept = _read(directory)
    if kept is not None:
        return kept, []
    cards, problems = load_cards_keeping_going(directory)
    if not problems:
        with contextlib.suppress(FabricError):  # a bank's problem: not a snapshot, said where it matters
            _write(directory, check_memory(cards))
    return cards, problems


# -- the snapshot -----------------------------------------------------------------


def _path(directory: Path) -> Path:
    base = registry.get_path("XDG_CACHE_HOME", fallback=Path.home() / ".cache") / "agap"
    key = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:16]
    return base / f"cards-{key}.json"


def _stat(path: Path) -> list[Any]:
    # By content, not by modification time: an edit within the file system's timestamp
    # granularity, same size, would otherwise read as the old file.
    try:
        return [str(path), hashlib.sha256(path.read_bytes()).hexdigest()]
    except OSError:
        return [str(path), None]


def _folder(directory: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            yield Path(root) / name


def _pydantic() -> list[Any]:
    # The checks' pydantic, by its version file: another version may check otherwise.
    # Found, not imported (importing it is what the snapshot spares).
    spec = find_spec("pydantic")
    if spec is None or spec.origin is None:
        return ["pydantic", None]
    return _stat(Path(spec.origin).parent / "version.py")


def _inputs(directory: Path, cards: CardSet) -> str:
    """A digest of everything the check read: the cards folder, the persona and golden
    files the cards name (or their absence), the code, pydantic's version."""
    base = cards.base_dir or directory.resolve().parent
    named = sorted({base / p for c in cards for p in (c.persona, c.golden) if p})
    seen = [
        FORMAT,
        _pydantic(),
        str(directory.resolve()),
        str(base),
        *(_stat(p) for p in _CODE),
        *(_stat(p) for p in _folder(directory)),
        *(_stat(p) for p in named),
    ]
    return hashlib.sha256(json.dumps(seen).encode()).hexdigest()


def _read(directory: Path) -> CardSet | None:
    try:
        data = json.loads(_path(directory).read_text())
        cards = CardSet.restored(
            [_plain(c) for c in data["cards"]],
            base_dir=Path(data["base_dir"]) if data["base_dir"] else None,
            directory=directory,
        )
        if data["inputs"] != _inputs(directory, cards):
            return None
        policy = data["policy"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    remember_policy(
        directory / POLICY_FILE,
        PolicyConfig(
            quota=Quota(**policy["quota"]),
            quota_agents={k: Quota(**v) for k, v in policy["quota_agents"].items()},
            max_depth=policy["max_depth"],
            gate_to=policy["gate_to"],
            default_domain=policy["default_domain"],
            domains=tuple((p, d) for p, d in policy["domains"]),
            tainted=tuple((p, d) for p, d in policy["tainted"]),
            source=policy["source"],
            promote_to=policy["promote_to"],
        ),
    )
    return cards


def _write(directory: Path, cards: CardSet) -> None:
    """Remember ``cards`` (checked, with no problem) for the next process (best effort)."""
    try:
        policy = dataclasses.asdict(policy_config(directory))
    except FabricError:
        return
    data = {
        "inputs": _inputs(directory, cards),
        "base_dir": str(cards.base_dir) if cards.base_dir else None,
        "cards": [_tree(c) for c in cards],
        "policy": policy,
    }
    path = _path(directory)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)


# A card's class as {"$m": class name, "f": fields}; lists as lists. Only the classes of
# fabric.cards.schema are ever made back.
_CLASSES: dict[str, type[Any]] = {
    name: cls for name in schema.__all__ if isinstance(cls := getattr(schema, name), type)
}


def _tree(value: Any) -> Any:
    if _CLASSES.get(type(value).__name__) is type(value):
        fields = {f.name: _tree(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"$m": type(value).__name__, "f": fields}
    if isinstance(value, list | tuple):
        return [_tree(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"a card holds a {type(value).__name__}")


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        fields = {k: _plain(v) for k, v in value["f"].items()}
        # Checked when the snapshot was made: the plain class, no check again.
        return _CLASSES[value["$m"]](**fields)
    return value


__all__ = ["checked_cards", "daemon_cards"]
