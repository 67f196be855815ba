"""What a CLI process imports: never litellm (CLI, keeper), and for a worker-facing command
only its own module and neither pydantic nor yaml (the cards come from the checked
snapshot), so a shell loop's heartbeat does not pay for the rest of `agap`.
tests/integration/test_start_imports.py runs the same commands against a board."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fabric.apps.cli import HOT
from tests.conftest import ROOT

_PROBE = """
import json, sys
from fabric.apps.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
if {everything}:
    from fabric.apps.cli import _register
    import keeper.daemon
    _register()
ours = ("fabric", "keeper", "workers", "litellm", "pydantic", "pydantic_core", "yaml")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ours)))
"""


def imported(*args: str, everything: bool = False) -> set[str]:
    code = _PROBE.replace("{everything}", str(everything))
    out = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_no_cli_command_and_not_the_keeper_imports_litellm() -> None:
    mods = imported("--help", everything=True)
    assert "fabric.apps.cli.a2a_cmd" in mods and "keeper.daemon" in mods, "the probe loaded everything"
    assert not {m for m in mods if m.split(".")[0] == "litellm"}


def test_a_heartbeat_imports_only_the_worker_commands() -> None:
    mods = imported("heartbeat", "--help")
    assert "fabric.apps.cli.lease_cmd" in mods
    heavy = {"fabric.apps.web", "fabric.apps.cli.a2a_cmd", "fabric.apps.cli.up_cmd", "keeper.daemon"}
    assert not mods & heavy, mods & heavy


@pytest.mark.parametrize("command", ["claim", "heartbeat", "complete", "fail", "ask", "worker"])
def test_a_worker_facing_command_imports_neither_pydantic_nor_yaml(command: str) -> None:
    mods = imported(command, "--help")
    assert f"fabric.apps.cli.{HOT[command]}" in mods, "the probe loaded the command"
    assert not {m for m in mods if m.split(".")[0] in ("pydantic", "pydantic_core", "yaml")}


_GENERATED = """
import dataclasses, inspect, json, sys
import fabric.apps.cli.lease_cmd, fabric.apps.cli.worker_cmd, workers.assembly
from fabric.plain import Plain
ours = ("fabric", "keeper", "workers")
made = sorted(
    f"{name}.{cls.__name__}"
    for name, mod in list(sys.modules.items())
    if name.split(".")[0] in ours
    for cls in vars(mod).values()
    if inspect.isclass(cls) and cls.__module__ == name
    and dataclasses.is_dataclass(cls) and not issubclass(cls, Plain)
)
print(json.dumps(made))
"""


def test_what_a_worker_facing_command_imports_makes_no_class_by_code_generation() -> None:
    # A dataclass compiles its methods (about 4.7 M instructions a frozen class); these
    # modules use fabric.plain.Plain, which behaves alike without (fabric/plain.py).
    out = subprocess.run(
        [sys.executable, "-c", _GENERATED], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout) == []


def test_the_probe_sees_pydantic_where_it_is_imported() -> None:
    # The check above can fail: all of `agap` (`agap household` asks with pydantic) shows it.
    assert "pydantic" in imported("cards", "--help", everything=True) - imported("heartbeat", "--help")
