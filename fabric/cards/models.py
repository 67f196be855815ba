"""The cards' checks: pydantic models of what a card file may say, and the field types that
refuse readably.

A card file is checked here (unknown keys, types, bounds, the rules within one card) and
read as the plain classes of :mod:`fabric.cards.schema`, which every other module uses; the
two are kept field for field alike by ``tests/unit/test_card_models.py``. Imported only
where cards are checked (a load from the files, ``agap cards validate``, ``agap init``): a
process that starts from the checked snapshot (:mod:`fabric.cardcache`) never imports
pydantic. Each class here is named after the plain class it checks: ``CardCheck`` checks
``Card``.

A refusal is a :class:`ValueError` whose message becomes the card problem's text, so it
says what to write instead; rules that span cards are :mod:`fabric.cards.checks`'.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from fabric.cards import schema
from fabric.cards.fields import (
    DAYS,
    TIERS,
    CostClass,
    Day,
    Kind,
    RuntimeMode,
    Tier,
    Trust,
    one_or_many,
    raise_violations,
)
from fabric.durations import duration_seconds

__all__ = [
    "HHMM",
    "Capability",
    "Domain",
    "Duration",
    "EnvName",
    "RelPath",
    "Slug",
    "StrictModel",
    "Text",
    "TimeZoneName",
    "Url",
    "Username",
    "ValidationError",
    "check_card",
    "check_golden",
    "plain",
]

# ---------------------------------------------------------------------------------------
# Field types with readable refusals

_SLUG = re.compile(r"^[a-z][a-z0-9-]{1,38}$")
_USERNAME = re.compile(r"^[a-z][a-z0-9_.-]{1,38}$")
_CAPABILITY = re.compile(r"^[a-z][a-z0-9-]{0,38}$")
_DOMAIN = re.compile(r"^[a-z][a-z0-9-]{0,38}(?::[a-z][a-z0-9_.-]{0,38})?$")
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")
_SECRET_PREFIXES = ("sk-", "sk_", "ghp_", "gho_", "github_pat_", "xox", "glpat-", "bearer ")


def _check_duration(value: object) -> object:
    if duration_seconds(value) <= 0:
        raise ValueError("must be longer than zero")
    return value


def _check_slug(value: str) -> str:
    if not _SLUG.match(value):
        raise ValueError(
            f"{value!r} must be 2-39 characters of lowercase letters, digits and '-', starting with a letter"
        )
    return value


def _check_username(value: str) -> str:
    if not _USERNAME.match(value):
        raise ValueError(
            f"{value!r} must be 2-39 characters of lowercase letters, digits, '_', '.' and '-', "
            "starting with a letter"
        )
    return value


def _check_capability(value: str) -> str:
    if not _CAPABILITY.match(value):
        raise ValueError(f"{value!r} must be lowercase letters, digits and '-' (e.g. long-context)")
    return value


def _check_domain(value: str) -> str:
    if not _DOMAIN.match(value) or (":" in value and not value.startswith("private:")):
        raise ValueError(f"{value!r} must be 'shared' or 'private:<human>' (or another plain name)")
    if value == "private":
        raise ValueError("'private' needs an owner: write 'private:<human>'")
    return value


def _looks_like_secret(value: str) -> bool:
    if value.lower().startswith(_SECRET_PREFIXES):
        return True
    if len(value) >= 32:
        return True
    letters_and_digits = set(string.ascii_letters + string.digits)
    return (
        len(value) >= 20
        and "_" not in value
        and any(c.isdigit() for c in value)
        and all(c in letters_and_digits for c in value)
    )


def _check_env_name(value: str) -> str:
    # Never echo the value: if it is a secret, the refusal must not print it again.
    if _looks_like_secret(value):
        raise ValueError(
            "this looks like a secret, not the NAME of an environment variable — put the key "
            "in the environment (or .env) and write its name here, e.g. KIMI_API_KEY"
        )
    if not _ENV_NAME.match(value):
        raise ValueError(
            "must be the NAME of an environment variable: uppercase letters, digits and '_' "
            "(e.g. KIMI_API_KEY)"
        )
    return value


def _check_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL")
    if parts.password:
        raise ValueError("must not carry a password; put credentials in an environment variable instead")
    return value


def _check_hhmm(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        raise ValueError('write the time in quotes as "HH:MM", e.g. "07:30"')
    if isinstance(value, str) and not _HHMM.match(value):
        raise ValueError(f'{value!r} is not a 24-hour "HH:MM" time (00:00 to 23:59)')
    return value


def _check_timezone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{value!r} is not an IANA time zone (e.g. Europe/Berlin, UTC)") from None
    return value


def _check_relative_path(value: str) -> str:
    path = Path(value)
    if not value.strip() or path.is_absolute() or ".." in path.parts:
        raise ValueError(f"{value!r} must be a path inside the repository, e.g. souls/adolf.md")
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


Slug = Annotated[str, AfterValidator(_check_slug)]
Username = Annotated[str, AfterValidator(_check_username)]
Capability = Annotated[str, AfterValidator(_check_capability)]
Domain = Annotated[str, AfterValidator(_check_domain)]
EnvName = Annotated[str, AfterValidator(_check_env_name)]
Url = Annotated[str, AfterValidator(_check_url)]
Duration = Annotated[str, BeforeValidator(_check_duration)]
HHMM = Annotated[str, BeforeValidator(_check_hhmm)]
TimeZoneName = Annotated[str, AfterValidator(_check_timezone)]
RelPath = Annotated[str, AfterValidator(_check_relative_path)]
Text = Annotated[str, AfterValidator(_not_blank)]


class StrictModel(BaseModel):
    """Unknown keys refused, no type coercion, immutable. Validators are built on first
    use: a model no file needs (a household's, the GPU registry's) costs no build."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


