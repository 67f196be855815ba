"""A gateway worker behind the REAL LiteLLM proxy parks for as long as the provider said.

The proxy relays a provider's 429 headers with an ``llm_provider-`` prefix
(``llm_provider-retry-after``); a worker that reads only plain headers parks "with no reset
announced" for its default back-off instead. Here the provider stand-in answers one 429
with ``Retry-After`` and a longer ``x-ratelimit-reset-requests``: the queue's published park
must last what ``Retry-After`` said (the provider's instruction), and the task must then
run by itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.cards import CardSet, load_cards
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.kanboard.client import KanboardClient
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import make_fabric
from tests.fakes.litellm_proxy import LiteLLMProxy, proxy_unavailable_reason
from tests.fakes.openai_stub import OpenAIStub
from tests.helpers import Running, wait_until
from workers.assembly import build_worker

REASON = proxy_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"LiteLLM proxy: {REASON}")
if REASON is not None:
    print(f"skipping the LiteLLM park test: {REASON}")

CARDS = Path(__file__).parent / "cards_worker"
RETRY_AFTER = 4.0  # seconds the provider asks for
RESET = "20s"  # a later reset the provider also announces: Retry-After wins


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OpenAIStub, LiteLLMProxy]]:
    with OpenAIStub() as stub:
        params: dict[str, object] = {
            "model": "openai/gpt-4o-mini",
            "api_base": stub.base_url,
            "api_key": "os.environ/STUB_PROVIDER_KEY",
        }
        proxy = LiteLLMProxy(
            tmp_path_factory.mktemp("litellm"),
            {"openai/stub": params},
            env={"STUB_PROVIDER_KEY": stub.api_key},
        )
        with proxy:
            yield stub, proxy


def test_the_park_follows_retry_after_through_the_proxy(
    embedded_board: EmbeddedBoard, tmp_path: Path, proxied: tuple[OpenAIStub, LiteLLMProxy]
) -> None:
    stub, proxy = proxied
    cards: CardSet = load_cards(CARDS, base_dir=CARDS)
    settings = Settings(
        board_url=embedded_board.url,
        board_token=embedded_board.token,
        cards_dir=CARDS,
        state_dir=tmp_path / "state",
    )
    fab: Fabric = make_fabric(
        KanboardClient(embedded_board.url, embedded_board.token), cards, settings=settings
    )
    env = {"AGAP_MODEL_MODE": "gateway", "AGAP_LITELLM_URL": proxy.url, "AGAP_LITELLM_KEY": proxy.master_key}
    stub.fail_next("429", retry_after=f"{RETRY_AFTER:.0f}", reset_requests=RESET)
    tid = fab.submit("rate limited at first, through the proxy", target="tester").task_id
    with Running(build_worker("tester", settings, cards, env=env)):
        park = wait_until(
            lambda: (s := fab.board.park_states().get("tester")) and s.get("parked") and s,
            timeout=60,
            what="the queue parked on the proxied 429",
        )
        assert str(park["reason"]).startswith("rate limited"), park
        assert park["until"] is not None, f"parked with no reset read from the proxy's headers: {park}"
        ratio = (float(park["until"]) - float(park["since"])) / RETRY_AFTER
        print(f"park lasted {ratio:.2f} x the announced Retry-After ({RETRY_AFTER:.0f}s)")
        assert 0.9 <= ratio <= 1.25, f"park of {ratio:.2f} x Retry-After: {park}"
        wait_until(lambda: _state(fab, tid) == State.DONE, timeout=60, what="ran after the park")
    view = fab.board.read(tid)
    assert view.current is not None and view.current.attempt == 1, "a 429 is not a failed attempt"


def _state(fab: Fabric, tid: int) -> State | None:
    cur = fab.board.read(tid).current
    return cur.state if cur else None
