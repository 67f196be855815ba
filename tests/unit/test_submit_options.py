"""The submit options are declared once (fabric.submit.SUBMIT_OPTIONS): the Python API,
``agap submit`` and the MCP ``submit_task`` tool all take exactly those."""

from __future__ import annotations

import inspect

from click.testing import CliRunner

from fabric.apps.cli import main
from fabric.apps.mcp.agent import AgentTools
from fabric.apps.mcp.server import submit_signature
from fabric.core import Fabric
from fabric.submit import SUBMIT_OPTIONS

NAMES = {opt.name for opt in SUBMIT_OPTIONS}


def _keywords(fn: object) -> set[str]:
    params = inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
    return {p.name for p in params if p.kind == inspect.Parameter.KEYWORD_ONLY}


def test_fabric_submit_takes_the_declared_options_and_the_actor() -> None:
    assert _keywords(Fabric.submit) == NAMES | {"actor"}


def test_the_mcp_agent_submits_with_the_declared_options() -> None:
    assert _keywords(AgentTools.submit) == NAMES
    assert list(submit_signature().parameters) == ["intent", *(o.name for o in SUBMIT_OPTIONS)]


def test_agap_submit_offers_every_declared_option_with_its_help() -> None:
    text = CliRunner().invoke(main, ["submit", "--help"], terminal_width=400).output
    for opt in SUBMIT_OPTIONS:
        assert opt.cli_flag in text, opt.cli_flag
        assert opt.help.split("(")[0].strip()[:30] in " ".join(text.split()), opt.help