# Room ids of room versions before 12 end in ":server"; version 12's do not (MSC4291).
_MATRIX_ROOM = re.compile(r"^![^:\s]+(:[^\s]+)?$")
_MATRIX_USER = re.compile(r"^@[^:\s]+:[^\s]+$")
#: ``(field path, message)`` pairs a model validator found.
_Violations = list[tuple[str, str]]

# ---------------------------------------------------------------------------------------
# Availability a(t): composable shapes; every shape must allow for a(t) > 0


class AlwaysSpecCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.AlwaysSpec`."""

    shape: Literal["always"] = "always"


class QuotaSpecCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.QuotaSpec`."""

    shape: Literal["quota"] = "quota"
    limit: int = Field(gt=0)
    window: Duration
    second_limit: int | None = Field(default=None, gt=0)
    second_window: Duration | None = None
    reserve_interactive: float = Field(default=0.0, ge=0.0, le=1.0)
    across_hosts: bool = False

    @model_validator(mode="after")
    def _pairs(self) -> QuotaSpecCheck:
        if (self.second_limit is None) != (self.second_window is None):
            missing = "second_window" if self.second_window is None else "second_limit"
            raise_violations([(missing, "second_limit and second_window go together")])
        return self


class BudgetSpecCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.BudgetSpec`."""

    shape: Literal["budget"] = "budget"
    usd: float = Field(gt=0)
    period: Duration
    reserve_interactive: float = Field(default=0.0, ge=0.0, le=1.0)


class OnDemandSpecCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.OnDemandSpec`."""

    shape: Literal["on_demand"] = "on_demand"
    health_url: Url
    wake_command: Text | None = None
    wake_url: Url | None = None
    probe_timeout: Duration = "3s"
    wake_timeout: Duration = "120s"


class GpuSpecCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.GpuSpec`."""

    shape: Literal["gpu"] = "gpu"
    vram_mb: int = Field(gt=0)
    probe_command: Text = "nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits"
    headroom_mb: int = Field(default=256, ge=0)


class HoursSpecCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.HoursSpec`."""

    shape: Literal["hours"] = "hours"
    timezone: TimeZoneName
    start: HHMM
    end: HHMM
    days: list[Day] = Field(default_factory=lambda: list(DAYS), min_length=1)
    vacation: bool = False

    @model_validator(mode="after")
    def _window(self) -> HoursSpecCheck:
        problems: list[tuple[str, str]] = []
        if self.start == self.end:
            problems.append(("end", "equals start; for all day use {shape: always}"))
        if len(set(self.days)) != len(self.days):
            problems.append(("days", "lists a day twice"))
        raise_violations(problems)
        return self


_Availability = Annotated[
    AlwaysSpecCheck | QuotaSpecCheck | BudgetSpecCheck | OnDemandSpecCheck | GpuSpecCheck | HoursSpecCheck,
    Field(discriminator="shape"),
]


# ---------------------------------------------------------------------------------------
# Runtime, backbone, humans, GPU residency


class RuntimeSpecCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.RuntimeSpec`."""

    mode: RuntimeMode
    model: Text | None = None
    api_base: Url | None = None
    api_key_env: EnvName | None = None
    concurrency: int = Field(default=1, ge=1)
    max_attempts: int = Field(default=3, ge=1)
    lease_seconds: int = Field(default=60, ge=5)
    poll_seconds: float = Field(default=2.0, gt=0)
    backoff_seconds: float = Field(default=5.0, ge=0)
    interactive: bool = False
    timeout_seconds: float = Field(default=120.0, gt=0)


class BackboneConstraintsCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.BackboneConstraints`."""

    tier: Tier | None = None
    capabilities: list[Capability] = Field(default_factory=list)


class BackboneCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.Backbone`."""

    model: Slug | None = None
    constraints: BackboneConstraintsCheck | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> BackboneCheck:
        if (self.model is None) == (self.constraints is None):
            raise_violations([("", "give exactly one of model (a card id) or constraints")])
        return self


class MatrixChannelCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.MatrixChannel`."""

    type: Literal["matrix"] = "matrix"
    room: str
    homeserver: Url
    token_env: EnvName
    user: str | None = None

    @model_validator(mode="after")
    def _room(self) -> MatrixChannelCheck:
        if not _MATRIX_ROOM.match(self.room):
            raise_violations([("room", "must be a room id like '!abcdef:example.org'")])
        if self.user is not None and not _MATRIX_USER.match(self.user):
            raise_violations([("user", "must be a Matrix user id like '@alvis:example.org'")])
        return self


class WebhookChannelCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.WebhookChannel`."""

    type: Literal["webhook"] = "webhook"
    url: Url
    token_env: EnvName | None = None


_Channel = Annotated[MatrixChannelCheck | WebhookChannelCheck, Field(discriminator="type")]


class HumanSpecCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.HumanSpec`."""

    username: Username
    display_name: Text
    email: str = ""
    channels: list[_Channel] = Field(default_factory=list)
    deputies: list[Username] = Field(default_factory=list)

    @model_validator(mode="after")
    def _email(self) -> HumanSpecCheck:
        if self.email and not re.match(r"^[^@\s]+@[^@\s]+\.[^@\s]+$", self.email):
            raise_violations([("email", "is not an email address")])
        return self


class GpuResidencyCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.GpuResidency`."""

    vram_mb: int = Field(gt=0)
    never_evict: bool = False
    co_residency_group: Slug | None = None


class MemorySpecCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.MemorySpec`."""

    retain: Annotated[list[Text], BeforeValidator(one_or_many)] = Field(min_length=1)
    consolidate: bool = False

    @model_validator(mode="after")
    def _banks(self) -> MemorySpecCheck:
        raise_violations(_duplicates("retain", self.retain))
        return self


# ---------------------------------------------------------------------------------------
# The card


def _always() -> list[_Availability]:
    return [AlwaysSpecCheck()]


class CardCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.Card`."""

    id: Slug
    kind: Kind
    name: Text
    description: str = ""
    capabilities: list[Capability] = Field(default_factory=list)
    tier: Tier | None = None
    cost_class: CostClass = "free"
    max_cost_usd: float | None = Field(default=None, gt=0)
    trust: Trust
    queue: Slug | None = None
    privacy_domains: list[Domain] = Field(default_factory=lambda: ["shared"])
    availability: list[_Availability] = Field(default_factory=_always, min_length=1)
    runtime: RuntimeSpecCheck
    persona: RelPath | None = None
    backbone: BackboneCheck | None = None
    human: HumanSpecCheck | None = None
    golden: RelPath | None = None
    gpu: GpuResidencyCheck | None = None
    memory: MemorySpecCheck | None = None

    @model_validator(mode="after")
    def _rules(self) -> CardCheck:
        raise_violations(
            [
                *_human_rules(self),
                *_kind_rules(self),
                *_privacy_rules(self),
                *_duplicates("capabilities", self.capabilities),
                *_duplicates("privacy_domains", self.privacy_domains),
                *_gpu_shape_rules(self),
                *_memory_rules(self),
            ]
        )
        return self


def _human_rules(card: CardCheck) -> _Violations:
    """A person and only a person has kind, trust and runtime mode ``human`` and a human block."""
    p: _Violations = []
    human = card.kind == "human"
    if human and card.trust != "human":
        p.append(("trust", "a kind: human card must have trust: human"))
    if not human and card.trust == "human":
        p.append(("trust", "trust: human is only for kind: human cards"))
    if human and card.runtime.mode != "human":
        p.append(("runtime.mode", "a kind: human card must have runtime mode: human"))
    if not human and card.runtime.mode == "human":
        p.append(("runtime.mode", "mode: human is only for kind: human cards"))
    if human and card.human is None:
        p.append(("human", "required for kind: human (username, display_name, channels)"))
    if not human and card.human is not None:
        p.append(("human", "only kind: human cards have a human block"))
    return p


def _kind_rules(card: CardCheck) -> _Violations:
    """The fields only some kinds have, or must have."""
    p: _Violations = []
    if card.kind == "model":
        if card.tier is None:
            p.append(("tier", "required for kind: model (one of " + ", ".join(TIERS) + ")"))
        if card.runtime.model is None and card.runtime.mode != "demo":
            p.append(("runtime.model", "required for a model card unless mode is demo"))
    if card.runtime.mode in ("gateway", "sdk") and card.runtime.model is None and card.backbone is None:
        # A persona's backbone names its model; everything else that calls one must.
        p.append(("runtime.model", f"required for mode {card.runtime.mode} (a LiteLLM model name)"))
    if card.backbone is not None and card.kind not in ("persona", "router"):
        p.append(("backbone", "only persona and router cards have a backbone"))
    if card.persona is not None and card.kind not in ("persona", "router"):
        p.append(("persona", "only persona and router cards have a soul file"))
    if card.gpu is not None and card.kind != "model":
        p.append(("gpu", "only kind: model cards have GPU residency"))
    return p


def _privacy_rules(card: CardCheck) -> _Violations:
    """A sandboxed or untrusted agent sees only shared domains."""
    return [
        (
            f"privacy_domains.{i}",
            f"a {card.trust} agent may not read {domain}; it sees only shared domains",
        )
        for i, domain in enumerate(card.privacy_domains)
        if domain.startswith("private:") and card.trust in ("sandboxed", "untrusted")
    ]


def _memory_rules(card: CardCheck) -> _Violations:
    """The output of untrusted work never becomes memory (it would lose its taint)."""
    if card.memory is not None and card.trust == "untrusted":
        return [("memory", f"a {card.trust} agent's results are never retained (taint.retain)")]
    return []


