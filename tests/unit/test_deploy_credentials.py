"""`agap compose render` gives each worker only its own board credential."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from fabric.apps.deploy.render import rendered, workers_compose
from fabric.cards import CardSet
from fabric.kanboard.principals import confined

ROOT = Path(__file__).resolve().parents[2]
REF = re.compile(r"^\$\{(?P<var>[A-Z0-9_]+):\?set (?P=var) in compose/\.env\}$")


def _secret_refs(env: dict[str, str]) -> set[str]:
    """The variables of compose/.env this environment names anywhere in its values."""
    return set(
        re.findall(r"\$\{(AGAP_BOARD_PASSWORD_[A-Z0-9_]+|KANBOARD_API_TOKEN)\b", " ".join(env.values()))
    )


def test_a_confined_worker_gets_its_own_user_and_no_app_token(cards: CardSet) -> None:
    services = workers_compose(cards)["services"]
    for card in (c for c in cards if confined(c)):
        env = services[f"worker-{card.queue_name}"]["environment"]
        var = f"AGAP_BOARD_PASSWORD_{card.id.upper().replace('-', '_')}"
        assert "KANBOARD_API_TOKEN" not in env
        assert env["AGAP_BOARD_USER"] == f"agap-{card.id}"
        match = REF.match(env["AGAP_BOARD_PASSWORD"])
        assert match and match["var"] == var, "a reference to compose/.env, never a value"
        assert _secret_refs(env) == {var}, "its own password, and no other credential"


def test_a_trusted_worker_keeps_the_app_token_and_no_agent_password(cards: CardSet) -> None:
    services = workers_compose(cards)["services"]
    trusted = [s for name, s in services.items() if name.startswith("worker-")]
    trusted = [s for s in trusted if "AGAP_BOARD_USER" not in s["environment"]]
    assert trusted, "the cards have trusted workers"
    for svc in trusted:
        assert _secret_refs(svc["environment"]) == {"KANBOARD_API_TOKEN"}


def test_init_gets_every_agent_password_and_env_example_names_them_empty(
    cards: CardSet, tmp_path: Path
) -> None:
    services = workers_compose(cards)["services"]
    init, keeper = services["init"]["environment"], services["keeper"]["environment"]
    agents = sorted(c.id for c in cards if confined(c))
    assert agents == ["researcher", "torgash"]
    for agent in agents:
        var = f"AGAP_BOARD_PASSWORD_{agent.upper()}"
        assert init[var] == f"${{{var}:-}}"  # `agap init` runs in the stack's `init` service
        assert var not in keeper  # and only there
    files = rendered(cards, tmp_path)
    example = files[tmp_path / ".env.example"]
    for agent in agents:
        assert f"\nAGAP_BOARD_PASSWORD_{agent.upper()}=\n" in example
    stack = yaml.safe_load(files[tmp_path / "docker-compose.workers.yml"])
    assert stack["services"]["worker-torgash"]["environment"]["AGAP_BOARD_USER"] == "agap-torgash"


def test_each_home_has_a_keeper_with_the_home_s_projects(cards: CardSet) -> None:
    services = workers_compose(cards)["services"]
    for card in (c for c in cards if confined(c)):
        env = services[f"keeper-{card.queue_name}"]["environment"]
        assert env["AGAP_PROJECT"] == "${AGAP_PROJECT:-Agent Fabric}: " + card.id
        assert env["AGAP_LOCKS_PROJECT"] == "${AGAP_LOCKS_PROJECT:-Agent Fabric Locks}: " + card.id
        assert env["KANBOARD_API_TOKEN"].startswith("${KANBOARD_API_TOKEN:?")
        assert services[f"keeper-{card.queue_name}"]["command"] == ["agap", "keeper"]
