"""The layout's rules, checked on the source: who may import whom, and who may speak Kanboard.

These read the code (``ast``), not the running program, so a rule broken in a branch no
test exercises still fails here. Each failure names the file and line and says what to do.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fabric.embedded.rpc import procedure_names

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fabric", "workers", "keeper")

# The packages that speak Kanboard: the storage package, and the stand-in that imitates it.
STORAGE = "fabric.kanboard"
EMBEDDED = "fabric.embedded"
APPS = "fabric.apps"

# Raw Kanboard row fields: read only in the storage package, which turns rows into typed ones.
ROW_FIELDS = frozenset(
    {
        "column_id",
        "swimlane_id",
        "owner_id",
        "creator_id",
        "category_id",
        "is_active",
        "date_creation",
        "date_modification",
        "date_moved",
        "date_completed",
        "date_started",
        "date_due",
        "reference",
        "swimlane_name",
        "column_name",
    }
)

# The embedded stand-in may use only the storage port's vocabulary, never the fabric above it.
EMBEDDED_MAY_IMPORT = ("fabric.embedded", "fabric.kanboard.port", "fabric.kanboard.dates", "fabric.errors")


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module
    lines: list[str]

    @property
    def rel(self) -> str:
        return str(self.path.relative_to(ROOT))

    def within(self, *prefixes: str) -> bool:
        return any(self.name == p or self.name.startswith(p + ".") for p in prefixes)


def _modules() -> dict[str, Module]:
    out: dict[str, Module] = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            text = path.read_text()
            out[".".join(parts)] = Module(".".join(parts), path, ast.parse(text), text.splitlines())
    return out


MODULES = _modules()


def _target(mod: Module, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The project modules an import statement names (resolving relative imports)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = mod.name.split(".")
            if mod.path.name != "__init__.py":
                pkg = pkg[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join([*pkg, base] if base else pkg)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != mod.name:
            yield name


def _imports(mod: Module) -> Iterator[tuple[str, int]]:
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for target in _target(mod, node):
                yield target, node.lineno


def _function_imports(mod: Module) -> Iterator[ast.Import | ast.ImportFrom]:
    for fn in ast.walk(mod.tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    yield node


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that reach each other (strongly connected, more than one module)."""
    reach = {node: _reachable(edges, node) for node in edges}
    groups = {frozenset(n for n in reach[node] if node in reach.get(n, set())) | {node} for node in edges}
    return sorted(sorted(g) for g in groups if len(g) > 1)


