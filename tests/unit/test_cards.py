"""Agent cards: the shipped set loads, and every rule refuses with the file and the field."""

from __future__ import annotations

import shutil
import textwrap
from dataclasses import FrozenInstanceError, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from fabric.cards import (
    TIERS,
    TRUST_ORDER,
    AlwaysSpec,
    CardErrors,
    CardProblem,
    CardSet,
    GoldenExpect,
    HoursSpec,
    QuotaSpec,
    load_cards,
    load_golden,
    models,
    tier_rank,
    trust_rank,
)
from fabric.cards.models import check_card
from fabric.durations import parse_duration
from fabric.errors import InvalidInput

REPO = Path(__file__).resolve().parents[2]

MODEL = """
id: m1
kind: model
name: Model one
tier: small
trust: trusted
runtime: {mode: demo}
"""

HUMAN = """
id: ann
kind: human
name: Ann
trust: human
privacy_domains: [shared, private:ann]
availability:
  - {shape: hours, timezone: Europe/Berlin, start: "08:00", end: "22:00"}
runtime: {mode: human}
human: {username: ann, display_name: Ann}
"""


def write(root: Path, name: str, text: str) -> Path:
    path = root / "cards" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def problems(root: Path) -> list[str]:
    with pytest.raises(CardErrors) as info:
        load_cards(root / "cards")
    return [str(p) for p in info.value.problems]


