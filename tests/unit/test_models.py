"""Model clients: the demo model, the gateway client against a loopback provider stub (no
proxy), error mapping, rate-limit parsing and client selection."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest

from fabric.cards import Card, CardSet
from fabric.errors import ConfigError
from fabric.retry_after import budget_exhausted, parse_rate_limit
from tests.fakes.openai_stub import OpenAIStub
from workers.answer import client_for
from workers.llm import (
    BadModelResponse,
    DemoClient,
    GatewayClient,
    ModelAuthFailed,
    ModelRejected,
    ModelUnavailable,
    RateLimited,
    trace_metadata,
)
from workers.llm_sdk import SdkClient, _map_litellm_error
from workers.prompt import build_messages

ROOT = Path(__file__).resolve().parents[2]
META = {"agent": "kimi", "task_id": 42, "queue": "kimi"}


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        yield s


def ask(client: Any, text: str = "hello", **kw: Any) -> Any:
    return client.complete(
        [{"role": "user", "content": text}],
        model=kw.pop("model", "m"),
        metadata=kw.pop("metadata", META),
        idempotency_key=kw.pop("idempotency_key", "42:3:complete"),
        timeout=kw.pop("timeout", 5.0),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- demo ------------------------------------------------------------------------------


def test_demo_is_labelled_deterministic_and_free() -> None:
    messages = build_messages(
        "Summarise the meeting notes",
        {"file:///srv/notes/a.md": "alpha", "task:7": "beta"},
        "# Adolf\nYou are Adolf.",
    )
    demo = DemoClient()
    one = demo.complete(messages, model="", metadata={}, idempotency_key="a", timeout=1)
    two = demo.complete(messages, model="", metadata={"x": 1}, idempotency_key="b", timeout=1)
    assert one == two
    assert one.text.startswith("[demo model] ")
    assert "Summarise the meeting notes" in one.text
    assert "file:///srv/notes/a.md" in one.text and "task:7" in one.text
    assert "Adolf" in one.text
    assert one.cost_usd == 0.0 and one.model == "demo" and one.call_id
    assert one.usage["total_tokens"] > 0
    other = demo.complete(
        build_messages("Something else", {}, None), model="demo", metadata={}, idempotency_key="a", timeout=1
    )
    assert other.text != one.text and "Context I was given: none." in other.text


# -- gateway against the stub (as if it were the proxy) --------------------------------


def test_gateway_sends_auth_idempotency_and_trace_metadata(stub: OpenAIStub) -> None:
    client = GatewayClient(stub.url, stub.api_key)
    done = ask(client, "what is up", model="kimi-k2")
    assert done.text == "stub reply to: what is up"
    assert done.call_id and done.call_id.startswith("chatcmpl-stub-")  # no proxy header
    assert done.cost_usd == 0.0
    assert done.usage["total_tokens"] > 0
    req = stub.chat_requests()[-1]
    assert req.headers["authorization"] == f"Bearer {stub.api_key}"
    assert req.headers["idempotency-key"] == "42:3:complete"
    assert req.headers["user-agent"].startswith("agap-fabric")
    md = req.body["metadata"]
    assert req.body["model"] == "kimi-k2"
    assert {"agent:kimi", "task:42", "queue:kimi"} <= set(md["tags"])
    assert md["trace_id"] == "agap-task-42"
    assert md["trace_name"] == "task #42 (kimi)"
    assert md["generation_name"] == "kimi:kimi-k2"
    assert md["trace_user_id"] == "kimi"
    assert md["session_id"] == "queue:kimi"
    assert md["trace_metadata"] == {"agent": "kimi", "task_id": 42, "queue": "kimi"}
    assert md["idempotency_key"] == "42:3:complete"
    assert (md["agent"], md["task_id"], md["queue"]) == ("kimi", 42, "kimi")


def test_gateway_reuses_one_connection_and_accepts_a_v1_base(stub: OpenAIStub) -> None:
    client = GatewayClient(stub.base_url, stub.api_key)
    assert client.url == f"{stub.url}/v1/chat/completions"
    ask(client)
    ask(client)
    first, second = stub.chat_requests()[-2:]
    assert first.peer is not None and first.peer == second.peer, "the second call reused the connection"
    assert "sk-" not in repr(client)
    client.close()


def test_trace_metadata_keeps_explicit_keys() -> None:
    md = trace_metadata(
        {"agent": "a", "task_id": 1, "tags": ["agent:a", "x"], "trace_id": "mine", "obj": object()}, model="m"
    )
    assert md["tags"] == ["agent:a", "x", "task:1"]
    assert md["trace_id"] == "mine"
    assert isinstance(md["obj"], str)
    json.dumps(md)


def test_gateway_429_is_rate_limited_with_headers(stub: OpenAIStub) -> None:
    stub.fail_next("429", retry_after="7", reset_requests="30s")
    before = time.time()
    with pytest.raises(RateLimited) as info:
        ask(GatewayClient(stub.url, stub.api_key))
    err = info.value
    assert err.retry_after == 7.0
    assert err.reset_at is not None and before + 29 <= err.reset_at <= time.time() + 31
    assert err.headers["retry-after"] == "7"
    assert err.headers["x-ratelimit-reset-requests"] == "30s"


@pytest.mark.parametrize("kind", ["500", "503"])
def test_gateway_5xx_is_unavailable(stub: OpenAIStub, kind: str) -> None:
    stub.fail_next(kind)  # type: ignore[arg-type]
    with pytest.raises(ModelUnavailable) as info:
        ask(GatewayClient(stub.url, stub.api_key))
    assert info.value.status == int(kind)


@pytest.mark.parametrize("kind", ["malformed", "no_choices"])
def test_gateway_broken_answer_is_bad_response(stub: OpenAIStub, kind: str) -> None:
    stub.fail_next(kind)  # type: ignore[arg-type]
    with pytest.raises(BadModelResponse):
        ask(GatewayClient(stub.url, stub.api_key))
    assert ask(GatewayClient(stub.url, stub.api_key)).text  # only the next call was broken


def test_gateway_wrong_key_is_auth_failure(stub: OpenAIStub) -> None:
    with pytest.raises(ModelAuthFailed) as info:
        ask(GatewayClient(stub.url, "sk-wrong"))
    assert isinstance(info.value, ModelUnavailable)  # the queue parks; tasks are not burnt
    assert "sk-wrong" not in str(info.value)


def test_gateway_400_is_rejected(stub: OpenAIStub) -> None:
    client = GatewayClient(stub.url, stub.api_key)
    with pytest.raises(ModelRejected):
        client.complete(
            "not a list",  # type: ignore[arg-type]
            model="m",
            metadata={},
            idempotency_key="k",
            timeout=5,
        )


def test_gateway_budget_exhausted_is_a_cool_down_until_the_named_date(stub: OpenAIStub) -> None:
    stub.fail_next("budget")
    with pytest.raises(RateLimited) as info:
        ask(GatewayClient(stub.url, stub.api_key))
    err = info.value
    assert err.reset_at == datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    assert "budget exhausted" in err.line() and "wait until 2027-01-01 00:00 UTC" in err.line()


@pytest.mark.parametrize(
    ("status", "message", "spent", "regain"),
    [
        (
            400,
            "You will regain access on 2027-03-04 at 05:06 UTC.",
            True,
            datetime(2027, 3, 4, 5, 6, tzinfo=UTC),
        ),
        (402, "Budget has been exceeded! Current cost: 10.2, Max budget: 10.0", True, None),
        (
            429,
            "You exceeded your current quota, please check your plan",
            False,
            None,
        ),  # a 429: headers decide
        (400, "You exceeded your current quota, please check your plan", True, None),
        (403, "insufficient credits", True, None),
        (400, "prompt is too long: 300000 tokens > 200000 maximum", False, None),
        (401, "invalid x-api-key", False, None),
    ],
)
def test_budget_exhausted_reads_the_words(
    status: int, message: str, spent: bool, regain: datetime | None
) -> None:
    assert budget_exhausted(status, message) == (spent, regain.timestamp() if regain else None)


def test_gateway_down_is_unavailable() -> None:
    with pytest.raises(ModelUnavailable) as info:
        ask(GatewayClient(f"http://127.0.0.1:{free_port()}", "sk-x"))
    assert "cannot reach" in str(info.value)


def test_gateway_timeout_is_unavailable() -> None:
    def slow(body: dict[str, Any]) -> str:
        time.sleep(1.0)
        return "late"

    with OpenAIStub(reply=slow) as stub, pytest.raises(ModelUnavailable) as info:
        ask(GatewayClient(stub.url, stub.api_key), timeout=0.2)
    assert "no answer within" in str(info.value)


def test_gateway_needs_a_key() -> None:
    with pytest.raises(ConfigError):
        GatewayClient("http://127.0.0.1:4000", "")


# -- rate-limit headers ----------------------------------------------------------------


def test_parse_rate_limit_shapes() -> None:
    now = 1_800_000_000.0
    assert parse_rate_limit({}, now) == (None, None)
    assert parse_rate_limit({"Retry-After": "12"}, now) == (12.0, now + 12)
    assert parse_rate_limit({"retry-after-ms": "1500"}, now) == (1.5, now + 1.5)
    date = formatdate(now + 60, usegmt=True)
    retry, reset = parse_rate_limit({"Retry-After": date}, now)
    assert retry is not None and 59 <= retry <= 60 and reset is not None
    # OpenAI's reset durations, the latest wins; no Retry-After → derived from the reset
    retry, reset = parse_rate_limit(
        {"x-ratelimit-reset-requests": "1m30s", "x-ratelimit-reset-tokens": "250ms"}, now
    )
    assert (retry, reset) == (90.0, now + 90)
    # an epoch reset
    assert parse_rate_limit({"x-ratelimit-reset": str(int(now + 300))}, now) == (300.0, now + 300)
    # relayed by the LiteLLM proxy with a prefix
    assert parse_rate_limit({"llm_provider-retry-after": "7"}, now) == (7.0, now + 7)
    assert parse_rate_limit({"retry-after": "3", "llm_provider-retry-after": "7"}, now)[0] == 3.0
    assert parse_rate_limit({"Retry-After": "soon"}, now) == (None, None)


# -- selection -------------------------------------------------------------------------


def with_runtime(card: Card, **changes: Any) -> Card:
    return replace(card, runtime=replace(card.runtime, **changes))


def test_client_for_follows_the_card(cards: CardSet) -> None:
    kimi = cards.get("kimi")
    assert isinstance(client_for(kimi, {}), DemoClient)
    gw = client_for(with_runtime(kimi, mode="gateway"), {"LITELLM_MASTER_KEY": "sk-master"})
    assert isinstance(gw, GatewayClient)
    assert gw.base_url == "http://127.0.0.1:4000"


def test_client_for_env_overrides(cards: CardSet) -> None:
    kimi = cards.get("kimi")
    gw = client_for(
        kimi,
        {"AGAP_MODEL_MODE": "gateway", "AGAP_LITELLM_URL": "http://gw:4000/", "AGAP_LITELLM_KEY": "sk-agap"},
    )
    assert isinstance(gw, GatewayClient) and gw.url == "http://gw:4000/v1/chat/completions"
    assert isinstance(client_for(kimi, {"AGAP_MODEL_MODE": "demo"}), DemoClient)
    with pytest.raises(ConfigError, match="AGAP_MODEL_MODE"):
        client_for(kimi, {"AGAP_MODEL_MODE": "turbo"})


def test_client_for_gateway_without_key_is_config_error(cards: CardSet) -> None:
    with pytest.raises(ConfigError) as info:
        client_for(cards.get("kimi"), {"AGAP_MODEL_MODE": "gateway"})
    assert "LITELLM_MASTER_KEY" in str(info.value)


def test_client_for_gateway_card_uses_its_own_base_and_key(cards: CardSet) -> None:
    card = with_runtime(cards.get("kimi"), mode="gateway", api_base="http://litellm:4000")
    gw = client_for(card, {"LITELLM_API_KEY": "sk-card"})
    assert isinstance(gw, GatewayClient) and gw.base_url == "http://litellm:4000"
    # gemma's api_base is an Ollama URL: not a gateway when the mode is overridden
    gw = client_for(cards.get("gemma-local"), {"AGAP_MODEL_MODE": "gateway", "LITELLM_MASTER_KEY": "k"})
    assert isinstance(gw, GatewayClient) and gw.base_url == "http://127.0.0.1:4000"


def test_client_for_sdk_reads_the_named_key(cards: CardSet) -> None:
    kimi = cards.get("kimi")
    with pytest.raises(ConfigError, match="LITELLM_API_KEY"):
        client_for(kimi, {"AGAP_MODEL_MODE": "sdk"})
    sdk = client_for(kimi, {"AGAP_MODEL_MODE": "sdk", "LITELLM_API_KEY": "sk-k"})
    assert isinstance(sdk, SdkClient) and sdk._key == "sk-k"
    gemma = client_for(cards.get("gemma-local"), {"AGAP_MODEL_MODE": "sdk"})
    assert isinstance(gemma, SdkClient) and gemma.api_base == "http://127.0.0.1:11434"


@pytest.mark.parametrize("card_id", ["claude-coder", "alvis"])
def test_client_for_refuses_external_and_human_cards(cards: CardSet, card_id: str) -> None:
    with pytest.raises(ConfigError, match="outside the worker"):
        client_for(cards.get(card_id), {})


# -- the gateway path never imports litellm ------------------------------------------------


def test_gateway_mode_never_imports_litellm() -> None:
    code = """
import sys
from tests.fakes.openai_stub import OpenAIStub
from workers import answer, llm as models, prompt, refs
from workers.answer import client_for
from workers.llm import GatewayClient
from workers.llm_sdk import SdkClient
with OpenAIStub() as stub:
    done = GatewayClient(stub.url, stub.api_key).complete(
        prompt.build_messages("hi", {}, None), model="m", metadata={"agent": "a"},
        idempotency_key="k", timeout=5)
SdkClient(api_base="http://127.0.0.1:1")  # constructing it imports nothing either
assert done.text.startswith("stub reply"), done
leaked = sorted(m for m in sys.modules if m == "litellm" or m.startswith("litellm."))
assert not leaked, leaked
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_sdk_budget_exhausted_is_a_cool_down() -> None:
    class BadRequestError(Exception):
        status_code = 400

    exc = BadRequestError("You will regain access on 2027-01-01 at 00:00 UTC.")
    err = _map_litellm_error(types.SimpleNamespace(BadRequestError=BadRequestError), exc, "sdk")
    assert isinstance(err, RateLimited) and err.reset_at == datetime(2027, 1, 1, tzinfo=UTC).timestamp()
