"""The ``agap`` command line.

Each concern lives in its own module (``board_cmd``, ``cards_cmd``, ``tasks_cmd``, …)
and registers its commands on :data:`main`. Errors the fabric raises on purpose print
as one line on stderr and exit non-zero; nothing else is caught.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from fabric.errors import FabricError
from fabric.settings.resolve import apply_config_files


class _FabricGroup(click.Group):
    """A click group that turns a :class:`FabricError` into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FabricError as exc:
            click.echo(f"agap: error: {exc.line()}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=_FabricGroup)
@click.version_option(package_name="agap-fabric")
def main() -> None:
    """agap: a Kanboard-backed task fabric for AI agents."""
    # Settings from AGAP_ENV_FILE and .agap.env join the environment (which wins), so
    # every command and every process it starts sees one resolution order.
    apply_config_files()


COMMAND_MODULES = (
    "board_cmd",
    "cards_cmd",
    "tasks_cmd",
    "worker_cmd",
    "keeper_cmd",
    "up_cmd",
    "a2a_cmd",
    "config_cmd",
    "compose_cmd",
    "backup_cmd",
    "eval_cmd",
    "route_cmd",
    "cron_cmd",
    "watch_cmd",
    "workspace_cmd",
    "mcp_cmd",
)


def _register() -> None:
    # Imported for their side effect of adding commands to `main`.
    for name in COMMAND_MODULES:
        importlib.import_module(f"fabric.apps.cli.{name}")


_register()
