"""One exit-code table: every error's code is in it, commands name codes by constant, and the
README's table is the generated one."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

from click.testing import CliRunner

import fabric
import keeper
import workers
from fabric.apps.cli import main
from fabric.errors import EXIT_CODES, EXIT_TABLE_BEGIN, EXIT_TABLE_END, FabricError, exit_code_table

ROOT = Path(__file__).resolve().parents[2]


def _all_errors() -> list[type[FabricError]]:
    for package in (fabric, workers, keeper):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.name.endswith("__main__"):  # running it is the command line, not a module
                importlib.import_module(info.name)
    found, todo = [], [FabricError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_exits_with_a_code_from_the_table() -> None:
    wrong = [
        f"{c.__module__}.{c.__name__}: {c.exit_code}" for c in _all_errors() if c.exit_code not in EXIT_CODES
    ]
    assert not wrong, "exit codes outside fabric.errors.EXIT_CODES:\n" + "\n".join(wrong)


def _literal_exits(text: str, label: str) -> list[str]:
    """``sys.exit(3)``, ``SystemExit(4)``, ``exit_code = 2``: a code spelled as a number."""
    out = []
    for node in ast.walk(ast.parse(text)):
        value: ast.expr | None = None
        if not isinstance(node, ast.Call | ast.Assign):
            continue
        if isinstance(node, ast.Call) and node.args:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("exit", "SystemExit"):
                value = node.args[0]
        elif isinstance(node, ast.Assign) and any(
            getattr(t, "id", getattr(t, "attr", "")) == "exit_code" for t in node.targets
        ):
            value = node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, int) and value.value != 0:
            out.append(f"{label}:{node.lineno}")
    return out


def test_codes_are_named_not_numbered() -> None:
    found = [
        hit
        for top in ("fabric", "workers", "keeper")
        for path in sorted((ROOT / top).rglob("*.py"))
        if path != ROOT / "fabric" / "errors.py"
        for hit in _literal_exits(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, "use the EXIT_* names from fabric.errors:\n" + "\n".join(found)


def test_the_readme_table_is_the_generated_one() -> None:
    result = CliRunner().invoke(main, ["config", "exit-codes"])
    assert result.exit_code == 0 and result.output == exit_code_table()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start, end = text.find(EXIT_TABLE_BEGIN), text.find(EXIT_TABLE_END)
    assert 0 <= start < end, "README.md has lost the exit-code table's markers"
    assert text[start : end + len(EXIT_TABLE_END)] + "\n" == exit_code_table(), (
        "README.md's exit-code table is stale: paste `agap config exit-codes` over it"
    )


def test_the_check_sees_a_numbered_code() -> None:
    sample = "import sys\nsys.exit(3)\nclass E:\n    exit_code = 4\nsys.exit(0)\n"
    assert _literal_exits(sample, "s.py") == ["s.py:2", "s.py:4"]
