"""``agap promote``: share one of a person's private files, with their approval (docs/POLICY.md §3)."""

from __future__ import annotations

import json

import click

from fabric.apps.cli import main
from fabric.core import Fabric
from fabric.events.attach import attach_submitter
from fabric.promotion import promote


@main.command("promote")
@click.argument("ref")
@click.option("--owner", required=True, help="The person whose private domain REF is in.")
@click.option("--json", "as_json", is_flag=True)
def promote_cmd(ref: str, owner: str, as_json: bool) -> None:
    """Ask OWNER to share the file REF; once they approved, copy it to the shared folder.

    The first run puts an approval task into OWNER's inbox. Only OWNER's own approval
    counts: a comment starting with "approve" from their Kanboard user, then the card
    moved to Done. Run it again afterwards: it copies exactly the approved content to
    `promote_to` (cards/_policy.yaml) and prints the copy's ref, which is shared.
    """
    fab = Fabric.connect()
    attach_submitter(fab)  # the owner's inbox wakes like any other submit
    out = promote(fab, ref, owner)
    plan = out.plan
    data = {
        "state": out.state,
        "task": f"task:{out.task_id}",
        "task_id": out.task_id,
        "owner": plan.owner,
        "object": plan.ref,
        "sha256": plan.digest,
        "shared_ref": plan.copy_ref if out.state == "shared" else None,
    }
    if out.state == "shared":
        text = f"{plan.copy_ref} is shared (approved by {plan.owner} on task:{out.task_id})"
    else:
        text = (
            f"task:{out.task_id} waits on {plan.owner}: a comment 'approve' from {plan.owner}, then "
            f"the card to Done, shares {plan.ref} (sha256 {plan.digest[:12]}…); run this again then"
        )
    click.echo(json.dumps(data, indent=2, sort_keys=True) if as_json else text)
