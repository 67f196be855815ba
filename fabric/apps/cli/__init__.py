"""The ``agap`` command line.

Each concern lives in its own module (``board_cmd``, ``cards_cmd``, ``tasks_cmd``, …)
and registers its commands on :data:`main`. Errors the fabric raises on purpose print
as one line on stderr and exit non-zero; nothing else is caught.
"""

from __future__ import annotations

import importlib
import signal
import sys
from typing import Any

import click

from fabric.errors import FabricError
from fabric.settings.resolve import apply_config_files


class _FabricGroup(click.Group):
    """A click group that turns a :class:`FabricError` into one line and an exit code.

    Command modules are imported when a command is looked up, not when ``agap`` starts:
    a worker-facing command (``HOT``) imports only its own module, so a shell loop that
    heartbeats every few seconds does not pay for the web view, the keeper or A2A.
    """

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in HOT:
            importlib.import_module(f"fabric.apps.cli.{HOT[cmd_name]}")
        if cmd_name not in self.commands:
            _register()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        _register()
        return super().list_commands(ctx)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FabricError as exc:
            click.echo(f"agap: error: {exc.line()}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=_FabricGroup)
@click.version_option(package_name="agap-fabric")
@click.option(
    "--env-file",
    metavar="PATH",
    help="Read settings from this env file (as AGAP_ENV_FILE; it must exist). Without it: "
    "AGAP_ENV_FILE, else .agap.env (walking up), else ~/.config/agap/env.",
)
def main(env_file: str | None) -> None:
    """agap: a Kanboard-backed task fabric for AI agents."""
    # Settings from --env-file, AGAP_ENV_FILE, .agap.env or ~/.config/agap/env join the
    # environment (which wins), so every command and every process it starts sees one
    # resolution order. A runtime that launches us with a bare environment names its file.
    apply_config_files(named=env_file)


def run() -> None:
    """The ``agap`` executable: :data:`main`, with Ctrl-C before a command's own handling
    ending the process as SIGTERM does (no KeyboardInterrupt traceback mid-import). An
    ignored SIGINT stays ignored (``agap up``'s children are stopped with SIGTERM)."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    main()


COMMAND_MODULES = (
    "board_cmd",
    "cards_cmd",
    "tasks_cmd",
    "lease_cmd",
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
    "promote_cmd",
    "household_cmd",
    "doctor_cmd",
    "memory_cmd",
    "ops_cmd",
)


# The commands a runtime draining a queue from a shell calls in a loop, and their module;
# and the worker daemon, which `agap up` starts once per queue (it must stay small).
HOT = {name: "lease_cmd" for name in ("claim", "heartbeat", "complete", "fail", "ask")}
HOT["worker"] = "worker_cmd"
# A person's gestures at a shell are interactive: they skip the web view, the keeper's
# daemon and A2A too (docs/BENCHMARKS.md: `agap approve` signed in, whole process).
HOT.update(
    {
        name: "tasks_cmd"
        for name in (
            "submit",
            "show",
            "result",
            "ls",
            "resume",
            "cancel",
            "drop",
            "approve",
            "verify",
            "reopen",
            "revive",
        )
    }
)


def _register() -> None:
    # Imported for their side effect of adding commands to `main`.
    for name in COMMAND_MODULES:
        importlib.import_module(f"fabric.apps.cli.{name}")