def _reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(edges.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(edges.get(node, ()))
    return seen


def test_there_are_no_import_cycles() -> None:
    # Function-local imports count: hiding a cycle inside a function does not remove it.
    edges: dict[str, set[str]] = defaultdict(set)
    for mod in MODULES.values():
        edges[mod.name] |= {t for t, _ in _imports(mod)}
    cycles = _cycles(edges)
    assert not cycles, "import cycles (break them; a function-local import does not):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def _layer(name: str) -> str:
    if name.startswith(APPS):
        return "apps"
    if name.startswith(EMBEDDED):
        return "embedded"
    return name.split(".")[0]  # fabric (the library), workers, keeper


# Who may import whom. The library is at the bottom; the daemons use it; the applications
# sit on top of everything. The stand-in is used by applications (`agap up`) and tests only.
MAY_IMPORT = {
    "fabric": {"fabric"},
    "embedded": {"embedded", "fabric"},
    "workers": {"workers", "fabric"},
    "keeper": {"keeper", "fabric"},
    "apps": {"apps", "fabric", "workers", "keeper", "embedded"},
}


def test_layers_import_only_downwards() -> None:
    wrong = []
    for mod in MODULES.values():
        here = _layer(mod.name)
        for target, line in _imports(mod):
            if _layer(target) not in MAY_IMPORT[here]:
                wrong.append(f"{mod.rel}:{line}: {here} imports {target} ({_layer(target)})")
    assert not wrong, "layers import only downwards (library < workers, keeper < apps):\n" + "\n".join(wrong)


def test_the_embedded_board_depends_only_on_the_storage_port() -> None:
    wrong = [
        f"{mod.rel}:{line}: imports {target}"
        for mod in MODULES.values()
        if mod.within(EMBEDDED)
        for target, line in _imports(mod)
        if not any(target == p or target.startswith(p + ".") for p in EMBEDDED_MAY_IMPORT)
    ]
    assert not wrong, (
        "fabric/embedded may import only " + ", ".join(EMBEDDED_MAY_IMPORT) + ":\n" + "\n".join(wrong)
    )


# The library's foundations, bottom up. Each may import only itself and those before it:
# storage (fabric.kanboard) stands on the task model and the settings, never on a use
# case above it (submit, the ledger, policy); the task model knows nothing of storage.
FOUNDATIONS = (
    "fabric.plain",  # the dataclasses every other one is made of
    "fabric.errors",
    "fabric.durations",
    "fabric.settings",
    "fabric.signals",
    "fabric.httpwire",
    "fabric.task",
    "fabric.cards",
    "fabric.kanboard",
)


def _foundation(name: str) -> int | None:
    for i, base in enumerate(FOUNDATIONS):
        if name == base or name.startswith(base + "."):
            return i
    return None


def _upward(modules: dict[str, Module]) -> list[str]:
    wrong = []
    for mod in modules.values():
        level = _foundation(mod.name)
        if level is None:
            continue
        for target, line in _imports(mod):
            there = _foundation(target)
            if there is None or there > level:
                wrong.append(f"{mod.rel}:{line}: {mod.name} imports {target}")
    return wrong


def test_the_foundations_import_only_what_lies_beneath_them() -> None:
    wrong = _upward(MODULES)
    assert not wrong, (
        "each foundation imports only itself and those before it ("
        + " < ".join(FOUNDATIONS)
        + "); move the shared piece down:\n"
        + "\n".join(wrong)
    )


# Where a piece of vocabulary may be used: the card codec (and its seal) only inside
# storage; a queue reader only where the claim policy is wired (workers.queue builds it,
# the worker loop per connection); the "git+" prefix only in the one parser of git refs.
CARD_MODULE = "fabric.kanboard.card"


def _card_importers(modules: dict[str, Module]) -> list[str]:
    return [
        f"{mod.rel}:{line}: imports {target}"
        for mod in modules.values()
        if not mod.within(STORAGE)
        for target, line in _imports(mod)
        if target == CARD_MODULE
    ]


def test_the_card_and_its_seal_stay_in_storage() -> None:
    wrong = _card_importers(MODULES)
    assert not wrong, "ask TaskBoard (sealed, describe) instead of the card codec:\n" + "\n".join(wrong)


def _reader_builders(modules: dict[str, Module]) -> list[str]:
    allowed = {"workers.queue", "workers.loop"}
    return [
        f"{mod.rel}:{node.lineno}: QueueReader(...)"
        for mod in modules.values()
        if mod.name not in allowed
        for node in ast.walk(mod.tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "QueueReader"
    ]


def test_every_claimer_gets_its_reader_with_the_claim_policy() -> None:
    wrong = _reader_builders(MODULES)
    assert not wrong, "build readers with QueueReader.for_agent (the claim policy comes with it):\n" + (
        "\n".join(wrong)
    )


def _git_prefixes(modules: dict[str, Module]) -> list[str]:
    return [
        f"{mod.rel}:{line}"
        for mod in modules.values()
        if mod.name != "fabric.gitrefs"
        for text, line in _strings(mod)
        if text == "git+"
    ]


def test_git_refs_are_split_in_one_place() -> None:
    wrong = _git_prefixes(MODULES)
    assert not wrong, "split git+ refs with fabric.gitrefs.split_git_ref:\n" + "\n".join(wrong)


def test_every_function_local_import_says_why() -> None:
    silent = []
    for mod in MODULES.values():
        for node in _function_imports(mod):
            here = mod.lines[node.lineno - 1]
            above = mod.lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            if "#" not in here and not above.startswith("#"):
                silent.append(f"{mod.rel}:{node.lineno}: {here.strip()}")
    assert not silent, "hoist these imports, or say on the line why they are local:\n" + "\n".join(silent)


def _strings(mod: Module) -> Iterator[tuple[str, int]]:
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(mod.tree)
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.value, node.lineno


def _speaks_kanboard(mod: Module) -> bool:
    return mod.within(STORAGE, EMBEDDED)


def test_only_the_storage_package_names_kanboard_methods() -> None:
    methods = procedure_names()
    assert len(methods) > 50, "the embedded board's procedure registry looks empty"
    leaks = [
        f"{mod.rel}:{line}: {text!r}"
        for mod in MODULES.values()
        if not _speaks_kanboard(mod)
        for text, line in _strings(mod)
        if text in methods
    ]
    assert not leaks, f"Kanboard method names belong in {STORAGE} (add a typed method there):\n" + "\n".join(
        leaks
    )


_KEY = re.compile(r"^fabric\.([a-z0-9_]+)")
# Module paths (fabric.apps.deploy.health) are not keys; any other string under fabric. is.
_SUBPACKAGES = {p.name.removesuffix(".py") for p in (ROOT / "fabric").iterdir()}


def _keys(mod: Module) -> Iterator[tuple[str, int]]:
    for text, line in _strings(mod):
        m = _KEY.match(text)
        if m and m.group(1) not in _SUBPACKAGES:
            yield text, line


def test_only_the_storage_package_spells_a_metadata_key() -> None:
    leaks = [
        f"{mod.rel}:{line}: {text!r}"
        for mod in MODULES.values()
        if not mod.within(STORAGE)
        for text, line in _keys(mod)
    ]
    assert not leaks, f"metadata keys are spelled once, in {STORAGE}.layout:\n" + "\n".join(leaks)


def _row_reads(mod: Module) -> Iterator[tuple[str, int]]:
    """``x["field"]`` and ``x.get("field")`` where ``field`` is a raw Kanboard row field."""
    for node in ast.walk(mod.tree):
        key: ast.expr | None = None
        if not isinstance(node, ast.Subscript | ast.Call):
            continue
        if isinstance(node, ast.Subscript):
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"get", "pop", "setdefault"}
            and node.args
        ):
            key = node.args[0]
        if isinstance(key, ast.Constant) and key.value in ROW_FIELDS:
            yield str(key.value), node.lineno


