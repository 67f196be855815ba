"""The REAL LiteLLM proxy in front of a loopback provider stub and a Langfuse receiver:
a :class:`GatewayClient` completion goes through, cost and call id come back, the trace
reaches "Langfuse" tagged with agent, task and queue, and failures map to typed errors."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fakes.langfuse_receiver import LangfuseReceiver
from tests.fakes.litellm_proxy import LiteLLMProxy, free_port, proxy_unavailable_reason
from tests.fakes.openai_stub import OpenAIStub
from workers.llm import (
    BadModelResponse,
    GatewayClient,
    ModelAuthFailed,
    ModelUnavailable,
    RateLimited,
)
from workers.prompt import build_messages

REASON = proxy_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"LiteLLM proxy: {REASON}")
if REASON is not None:
    print(f"skipping the LiteLLM gateway tests: {REASON}")

META = {"agent": "kimi", "task_id": 4242, "queue": "kimi-queue"}


@dataclass
class Plane:
    stub: OpenAIStub
    receiver: LangfuseReceiver
    proxy: LiteLLMProxy

    def client(self) -> GatewayClient:
        return GatewayClient(self.proxy.url, self.proxy.master_key)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with OpenAIStub() as stub, LangfuseReceiver() as receiver:
        params: dict[str, object] = {
            "model": "openai/gpt-4o-mini",  # a priced name: the cost map prices it
            "api_base": stub.base_url,
            "api_key": "os.environ/STUB_PROVIDER_KEY",
        }
        proxy = LiteLLMProxy(
            tmp_path_factory.mktemp("litellm"),
            {"kimi-k2": params},
            env={"STUB_PROVIDER_KEY": stub.api_key, **receiver.env()},
            callbacks=["langfuse"],
        )
        with proxy:
            print(f"LiteLLM proxy live in {proxy.started_in:.1f}s")
            yield Plane(stub, receiver, proxy)


def ask(client: GatewayClient, text: str, *, timeout: float = 30.0) -> object:
    return client.complete(
        build_messages(text, {"task:1": "ctx"}, None),
        model="kimi-k2",
        metadata=dict(META),
        idempotency_key="4242:1:complete",
        timeout=timeout,
    )


def test_completion_through_the_proxy(plane: Plane) -> None:
    before = len(plane.stub.chat_requests())
    done = plane.client().complete(
        build_messages("say hi", {}, None),
        model="kimi-k2",
        metadata=dict(META),
        idempotency_key="4242:1:complete",
        timeout=30,
    )
    assert done.text == "stub reply to: say hi"
    assert done.cost_usd > 0  # x-litellm-response-cost, priced from the bundled cost map
    assert done.call_id and done.call_id != "chatcmpl-stub-1"  # the proxy's x-litellm-call-id
    assert done.usage["total_tokens"] > 0
    upstream = plane.stub.chat_requests()[before:]
    assert len(upstream) == 1
    assert upstream[0].headers["authorization"] == f"Bearer {plane.stub.api_key}"
    assert upstream[0].body["model"] == "gpt-4o-mini"
    assert "metadata" not in upstream[0].body  # tracing metadata stays in the plane


def test_trace_reaches_langfuse_with_agent_task_and_queue(plane: Plane) -> None:
    plane.client().complete(
        build_messages("trace me", {}, None),
        model="kimi-k2",
        metadata=dict(META),
        idempotency_key="4242:1:complete",
        timeout=30,
    )
    want = {"agent:kimi", "task:4242", "queue:kimi-queue"}
    assert plane.receiver.wait_for(lambda r: want <= r.trace_tags(), timeout=30), (
        f"tags seen: {plane.receiver.trace_tags()}\n{plane.proxy.log_tail()}"
    )
    span = next(s for s in plane.receiver.spans() if want <= set(s.tags))
    assert span.attributes["langfuse.trace.name"] == "task #4242 (kimi)"
    assert span.attributes["user.id"] == "kimi"
    assert span.attributes["langfuse.trace.metadata.task_id"] in (4242, "4242")
    assert span.name == "kimi:kimi-k2"
    auth = plane.receiver.requests[-1]["headers"]["authorization"]
    assert auth.startswith("Basic ")


def test_provider_429_is_rate_limited_with_retry_after(plane: Plane) -> None:
    plane.stub.fail_next("429", retry_after="7", reset_requests="20s")
    before = len(plane.stub.chat_requests())
    start = time.time()
    with pytest.raises(RateLimited) as info:
        ask(plane.client(), "too fast")
    assert len(plane.stub.chat_requests()) - before == 1  # the proxy did not retry
    err = info.value
    assert err.retry_after == 7.0
    assert err.reset_at is not None and err.reset_at >= start + 19
    assert err.headers.get("llm_provider-retry-after") == "7"


def test_provider_500_is_unavailable(plane: Plane) -> None:
    plane.stub.fail_next("500")
    with pytest.raises(ModelUnavailable):
        ask(plane.client(), "boom")


def test_malformed_provider_answer_is_bad_response(plane: Plane) -> None:
    plane.stub.fail_next("malformed")
    with pytest.raises(BadModelResponse):
        ask(plane.client(), "garbled")
    plane.stub.fail_next("no_choices")
    with pytest.raises(BadModelResponse):
        ask(plane.client(), "empty")


def test_wrong_gateway_key_is_auth_failure(plane: Plane) -> None:
    with pytest.raises(ModelAuthFailed):
        ask(GatewayClient(plane.proxy.url, "sk-not-the-master-key"), "let me in")


def test_proxy_down_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable):
        ask(GatewayClient(f"http://127.0.0.1:{free_port()}", "sk-x"), "anyone?", timeout=5)
