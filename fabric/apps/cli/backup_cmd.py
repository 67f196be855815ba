"""``agap backup`` and ``agap restore``: every fabric task to a file, and back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from fabric.apps.cli import main
from fabric.apps.deploy.backup import dump_backup, export_board, read_backup, restore, write_backup
from fabric.cards import load_cards
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings


@main.command("backup")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def backup_cmd(file: Path) -> None:
    """Export every project the fabric made (the work project, the confined agents' homes,
    the quota project) with every task (rows, all metadata, comments, files) to FILE (JSON);
    FILE `-` writes it to stdout (the summary goes to stderr), for a container whose user
    cannot write the host's backup folder.

    Complements, never replaces, the database dump: see docs/OPERATIONS.md.
    """

    settings = Settings.from_env()
    url, token = settings.require_board()
    doc = export_board(KanboardClient(url, token), settings)
    to_stdout = str(file) == "-"
    if to_stdout:
        # Written whole, after the export finished: a failed export writes nothing.
        sys.stdout.write(dump_backup(doc) + "\n")
        sys.stdout.flush()
    else:
        write_backup(doc, file)
    homes = doc["homes"]
    tasks = [*doc["tasks"], *(t for h in homes.values() for t in h["tasks"])]
    files = sum(len(t["files"]) for t in tasks)
    locks = len(doc["projects"]["locks"]["tags"]) + sum(
        len(h["projects"]["locks"]["tags"]) for h in homes.values()
    )
    where = f" ({len(doc['tasks'])} in the work project, {len(homes)} homes)" if homes else ""
    click.echo(
        f"backup: {len(tasks)} tasks{where}, {files} files, {locks} lock tags"
        + (f", {len(doc['projects']['quota']['tags'])} quota tags" if "quota" in doc["projects"] else "")
        + f" -> {'stdout' if to_stdout else file}",
        err=to_stdout,
    )


@main.command("restore")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report (with the id map) as JSON.")
def restore_cmd(file: Path, as_json: bool) -> None:
    """Recreate the projects and tasks in FILE (`-`: stdin) on a board where none of them
    holds tasks or tags (refuses one that does, and a home the cards do not make).

    Layout from the cards (`agap init`: homes, users, memberships), each task in its own
    project, column and swimlane, metadata, comments, files, lock tags, quota slot tags and
    the members `agap init` does not make. Uids are kept; numeric ids change (references
    follow).
    """

    doc = read_backup(file, sys.stdin.read() if str(file) == "-" else None)
    settings = Settings.from_env()
    url, token = settings.require_board()
    report = restore(KanboardClient(url, token), settings, load_cards(settings.cards_dir), doc)
    for warning in report.warnings:
        click.echo(f"agap restore: warning: {warning}", err=True)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "tasks": report.tasks,
                    "closed": report.closed,
                    "comments": report.comments,
                    "files": report.files,
                    "lock_tags": report.lock_tags,
                    "homes": report.homes,
                    "quota_tags": report.quota_tags,
                    "members": report.members,
                    "id_map": {str(k): v for k, v in report.id_map.items()},
                    "warnings": report.warnings,
                },
                indent=2,
                sort_keys=True,
            )
        )
        return
    homes = "".join(f", {n} in the home of {agent}" for agent, n in sorted(report.homes.items()))
    click.echo(
        f"restore: {report.tasks} tasks ({report.closed} closed{homes}), {report.comments} "
        f"comments, {report.files} files, {report.lock_tags} lock tags"
        + (f", {report.quota_tags} quota tags" if report.quota_tags else "")
        + (f", {report.members} members added" if report.members else "")
    )
