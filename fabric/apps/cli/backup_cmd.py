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
    """Export every fabric task (rows, all metadata, comments, files) to FILE (JSON);
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
    tasks = doc["tasks"]
    files = sum(len(t["files"]) for t in tasks)
    click.echo(
        f"backup: {len(tasks)} tasks, {files} files, "
        f"{len(doc['projects']['locks']['tags'])} lock tags -> {'stdout' if to_stdout else file}",
        err=to_stdout,
    )


@main.command("restore")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report (with the id map) as JSON.")
def restore_cmd(file: Path, as_json: bool) -> None:
    """Recreate the tasks in FILE (`-`: stdin) on an EMPTY board (refuses one that has
    fabric tasks).

    Layout from the cards (`agap init`), tasks in their columns and swimlanes, metadata,
    comments, files and lock tags. Uids are kept; numeric ids change (references follow).
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
                    "id_map": {str(k): v for k, v in report.id_map.items()},
                    "warnings": report.warnings,
                },
                indent=2,
                sort_keys=True,
            )
        )
        return
    click.echo(
        f"restore: {report.tasks} tasks ({report.closed} closed), {report.comments} "
        f"comments, {report.files} files, {report.lock_tags} lock tags"
    )
