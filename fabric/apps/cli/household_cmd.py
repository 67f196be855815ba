"""``agap household init``: your household's cards from a few questions (or a file)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from pydantic import TypeAdapter, ValidationError

from fabric.apps.cli import main
from fabric.cards import CardErrors, load_cards
from fabric.cards.fields import TIERS, tier_rank
from fabric.cards.files import read_yaml
from fabric.cards.household import Household, parse_hours, parse_quota, render
from fabric.cards.models import Slug, TimeZoneName, Url, Username
from fabric.cards.problems import validation_problems
from fabric.errors import InvalidInput
from fabric.policy_file import load_policy_config


@main.group("household")
def household() -> None:
    """Your own household: people, model endpoints, assistants (docs/HOUSEHOLD.md)."""


@household.command("init")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False), default="household")
@click.option(
    "--from",
    "answers",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Answer the questions from a household.yaml (one `init` wrote, or your own).",
)
def init_cmd(directory: Path, answers: Path | None) -> None:
    """Ask who lives here and which models you have; write and check DIRECTORY's cards.

    DIRECTORY (default household/) gets cards/, souls/, household.yaml (the answers) and
    env.example. Nothing is written unless every card checks; an existing, non-empty
    DIRECTORY is left alone.
    """
    if directory.exists() and any(directory.iterdir()):
        raise InvalidInput(
            f"{directory} already holds files",
            where=str(directory),
            hint="name a new folder (the answers can be reused: --from DIR/household.yaml)",
        )
    house = _from_file(answers) if answers else _interview()
    files = render(house)
    _write_checked(directory, files)
    n = {k: len(v) for k, v in (("people", house.people), ("endpoints", house.endpoints))}
    click.echo(
        f"agap household init: wrote {len(files)} files to {directory}/ "
        f"({n['people']} people, {n['endpoints']} endpoints, {len(house.assistants)} assistants); "
        "every card checks"
    )
    cards = directory / "cards"
    click.echo(
        "Next:\n"
        f"  agap cards ls --dir {cards}\n"
        f"  AGAP_CARDS_DIR={cards} make run      # your household on the demo board, offline\n"
        f"  agap compose render --cards {cards}   # the compose stack's workers and proxy config\n"
        f"The secrets the cards name are listed in {directory}/env.example."
    )


def _from_file(path: Path) -> Household:
    data, problems = read_yaml(path, str(path))
    if not problems:
        try:
            return Household.model_validate(data if data is not None else {})
        except ValidationError as exc:
            problems = validation_problems(str(path), exc)
    raise CardErrors(problems, where=str(path), hint="fix the answers and run it again")


def _write_checked(directory: Path, files: dict[str, str]) -> None:
    """Write ``files`` beside ``directory``, check them as `agap cards validate` does,
    then move them into place: a failed check leaves nothing behind."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        for rel, text in files.items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_text(text, encoding="utf-8")
        try:
            load_cards(staging / "cards")
        except CardErrors as exc:  # said of the folder asked for, not the staging one
            raise CardErrors(exc.problems, where=str(directory / "cards"), hint=exc.hint) from None
        load_policy_config(staging / "cards" / "_policy.yaml")
        if directory.exists():
            directory.rmdir()  # empty (checked above)
        os.replace(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# ---------------------------------------------------------------------------------------
# The questions


def _checker(adapter: TypeAdapter[Any]) -> Callable[[str], str]:
    def check(text: str) -> str:
        try:
            adapter.validate_python(text.strip())
        except ValidationError as exc:
            raise click.BadParameter(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return text.strip()

    return check


def _parsing(parse: Callable[[str], object]) -> Callable[[str], str]:
    def check(text: str) -> str:
        try:
            parse(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
        return text.strip()

    return check


_slug = _checker(TypeAdapter(Slug))
_username = _checker(TypeAdapter(Username))
_url = _checker(TypeAdapter(Url))
_zone = _checker(TypeAdapter(TimeZoneName))


def _optional(check: Callable[[str], str]) -> Callable[[str], str | None]:
    return lambda text: check(text) if text.strip() else None


def _host_zone() -> str:
    """The host's time zone name, else UTC (a person's hours are read in their zone)."""
    try:
        return Path("/etc/timezone").read_text().strip() or "UTC"
    except OSError:
        pass
    # /etc/localtime links into the zone database: .../zoneinfo/Europe/Berlin
    target = str(Path("/etc/localtime").resolve())
    return target.split("zoneinfo/", 1)[1] if "zoneinfo/" in target else "UTC"


def _interview() -> Household:
    click.echo("A few questions about your household; Enter takes the default in brackets.\n")
    people = _people()
    endpoints = _endpoints(people)
    assistants = _assistants(people, endpoints)
    gate_to = click.prompt(
        "Who decides a gate when no person submitted the work?",
        default=people[0]["username"],
        type=click.Choice([p["username"] for p in people]),
    )
    answers: dict[str, Any] = {
        "people": people,
        "endpoints": endpoints,
        "assistants": assistants,
        "gate_to": gate_to,
    }
    if any(e.get("vram_mb") for e in endpoints):
        answers["gpu_vram_mb"] = click.prompt(
            "The GPU's memory in MB", type=click.IntRange(min=1), default=8192
        )
    try:
        return Household.model_validate(answers)
    except ValidationError as exc:
        raise CardErrors(validation_problems("the answers", exc), hint="run it again") from None


def _people() -> list[dict[str, Any]]:
    click.echo("People: each gets a Kanboard user and a 'Waiting on me' column.")
    names = click.prompt("Their usernames, separated by commas", value_proc=_usernames)
    zone = _host_zone()
    people = []
    for username in names:
        p: dict[str, Any] = {"username": username}
        p["name"] = click.prompt(f"  {username}: display name", default=username.capitalize())
        p["timezone"] = click.prompt(f"  {username}: time zone", default=zone, value_proc=_zone)
        p["hours"] = click.prompt(
            f"  {username}: waking hours", default="08:00-23:00", value_proc=_parsing(parse_hours)
        )
        how = click.prompt(
            f"  {username}: told of urgent work by",
            type=click.Choice(["none", "matrix", "webhook"]),
            default="none",
        )
        if how == "matrix":
            p["matrix_room"] = click.prompt(f"  {username}: Matrix room id (!room:server)")
            p["homeserver"] = click.prompt(f"  {username}: homeserver URL", value_proc=_url)
        elif how == "webhook":
            p["webhook"] = click.prompt(f"  {username}: webhook URL", value_proc=_url)
        people.append(p)
    return people


def _usernames(text: str) -> list[str]:
    names = [_username(n) for n in text.split(",") if n.strip()]
    if not names:
        raise click.BadParameter("name at least one person")
    if len(set(names)) != len(names):
        raise click.BadParameter("a username appears twice")
    return names


_EXAMPLES = {
    "cloud": ("openai/gpt-4o-mini", None),
    "local": ("ollama/gemma3:4b", "http://127.0.0.1:11434"),
    "remote": ("openai/qwen3-14b", "http://192.168.1.20:8081/v1"),
}


def _endpoints(people: list[dict[str, Any]]) -> list[dict[str, Any]]:
    click.echo("\nModel endpoints: what the house can call (a cloud model, a local GPU, a remote node).")
    out: list[dict[str, Any]] = []
    while not out or click.confirm("Another endpoint?", default=False):
        where = click.prompt(
            "  where",
            type=click.Choice(["cloud", "local", "remote"]),
            default="cloud" if not out else "local",
        )
        model, base = _EXAMPLES[where]
        e: dict[str, Any] = {"where": where}
        e["id"] = click.prompt("  its id (a name for the card)", default=f"{where}-model", value_proc=_slug)
        e["model"] = click.prompt("  the model, as LiteLLM names it", default=model)
        e["tier"] = click.prompt(
            "  strength", type=click.Choice(TIERS), default="large" if where == "cloud" else "small"
        )
        if where == "cloud":
            e["quota"] = click.prompt(
                "  requests per window (Enter: no quota)",
                default="",
                show_default=False,
                value_proc=_optional(_parsing(parse_quota)),
            )
        else:
            e["api_base"] = click.prompt("  the URL it serves on", default=base, value_proc=_url)
        if where == "local":
            e["vram_mb"] = click.prompt(
                "  GPU memory it needs in MB (0: not on a GPU)", type=click.IntRange(min=0), default=0
            )
        if where == "remote":
            e["health_url"] = click.prompt("  its health URL", value_proc=_url)
            e["wake_command"] = (
                click.prompt("  command that wakes it (Enter: none)", default="", show_default=False) or None
            )
        e["private"] = click.confirm("  may it see the people's private context?", default=where != "cloud")
        out.append({k: v for k, v in e.items() if v is not None})
    return out


def _assistants(people: list[dict[str, Any]], endpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    click.echo("\nAssistants: personas with a soul file, thinking with the strongest fitting model.")
    private = [e["tier"] for e in endpoints if e["private"]]
    out: list[dict[str, Any]] = []
    while click.confirm("Add an assistant?" if not out else "Another assistant?", default=not out):
        a: dict[str, Any] = {
            "id": click.prompt("  its id", default=None if out else "assistant", value_proc=_slug)
        }
        a["name"] = click.prompt("  its name", default=a["id"].capitalize())
        if private:
            serves = click.prompt(
                "  whose private context may it see (usernames, 'all' or 'none')",
                default="all",
                value_proc=_serves,
            )
            if serves is not None:
                a["serves"] = serves
        else:
            click.echo("  (no endpoint may see private context, so it sees only what is shared)")
            a["serves"] = []
        # Only as strong as a model it may think with: private context needs one that sees it.
        usable = private if a.get("serves") != [] else [e["tier"] for e in endpoints]
        tiers = [t for t in TIERS if tier_rank(t) <= max(map(tier_rank, usable))]
        a["tier"] = click.prompt("  the strength it needs", type=click.Choice(tiers), default=tiers[-1])
        out.append(a)
    return out


def _serves(text: str) -> list[str] | None:
    if text.strip() == "all":
        return None
    return [] if text.strip() == "none" else _usernames(text)