def test_only_the_storage_package_reads_raw_rows() -> None:
    leaks = [
        f"{mod.rel}:{line}: reads {field!r}"
        for mod in MODULES.values()
        if not _speaks_kanboard(mod)
        for field, line in _row_reads(mod)
    ]
    assert not leaks, f"read the typed rows {STORAGE} returns, not Kanboard's fields:\n" + "\n".join(leaks)


def test_public_class_names_mean_one_thing() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for mod in MODULES.values():
        for node in mod.tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(mod.rel)
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, f"one class name, one meaning (rename one of each): {twice}"


@pytest.mark.parametrize("name", ["parse_duration", "fit"])
def test_a_helper_name_is_defined_once(name: str) -> None:
    defined = [
        mod.rel
        for mod in MODULES.values()
        for node in mod.tree.body
        if isinstance(node, ast.FunctionDef) and node.name == name
    ]
    assert len(defined) <= 1, f"{name} is defined in {defined}: keep one, with one grammar"


def test_the_rules_above_can_fail() -> None:
    # The checks are only worth something if they see what they look for.
    sample = ast.parse('row.get("column_id")\nx = "fabric.spec"\ny = "createTask"\n')
    mod = Module("keeper.sample", ROOT / "keeper" / "sample.py", sample, [])
    assert list(_row_reads(mod)) == [("column_id", 1)]
    assert sorted(t for t, _ in _strings(mod)) == ["column_id", "createTask", "fabric.spec"]
    assert list(_keys(mod)) == [("fabric.spec", 2)]
    assert "createTask" in procedure_names()
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    up = Module(
        "fabric.kanboard.sample",
        ROOT / "fabric" / "kanboard" / "sample.py",
        ast.parse("from fabric.submit import Receipt\nfrom fabric.task import State\n"),
        [],
    )
    assert _upward({up.name: up}) == [
        "fabric/kanboard/sample.py:1: fabric.kanboard.sample imports fabric.submit"
    ]
    user = Module(
        "keeper.sample",
        ROOT / "keeper" / "sample.py",
        ast.parse('from fabric.kanboard.card import parse_description\nr = QueueReader(b)\np = "git+"\n'),
        [],
    )
    assert _card_importers({user.name: user}) == ["keeper/sample.py:1: imports fabric.kanboard.card"]
    assert _reader_builders({user.name: user}) == ["keeper/sample.py:2: QueueReader(...)"]
    assert _git_prefixes({user.name: user}) == ["keeper/sample.py:3"]
