""":class:`SdkClient` (``litellm.completion`` in process) against the loopback provider stub:
completion and cost, the typed errors, and the Langfuse callback carrying agent, task and
queue (in a subprocess, so litellm's global callback list does not leak into other tests)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.langfuse_receiver import LangfuseReceiver
from tests.fakes.openai_stub import OpenAIStub
from workers.llm import (
    BadModelResponse,
    Completion,
    ModelAuthFailed,
    ModelUnavailable,
    RateLimited,
)
from workers.llm_sdk import SdkClient
from workers.prompt import build_messages

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("litellm") is None, reason="litellm is not installed (pip install litellm)"
)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before any litellm import

MODEL = "openai/gpt-4o-mini"  # a priced name: the bundled cost map gives a cost
META = {"agent": "torgash", "task_id": 77, "queue": "torgash"}


@pytest.fixture(scope="module")
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        yield s


def ask(client: SdkClient, text: str = "hello") -> Completion:
    return client.complete(
        build_messages(text, {}, None),
        model=MODEL,
        metadata=dict(META),
        idempotency_key="77:2:complete",
        timeout=20,
    )


def test_sdk_completion(stub: OpenAIStub) -> None:
    before = len(stub.chat_requests())
    done = ask(SdkClient(api_base=stub.base_url, api_key=stub.api_key), "hello sdk")
    assert done.text == "stub reply to: hello sdk"
    assert done.cost_usd > 0
    assert done.call_id
    assert done.usage["total_tokens"] > 0
    sent = stub.chat_requests()[before:]
    assert len(sent) == 1
    assert sent[0].headers["authorization"] == f"Bearer {stub.api_key}"
    assert sent[0].headers["idempotency-key"] == "77:2:complete"
    assert sent[0].body["model"] == "gpt-4o-mini"


def test_sdk_429_is_rate_limited(stub: OpenAIStub) -> None:
    stub.fail_next("429", retry_after="9", reset_requests="15s")
    before = len(stub.chat_requests())
    start = time.time()
    with pytest.raises(RateLimited) as info:
        ask(SdkClient(api_base=stub.base_url, api_key=stub.api_key))
    assert len(stub.chat_requests()) - before == 1  # litellm did not retry on its own
    assert info.value.retry_after == 9.0
    assert info.value.reset_at is not None and info.value.reset_at >= start + 14
    assert info.value.headers["retry-after"] == "9"


@pytest.mark.parametrize("kind", ["malformed", "no_choices"])
def test_sdk_malformed_is_bad_response(stub: OpenAIStub, kind: str) -> None:
    stub.fail_next(kind)  # type: ignore[arg-type]
    with pytest.raises(BadModelResponse):
        ask(SdkClient(api_base=stub.base_url, api_key=stub.api_key))


def test_sdk_500_and_down_are_unavailable(stub: OpenAIStub) -> None:
    stub.fail_next("500")
    with pytest.raises(ModelUnavailable):
        ask(SdkClient(api_base=stub.base_url, api_key=stub.api_key))
    with pytest.raises(ModelUnavailable):
        ask(SdkClient(api_base="http://127.0.0.1:9/v1", api_key="sk-x"))


def test_sdk_wrong_key_is_auth_failure(stub: OpenAIStub) -> None:
    with pytest.raises(ModelAuthFailed):
        ask(SdkClient(api_base=stub.base_url, api_key="sk-wrong"))


_CALLBACK = """
import json, os, sys
import litellm
from workers.llm_sdk import SdkClient
from workers.prompt import build_messages
litellm.success_callback = ["langfuse"]
cfg = json.loads(sys.argv[1])
done = SdkClient(api_base=cfg["api_base"], api_key=cfg["api_key"]).complete(
    build_messages("trace me", {"task:1": "ctx"}, None), model=cfg["model"],
    metadata=cfg["metadata"], idempotency_key="77:2:complete", timeout=20)
try:  # the callback exports in batches: flush before exiting (exit would flush too)
    from litellm.integrations.langfuse.langfuse_sdk import flush_langfuse_tracing
    flush_langfuse_tracing(10_000)
except ImportError:
    pass
print(json.dumps({"text": done.text}))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("langfuse") is None,
    reason="langfuse is not installed (pip install 'langfuse>=4.7,<5')",
)
def test_sdk_langfuse_callback_carries_agent_task_queue(stub: OpenAIStub) -> None:
    with LangfuseReceiver() as receiver:
        env = {**os.environ, **receiver.env(), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        cfg = {"api_base": stub.base_url, "api_key": stub.api_key, "model": MODEL, "metadata": META}
        out = subprocess.run(
            [sys.executable, "-c", _CALLBACK, json.dumps(cfg)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout.strip().splitlines()[-1])["text"].startswith("stub reply")
        want = {"agent:torgash", "task:77", "queue:torgash"}
        assert receiver.wait_for(lambda r: want <= r.trace_tags(), timeout=30), (
            f"tags seen: {receiver.trace_tags()}\n{out.stderr[-3000:]}"
        )
        span = next(s for s in receiver.spans() if want <= set(s.tags))
        assert span.attributes["langfuse.trace.name"] == "task #77 (torgash)"
        assert span.attributes["session.id"] == "queue:torgash"
        assert span.attributes["langfuse.observation.model.name"] == "gpt-4o-mini"