def _gpu_shape_rules(card: CardCheck) -> _Violations:
    """A ``gpu`` availability shape and the card's GPU residency agree on the VRAM."""
    gpu = card.gpu
    return [
        (f"availability.{i}.vram_mb", f"{spec.vram_mb} differs from gpu.vram_mb {gpu.vram_mb}")
        for i, spec in enumerate(card.availability)
        if isinstance(spec, GpuSpecCheck) and gpu and spec.vram_mb != gpu.vram_mb
    ]


def _duplicates(field: str, values: Sequence[str]) -> _Violations:
    seen: set[str] = set()
    out: _Violations = []
    for i, value in enumerate(values):
        if value in seen:
            out.append((f"{field}.{i}", f"{value!r} is listed twice"))
        seen.add(value)
    return out


# ---------------------------------------------------------------------------------------
# Golden sets: canonical exchanges replayed before a backbone or routing change


class GoldenExpectCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.GoldenExpect`."""

    contains: Annotated[list[Text] | None, BeforeValidator(one_or_many)] = None
    exact: str | None = None
    regex: str | None = None
    judge: Text | None = None

    @model_validator(mode="after")
    def _one(self) -> GoldenExpectCheck:
        given = [k for k in ("contains", "exact", "regex", "judge") if getattr(self, k) is not None]
        if len(given) != 1:
            kinds = (
                "contains, exact, regex or judge" if self.judge is not None else "contains, exact or regex"
            )
            raise_violations([("", f"give exactly one of {kinds}")])
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise_violations([("regex", f"is not a valid regular expression: {exc}")])
        return self


class GoldenCaseCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.GoldenCase`."""

    name: str = ""
    input: Text
    expect: GoldenExpectCheck


class GoldenSetCheck(StrictModel):
    """Checks :class:`fabric.cards.schema.GoldenSet`."""

    agent: Slug
    cases: list[GoldenCaseCheck] = Field(min_length=1)


# ---------------------------------------------------------------------------------------
# The GPUs of the house (``cards/_gpu.yaml``, read by fabric.cards.gpu)


class GpuDevice(StrictModel):
    """One GPU local models run on: its VRAM, and what the driver and display keep."""

    name: Slug
    vram_mb: int = Field(gt=0)
    reserved_mb: int = Field(default=0, ge=0)

    @property
    def usable_mb(self) -> int:
        return self.vram_mb - self.reserved_mb


class GpuRegistry(StrictModel):
    """``cards/_gpu.yaml``: the GPUs of the house."""

    gpus: list[GpuDevice] = Field(min_length=1)


# ---------------------------------------------------------------------------------------
# Checked, as the plain classes

#: The plain class each check here reads as, by the check's name (``CardCheck``: ``Card``).
_PLAIN: dict[str, type[Any]] = {
    f"{name}Check": cls for name in schema.__all__ if isinstance(cls := getattr(schema, name), type)
}


def plain(value: Any) -> Any:
    """A checked model (and the models and lists in it) as :mod:`fabric.cards.schema`'s
    classes, value for value."""
    if isinstance(value, StrictModel):
        fields = {name: plain(getattr(value, name)) for name in type(value).model_fields}
        return _PLAIN[type(value).__name__](**fields)
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def check_card(data: object) -> schema.Card:
    """A card file's mapping, checked, as a plain :class:`~fabric.cards.schema.Card`;
    pydantic's ``ValidationError`` says what is wrong (``fabric.cards.problems``)."""
    card: schema.Card = plain(CardCheck.model_validate(data))
    return card


def check_golden(data: object) -> schema.GoldenSet:
    """A golden set's mapping, checked, as a plain :class:`~fabric.cards.schema.GoldenSet`."""
    golden: schema.GoldenSet = plain(GoldenSetCheck.model_validate(data))
    return golden