def one_problem(root: Path) -> str:
    found = problems(root)
    assert len(found) == 1, found
    return found[0]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of the shipped cards and souls, to break one thing at a time."""
    shutil.copytree(REPO / "cards", tmp_path / "cards")
    shutil.copytree(REPO / "souls", tmp_path / "souls")
    return tmp_path


# --- the shipped cards -------------------------------------------------------------------


def test_shipped_cards_load() -> None:
    cards = load_cards(REPO / "cards")
    assert [c.id for c in cards] == sorted(
        [
            "adolf",
            "alvis",
            "claude-coder",
            "elizaveta",
            "gemma-local",
            "kimi",
            "ops",
            "qwen-remote",
            "researcher",
            "router",
            "torgash",
        ]
    )
    assert cards.queues() == sorted(c.id for c in cards)
    assert [c.id for c in cards.humans()] == ["alvis", "elizaveta"]
    assert [c.id for c in cards.models()] == ["gemma-local", "kimi", "qwen-remote"]
    assert cards.by_queue("kimi").id == "kimi"
    assert cards.human_by_username("elizaveta").id == "elizaveta"
    persona = cards.persona_path("adolf")
    assert persona is not None and persona.is_file()


def test_shipped_cards_say_what_the_design_says() -> None:
    cards = load_cards(REPO / "cards")
    kimi = cards.get("kimi")
    quota = kimi.availability[0]
    assert isinstance(quota, QuotaSpec)
    assert (quota.limit, quota.window_seconds, quota.second_limit) == (60, 5 * 3600, 300)
    assert quota.second_window_seconds == 7 * 86400
    assert quota.reserve_interactive == 0.2
    assert cards.get("gemma-local").shapes == ["gpu"]
    assert cards.get("qwen-remote").shapes == ["on_demand"]
    assert cards.get("adolf").runtime.interactive
    assert cards.get("claude-coder").runtime.mode == "external"
    assert cards.get("torgash").privacy_domains == ["shared"]
    assert cards.get("researcher").trust == "untrusted"
    for card in cards:
        assert card.is_human == (card.trust == "human")
        # claude-coder and the ops-agent (agap ops) are external runtimes: no worker of ours.
        if not card.is_human and card.id not in ("claude-coder", "ops"):
            assert card.runtime.mode == "demo", f"{card.id} must run offline by default"


def test_shipped_golden_set_loads() -> None:
    golden = load_golden(REPO / "cards" / "golden" / "adolf.yaml")
    assert golden.agent == "adolf"
    assert len(golden.cases) >= 10


def test_get_unknown_agent_names_the_known_ones() -> None:
    cards = load_cards(REPO / "cards")
    with pytest.raises(InvalidInput) as info:
        cards.get("nobody")
    assert "unknown agent 'nobody'" in info.value.line()
    assert "known: adolf, alvis" in info.value.line()
    with pytest.raises(InvalidInput, match="unknown queue"):
        cards.by_queue("nowhere")


def test_matching_filters_by_tier_floor_and_capabilities() -> None:
    cards = load_cards(REPO / "cards")
    assert [c.id for c in cards.matching(tier="medium")] == ["kimi", "qwen-remote"]
    assert [c.id for c in cards.matching(tier="large", capabilities=["tools"])] == ["kimi"]
    assert cards.matching(capabilities=["vision"]) == []
    with pytest.raises(InvalidInput, match="unknown tier"):
        cards.matching(tier="huge")


# --- directory handling ------------------------------------------------------------------


def test_missing_directory_is_an_error_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(CardErrors) as info:
        load_cards(tmp_path / "nope")
    assert "no such directory" in info.value.line()
    assert "--dir" in info.value.line()


def test_empty_directory_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "cards").mkdir()
    assert "no agent cards here" in one_problem(tmp_path)


def test_underscore_files_and_subfolders_are_not_cards(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL)
    write(tmp_path, "_template.yaml", "this: [is not, a card")
    write(tmp_path, "golden/m1.yaml", "agent: m1\n")
    write(tmp_path, "README.md", "# notes\n")
    assert [c.id for c in load_cards(tmp_path / "cards")] == ["m1"]


def test_base_dir_defaults_to_the_parent_of_the_directory(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL)
    cards = load_cards(tmp_path / "cards")
    assert cards.base_dir == (tmp_path).resolve()


# --- file level problems -----------------------------------------------------------------


def test_malformed_yaml_reports_file_and_line(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", "id: m1\nkind: model\n  name: broken\n")
    line = one_problem(tmp_path)
    assert line.startswith("cards/m1.yaml:3: YAML error")


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL + "tier: large\n")
    line = one_problem(tmp_path)
    assert line.startswith("cards/m1.yaml:7:")
    assert "duplicate key 'tier'" in line


def test_empty_and_non_mapping_files(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", "")
    write(tmp_path, "m2.yaml", "- a\n- b\n")
    assert problems(tmp_path) == [
        "cards/m1.yaml: empty file",
        "cards/m2.yaml: a card must be a YAML mapping of key: value",
    ]


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL.replace("tier: small", "tier: huge"))
    write(tmp_path, "m2.yaml", MODEL.replace("m1", "m2") + "colour: red\n")
    found = problems(tmp_path)
    assert len(found) == 2
    with pytest.raises(CardErrors) as info:
        load_cards(tmp_path / "cards")
    assert info.value.exit_code == 2
    text = info.value.line()
    assert "2 problems in agent cards" in text
    assert all(line in text.splitlines() for line in found)


def test_problem_line_format() -> None:
    problem = CardProblem("cards/kimi.yaml", "availability.0.limit", "must be greater than 0")
    assert str(problem) == "cards/kimi.yaml: availability.0.limit: must be greater than 0"
    assert str(CardProblem("cards/a.yaml", "", "YAML error", line=4)) == "cards/a.yaml:4: YAML error"


# --- field level problems ----------------------------------------------------------------


def test_unknown_field_is_an_error_with_a_suggestion(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL + "capabilites: [chat]\n")
    assert one_problem(tmp_path) == (
        "cards/m1.yaml: capabilites: unknown field (did you mean 'capabilities'?)"
    )


def test_unknown_nested_field_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL.replace("{mode: demo}", "{mode: demo, leese_seconds: 9}"))
    assert one_problem(tmp_path).startswith("cards/m1.yaml: runtime.leese_seconds: unknown field")


def test_quota_limit_must_be_positive(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL + "availability:\n  - {shape: quota, limit: 0, window: 5h}\n")
    assert one_problem(tmp_path) == "cards/m1.yaml: availability.0.limit: must be greater than 0"


def test_quota_second_limit_needs_second_window(tmp_path: Path) -> None:
    write(
        tmp_path,
        "m1.yaml",
        MODEL + "availability:\n  - {shape: quota, limit: 5, window: 5h, second_limit: 9}\n",
    )
    assert one_problem(tmp_path) == (
        "cards/m1.yaml: availability.0.second_window: second_limit and second_window go together"
    )


def test_reserve_interactive_is_a_fraction(tmp_path: Path) -> None:
    write(
        tmp_path,
        "m1.yaml",
        MODEL + "availability:\n  - {shape: budget, usd: 5, period: 7d, reserve_interactive: 1.5}\n",
    )
    assert one_problem(tmp_path) == ("cards/m1.yaml: availability.0.reserve_interactive: must be at most 1")


def test_unknown_and_missing_shape(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL + "availability:\n  - {shape: sometimes}\n  - {limit: 3}\n")
    found = problems(tmp_path)
    assert found[0].startswith("cards/m1.yaml: availability.0: unknown shape 'sometimes'")
    assert found[1].startswith("cards/m1.yaml: availability.1: needs a 'shape'")


def test_empty_availability_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL + "availability: []\n")
    assert one_problem(tmp_path) == "cards/m1.yaml: availability: must not be empty"


def test_bad_duration_in_a_card(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL + "availability:\n  - {shape: quota, limit: 5, window: 5x}\n")
    line = one_problem(tmp_path)
    assert line.startswith("cards/m1.yaml: availability.0.window: bad duration '5x'")
    write(tmp_path, "m1.yaml", MODEL + "availability:\n  - {shape: quota, limit: 5, window: 300}\n")
    assert "needs a unit: write '300s'" in one_problem(tmp_path)


def test_on_demand_health_url_must_be_http(tmp_path: Path) -> None:
    write(
        tmp_path,
        "m1.yaml",
        MODEL + "availability:\n  - {shape: on_demand, health_url: 'ftp://node/health'}\n",
    )
    assert one_problem(tmp_path) == (
        "cards/m1.yaml: availability.0.health_url: must be an http:// or https:// URL"
    )


def test_url_with_password_is_refused(tmp_path: Path) -> None:
    write(
        tmp_path,
        "m1.yaml",
        MODEL.replace("{mode: demo}", "{mode: demo, api_base: 'http://u:hunter2@h:4000'}"),
    )
    line = one_problem(tmp_path)
    assert line.startswith("cards/m1.yaml: runtime.api_base: must not carry a password")
    assert "hunter2" not in line


def test_gpu_shape_and_residency_must_agree(tmp_path: Path) -> None:
    text = MODEL + "availability:\n  - {shape: gpu, vram_mb: 3000}\ngpu: {vram_mb: 3300}\n"
    write(tmp_path, "m1.yaml", text)
    assert one_problem(tmp_path) == (
        "cards/m1.yaml: availability.0.vram_mb: 3000 differs from gpu.vram_mb 3300"
    )


def test_hours_shape_checks_zone_time_and_days(tmp_path: Path) -> None:
    write(
        tmp_path,
        "m1.yaml",
        MODEL
        + "availability:\n"
        + "  - {shape: hours, timezone: Mars/Base, start: '08:00', end: '25:00',\n"
        + "     days: [mon, moon]}\n",
    )
    found = problems(tmp_path)
    assert any(f.startswith("cards/m1.yaml: availability.0.timezone: 'Mars/Base'") for f in found)
    assert any(f.startswith("cards/m1.yaml: availability.0.end: '25:00'") for f in found)
    assert any(f.startswith("cards/m1.yaml: availability.0.days.1: must be one of") for f in found)


def test_unquoted_times_are_read_as_text(tmp_path: Path) -> None:
    # YAML 1.1 would read 22:30 as the number 1350; cards read it as the time it looks like.
    write(tmp_path, "ann.yaml", HUMAN.replace('end: "22:00"', "end: 22:30"))
    hours = load_cards(tmp_path / "cards").get("ann").availability[0]
    assert isinstance(hours, HoursSpec)
    assert hours.end == "22:30"


def test_yes_is_not_a_boolean(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL.replace("{mode: demo}", "{mode: demo, interactive: yes}"))
    assert one_problem(tmp_path) == "cards/m1.yaml: runtime.interactive: must be true or false"


def test_strings_are_not_numbers(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL.replace("{mode: demo}", "{mode: demo, concurrency: '2'}"))
    assert one_problem(tmp_path) == "cards/m1.yaml: runtime.concurrency: must be a whole number"


def test_bad_id_pattern(tmp_path: Path) -> None:
    write(tmp_path, "M1.yaml", MODEL.replace("id: m1", "id: M1"))
    assert one_problem(tmp_path).startswith("cards/M1.yaml: id: 'M1' must be 2-39 characters")


def test_id_must_equal_file_stem(tmp_path: Path) -> None:
    write(tmp_path, "other.yaml", MODEL)
    assert one_problem(tmp_path) == ("cards/other.yaml: id: 'm1' must equal the file name 'other'")


# --- card rules --------------------------------------------------------------------------


def test_human_kind_needs_human_trust(tmp_path: Path) -> None:
    write(tmp_path, "ann.yaml", HUMAN.replace("trust: human", "trust: trusted"))
    assert one_problem(tmp_path) == "cards/ann.yaml: trust: a kind: human card must have trust: human"


def test_human_trust_needs_human_kind(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL.replace("trust: trusted", "trust: human"))
    assert one_problem(tmp_path) == "cards/m1.yaml: trust: trust: human is only for kind: human cards"


def test_human_card_needs_human_block_and_runtime(tmp_path: Path) -> None:
    text = HUMAN.replace("runtime: {mode: human}", "runtime: {mode: demo}")
    text = text.replace("human: {username: ann, display_name: Ann}\n", "")
    write(tmp_path, "ann.yaml", text)
    found = problems(tmp_path)
    assert "cards/ann.yaml: runtime.mode: a kind: human card must have runtime mode: human" in found
    assert any(f.startswith("cards/ann.yaml: human: required for kind: human") for f in found)


def test_human_runtime_only_for_humans(tmp_path: Path) -> None:
    write(
        tmp_path,
        "p1.yaml",
        "id: p1\nkind: persona\nname: P\ntrust: trusted\nruntime: {mode: human}\n",
    )
    assert one_problem(tmp_path) == ("cards/p1.yaml: runtime.mode: mode: human is only for kind: human cards")


@pytest.mark.parametrize("trust", ["sandboxed", "untrusted"])
def test_low_trust_agent_may_not_read_a_private_domain(tmp_path: Path, trust: str) -> None:
    write(tmp_path, "ann.yaml", HUMAN)
    write(
        tmp_path,
        "spy.yaml",
        f"""
        id: spy
        kind: persona
        name: Spy
        trust: {trust}
        privacy_domains: [shared, private:ann]
        runtime: {{mode: demo}}
        """,
    )
    assert one_problem(tmp_path) == (
        f"cards/spy.yaml: privacy_domains.1: a {trust} agent may not read private:ann; "
        "it sees only shared domains"
    )


def test_private_domain_must_name_a_human(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL + "privacy_domains: [shared, private:bob]\n")
    assert one_problem(tmp_path) == (
        "cards/m1.yaml: privacy_domains.1: private:bob names no human card (known: none)"
    )


def test_human_reads_only_their_own_private_domain(tmp_path: Path) -> None:
    write(tmp_path, "ann.yaml", HUMAN.replace("[shared, private:ann]", "[shared, private:bob]"))
    bob = HUMAN.replace("ann", "bob").replace("Ann", "Bob")
    write(tmp_path, "bob.yaml", bob)
    assert one_problem(tmp_path) == (
        "cards/ann.yaml: privacy_domains.1: a human reads only their own private domain, not private:bob"
    )


def test_secret_in_api_key_env_is_refused_and_not_echoed(tmp_path: Path) -> None:
    secret = "sk-proj-4f9a8b7c6d5e4f3a2b1c"
    write(
        tmp_path,
        "m1.yaml",
        MODEL.replace("{mode: demo}", f"{{mode: demo, api_key_env: '{secret}'}}"),
    )
    line = one_problem(tmp_path)
    assert line.startswith("cards/m1.yaml: runtime.api_key_env: this looks like a secret")
    assert secret not in line


@pytest.mark.parametrize("value", ["Q2hhbmdlTWVQbGVhc2VJdHNBU2VjcmV0", "a8f3k2m9x7q1w5e6r4t0", "ghp_abcdef"])
def test_other_secret_shapes_are_refused(tmp_path: Path, value: str) -> None:
    write(tmp_path, "m1.yaml", MODEL.replace("{mode: demo}", f"{{mode: demo, api_key_env: {value}}}"))
    assert "looks like a secret" in one_problem(tmp_path)


def test_api_key_env_must_be_an_env_name(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL.replace("{mode: demo}", "{mode: demo, api_key_env: my-key}"))
    assert one_problem(tmp_path).startswith(
        "cards/m1.yaml: runtime.api_key_env: must be the NAME of an environment variable"
    )
    write(tmp_path, "m1.yaml", MODEL.replace("{mode: demo}", "{mode: demo, api_key_env: KIMI_KEY}"))
    assert load_cards(tmp_path / "cards").get("m1").runtime.api_key_env == "KIMI_KEY"


def test_matrix_token_env_is_checked_too(tmp_path: Path) -> None:
    channel = (
        "channels: [{type: matrix, room: '!r:h.org', homeserver: 'https://h.org', "
        "token_env: 'syt_abcdefghijklmnopqrstuvwxyz0123'}]"
    )
    text = HUMAN.replace("display_name: Ann}", "display_name: Ann, " + channel + "}")
    write(tmp_path, "ann.yaml", text)
    line = one_problem(tmp_path)
    assert line.startswith("cards/ann.yaml: human.channels.0.token_env: this looks like a secret")


def test_matrix_room_id_is_checked(tmp_path: Path) -> None:
    channel = "channels: [{type: matrix, room: 'general', homeserver: 'https://h.org', token_env: T}]"
    write(
        tmp_path,
        "ann.yaml",
        HUMAN.replace("display_name: Ann}", "display_name: Ann, " + channel + "}"),
    )
    assert one_problem(tmp_path).startswith("cards/ann.yaml: human.channels.0.room: must be a room id")


def test_unknown_channel_type(tmp_path: Path) -> None:
    channel = "channels: [{type: pigeon}]"
    write(
        tmp_path,
        "ann.yaml",
        HUMAN.replace("display_name: Ann}", "display_name: Ann, " + channel + "}"),
    )
    assert one_problem(tmp_path).startswith(
        "cards/ann.yaml: human.channels.0: unknown type 'pigeon' (one of: matrix, webhook)"
    )


def test_model_card_needs_a_tier(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL.replace("tier: small\n", ""))
    assert one_problem(tmp_path).startswith("cards/m1.yaml: tier: required for kind: model")


def test_model_card_needs_runtime_model_unless_demo(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL.replace("{mode: demo}", "{mode: external}"))
    assert one_problem(tmp_path) == (
        "cards/m1.yaml: runtime.model: required for a model card unless mode is demo"
    )


def test_gateway_mode_needs_a_model(tmp_path: Path) -> None:
    write(
        tmp_path,
        "p1.yaml",
        "id: p1\nkind: persona\nname: P\ntrust: trusted\nruntime: {mode: gateway}\n",
    )
    assert one_problem(tmp_path) == (
        "cards/p1.yaml: runtime.model: required for mode gateway (a LiteLLM model name)"
    )


def test_runtime_limits(tmp_path: Path) -> None:
    runtime = "{mode: demo, concurrency: 0, max_attempts: 0, lease_seconds: 4, poll_seconds: 0}"
    write(tmp_path, "m1.yaml", MODEL.replace("{mode: demo}", runtime))
    assert problems(tmp_path) == [
        "cards/m1.yaml: runtime.concurrency: must be at least 1",
        "cards/m1.yaml: runtime.max_attempts: must be at least 1",
        "cards/m1.yaml: runtime.lease_seconds: must be at least 5",
        "cards/m1.yaml: runtime.poll_seconds: must be greater than 0",
    ]


def test_duplicate_id_across_files(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL)
    write(tmp_path, "m1.yml", MODEL.replace("tier: small", "tier: large"))
    found = problems(tmp_path)
    assert "cards/m1.yml: id: 'm1' is also the id in cards/m1.yaml" in found


def test_duplicate_queue(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL)
    write(tmp_path, "m2.yaml", MODEL.replace("id: m1", "id: m2") + "queue: m1\n")
    assert one_problem(tmp_path) == (
        "cards/m2.yaml: queue: queue 'm1' is already drained by cards/m1.yaml (one card per queue)"
    )


def test_duplicate_human_username(tmp_path: Path) -> None:
    write(tmp_path, "ann.yaml", HUMAN)
    write(
        tmp_path,
        "ann2.yaml",
        HUMAN.replace("id: ann", "id: ann2").replace("private:ann]", "shared2]"),
    )
    assert one_problem(tmp_path) == ("cards/ann2.yaml: human.username: 'ann' is also used by cards/ann.yaml")


def test_backbone_model_must_be_a_model_card(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL)
    write(tmp_path, "ann.yaml", HUMAN)
    persona = "id: p1\nkind: persona\nname: P\ntrust: trusted\nruntime: {mode: demo}\n"
    write(tmp_path, "p1.yaml", persona + "backbone: {model: ghost}\n")
    assert one_problem(tmp_path) == ("cards/p1.yaml: backbone.model: no card 'ghost' (model cards: m1)")
    write(tmp_path, "p1.yaml", persona + "backbone: {model: ann}\n")
    assert one_problem(tmp_path) == ("cards/p1.yaml: backbone.model: 'ann' is a human card, not a model")
    write(tmp_path, "p1.yaml", persona + "backbone: {model: m1}\n")
    assert load_cards(tmp_path / "cards").get("p1").backbone is not None


def test_backbone_constraints_must_be_satisfiable(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL)
    persona = "id: p1\nkind: persona\nname: P\ntrust: trusted\nruntime: {mode: demo}\n"
    write(tmp_path, "p1.yaml", persona + "backbone: {constraints: {tier: large}}\n")
    assert one_problem(tmp_path) == (
        "cards/p1.yaml: backbone.constraints: no model card satisfies tier >= large (m1: tier small < large)"
    )


def test_backbone_needs_exactly_one_form(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL)
    persona = "id: p1\nkind: persona\nname: P\ntrust: trusted\nruntime: {mode: demo}\n"
    write(tmp_path, "p1.yaml", persona + "backbone: {model: m1, constraints: {tier: small}}\n")
    assert one_problem(tmp_path) == (
        "cards/p1.yaml: backbone: give exactly one of model (a card id) or constraints"
    )


def test_backbone_only_for_personas_and_routers(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL + "backbone: {model: m1}\n")
    assert one_problem(tmp_path) == ("cards/m1.yaml: backbone: only persona and router cards have a backbone")


def test_persona_file_must_exist(repo: Path) -> None:
    (repo / "souls" / "torgash.md").unlink()
    line = one_problem(repo)
    assert line.startswith("cards/torgash.yaml: persona: souls/torgash.md does not exist")


def test_persona_path_must_stay_in_the_repo(tmp_path: Path) -> None:
    text = "id: p1\nkind: persona\nname: P\ntrust: trusted\nruntime: {mode: demo}\n"
    write(tmp_path, "p1.yaml", text + "persona: ../etc/passwd\n")
    assert one_problem(tmp_path).startswith(
        "cards/p1.yaml: persona: '../etc/passwd' must be a path inside the repository"
    )


def test_golden_set_is_checked(repo: Path) -> None:
    golden = repo / "cards" / "golden" / "adolf.yaml"
    golden.write_text("agent: adolf\ncases:\n  - input: hi\n    expect: {contains: a, exact: b}\n")
    assert one_problem(repo) == (
        "cards/golden/adolf.yaml: cases.0.expect: give exactly one of contains, exact or regex"
    )
    golden.write_text("agent: kimi\ncases:\n  - input: hi\n    expect: {exact: hello}\n")
    assert one_problem(repo) == "cards/golden/adolf.yaml: agent: 'kimi' but the card is 'adolf'"
    golden.unlink()
    assert one_problem(repo).startswith("cards/adolf.yaml: golden: cards/golden/adolf.yaml does not exist")


def test_golden_expectations_match() -> None:
    assert GoldenExpect(contains=["Kimi", "quota"]).matches("kimi is out of QUOTA")
    assert not GoldenExpect(contains=["kimi"]).matches("gemma")
    assert GoldenExpect(exact="yes").matches("  yes\n")
    assert GoldenExpect(regex=r"^\s*yes\b").matches("yes, it is")
    with pytest.raises(ValidationError, match="not a valid regular expression"):
        models.GoldenExpectCheck.model_validate({"regex": "("})


def test_duplicate_capability_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "m1.yaml", MODEL + "capabilities: [chat, tools, chat]\n")
    assert one_problem(tmp_path) == "cards/m1.yaml: capabilities.2: 'chat' is listed twice"


# --- the model in code -------------------------------------------------------------------


def test_card_defaults_and_properties() -> None:
    card = check_card(
        {
            "id": "m1",
            "kind": "model",
            "name": "M",
            "tier": "small",
            "trust": "trusted",
            "runtime": {"mode": "demo"},
        }
    )
    assert card.queue_name == "m1"
    assert not card.is_human
    assert card.availability == [AlwaysSpec()]
    assert card.privacy_domains == ["shared"]
    assert card.cost_class == "free"
    assert (card.runtime.concurrency, card.runtime.max_attempts) == (1, 3)
    assert (card.runtime.lease_seconds, card.runtime.poll_seconds) == (60, 2.0)
    with pytest.raises(FrozenInstanceError):
        card.tier = "large"  # type: ignore[misc]
    moved = replace(card, queue="elsewhere")
    assert moved.queue_name == "elsewhere"


def test_card_set_refuses_duplicates() -> None:
    card = check_card(
        {
            "id": "m1",
            "kind": "model",
            "name": "M",
            "tier": "small",
            "trust": "trusted",
            "runtime": {"mode": "demo"},
        }
    )
    with pytest.raises(InvalidInput, match="duplicate agent id"):
        CardSet([card, card])


# --- helpers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("5m", 300),
        ("5h", 18000),
        ("7d", 604800),
        ("1w", 604800),
        ("1h30m", 5400),
        ("1.5h", 5400),
        (" 2M ", 120),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5x", "h", "-5m", "5 hours", "1h-30m"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(InvalidInput, match="duration"):
        parse_duration(text)


def test_parse_duration_refuses_bare_numbers() -> None:
    with pytest.raises(InvalidInput, match="needs a unit"):
        parse_duration(300)  # type: ignore[arg-type]


def test_tier_order() -> None:
    assert TIERS == ("small", "medium", "large", "reasoning")
    assert [tier_rank(t) for t in TIERS] == [0, 1, 2, 3]
    assert tier_rank("large") > tier_rank("medium")
    with pytest.raises(InvalidInput, match="unknown tier 'huge'"):
        tier_rank("huge")


def test_trust_order() -> None:
    assert TRUST_ORDER == ("human", "trusted", "sandboxed", "untrusted")
    ranks = [trust_rank(t) for t in TRUST_ORDER]
    assert ranks == sorted(ranks, reverse=True)
    assert trust_rank("human") > trust_rank("trusted") > trust_rank("sandboxed")
    assert trust_rank("sandboxed") > trust_rank("untrusted")
    with pytest.raises(InvalidInput, match="unknown trust class"):
        trust_rank("root")


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def test_hours_is_open() -> None:
    day = HoursSpec(timezone="Europe/Berlin", start="08:00", end="22:00", days=["mon", "tue"])
    assert day.is_open(_at("2026-07-20T08:00:00+02:00"))  # a Monday
    assert not day.is_open(_at("2026-07-20T07:59:00+02:00"))
    assert not day.is_open(_at("2026-07-20T22:00:00+02:00"))
    assert not day.is_open(_at("2026-07-22T12:00:00+02:00"))  # Wednesday
    assert day.is_open(datetime(2026, 7, 20, 10, 0, tzinfo=UTC))  # 12:00 in Berlin
    away = replace(day, vacation=True)
    assert not away.is_open(_at("2026-07-20T12:00:00+02:00"))


def test_hours_over_midnight() -> None:
    night = HoursSpec(timezone="UTC", start="22:00", end="06:00", days=["fri"])
    assert night.is_open(_at("2026-07-24T23:00:00+00:00"))  # Friday night
    assert night.is_open(_at("2026-07-25T05:59:00+00:00"))  # early Saturday, Friday's shift
    assert not night.is_open(_at("2026-07-25T23:00:00+00:00"))  # Saturday night
    assert not night.is_open(_at("2026-07-24T05:00:00+00:00"))  # early Friday: Thursday's shift


def test_a_broken_card_does_not_cascade_into_its_referrers(repo: Path) -> None:
    # adolf's backbone needs a large model; kimi is the only one. Breaking kimi must
    # report kimi, not also "no model card satisfies" on adolf.
    kimi = repo / "cards" / "kimi.yaml"
    kimi.write_text(kimi.read_text().replace("tier: large", "tier: larger"))
    assert one_problem(repo).startswith("cards/kimi.yaml: tier: must be one of")
