"""The fabric's Hindsight client (:mod:`fabric.hindsight`) against the stand-in over
loopback: each status Hindsight answers becomes one error class, one line and one exit
code, and nothing is sent twice."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from fabric.errors import EXIT_INVALID, EXIT_UNREACHABLE
from fabric.hindsight import (
    HindsightClient,
    HindsightRefused,
    HindsightUnavailable,
    check_status,
    detail,
    valid_bank_id,
)
from tests.fakes.hindsight_stub import HindsightStub, Memory


@pytest.fixture
def stub() -> Iterator[HindsightStub]:
    with HindsightStub({"Adolf::tg::ada": [Memory("m1", "Ada's bike is in the shed.")]}, api_key="k") as s:
        yield s


def test_each_answer_is_one_error_with_its_exit_code(stub: HindsightStub) -> None:
    client = HindsightClient(stub.url, "k")
    cases: list[tuple[Callable[[], object], type[HindsightRefused], int, str]] = [
        (
            lambda: HindsightClient(stub.url, "bad").recall("Adolf::tg::ada", {"query": "bike"}),
            HindsightRefused,
            EXIT_UNREACHABLE,
            "credentials",
        ),
        (
            lambda: client.recall("adolf::tg::ada", {"query": "bike"}),
            HindsightRefused,
            EXIT_INVALID,
            "no bank 'adolf::tg::ada'",
        ),
        (
            lambda: client.recall("Adolf::tg::ada", {"query": "?"}),
            HindsightRefused,
            EXIT_INVALID,
            "query: Value error",
        ),
        (
            lambda: client.recall("Adolf::tg::ada", {"query": "bike", "types": ["x"]}),
            HindsightRefused,
            EXIT_INVALID,
            "Invalid fact type(s): x",
        ),
    ]
    for call, cls, code, text in cases:
        sent = len(stub.requests)
        with pytest.raises(cls) as err:
            call()
        assert err.value.exit_code == code and text in err.value.line(), err.value.line()
        assert len(err.value.line().splitlines()) == 1
        assert len(stub.requests) == sent + 1  # asked once, never again on its own


@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_busy_or_failing_hindsight_is_unavailable_and_not_retried(stub: HindsightStub, status: int) -> None:
    stub.fail_next(1, status)
    with pytest.raises(HindsightUnavailable) as err:
        HindsightClient(stub.url, "k").retain("Adolf::tg::ada", [{"content": "x"}])
    assert err.value.exit_code == EXIT_UNREACHABLE and err.value.status == status and err.value.transient
    assert len(stub.requests) == 1
    assert [m.text for m in stub.memories("Adolf::tg::ada")] == ["Ada's bike is in the shed."]


def test_a_bank_id_the_fabric_would_not_judge_is_never_sent(stub: HindsightStub) -> None:
    for bank in ("a/b", "..", "a..b", "", "-a", "a b"):
        assert not valid_bank_id(bank)
        with pytest.raises(HindsightRefused):
            HindsightClient(stub.url, "k").recall(bank, {"query": "bike"})
    assert not stub.requests  # refused before any request
    assert valid_bank_id("Adolf::tg::ada") and valid_bank_id("adolf-alvis") and valid_bank_id("a.b_c")


def test_detail_reads_fastapis_shapes() -> None:
    assert detail(b'{"detail": "Bank \'x\' not found"}') == "Bank 'x' not found"
    assert detail(b'{"detail": [{"loc": ["body", "budget"], "msg": "Input should be low"}]}') == (
        "budget: Input should be low"
    )
    assert detail(b"<html>gateway</html>") == "gateway"
    assert detail(b"Internal Server Error") == "Internal Server Error"


def test_a_404_from_no_route_says_the_url_is_wrong_not_the_bank(stub: HindsightStub) -> None:
    # A retain makes its bank, so its 404 means no Hindsight API at that URL (a wrong base
    # URL answers FastAPI's "Not Found"), never "no bank ... check the spelling".
    wrong = HindsightClient(f"{stub.url}/hindsight", "k")
    calls: list[Callable[[], object]] = [
        lambda: wrong.retain("Adolf::tg::ada", [{"content": "x"}]),
        lambda: wrong.recall("Adolf::tg::ada", {"query": "bike"}),
    ]
    for call in calls:
        with pytest.raises(HindsightRefused) as err:
            call()
        line = err.value.line()
        assert "no Hindsight API at this URL (HTTP 404: Not Found)" in line and "no bank" not in line, line
        assert "AGAP_HINDSIGHT_URL" in line and len(line.splitlines()) == 1
        assert err.value.exit_code == EXIT_INVALID and err.value.status == 404
    assert [m.text for m in stub.memories("Adolf::tg::ada")] == ["Ada's bike is in the shed."]


def test_an_error_page_that_is_not_json_is_one_line() -> None:
    page = (
        b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n"
        b"<center><h1>413 Request Entity Too Large</h1></center>\r\n</body>\r\n</html>\r\n"
    )
    assert detail(page) == "413 Request Entity Too Large 413 Request Entity Too Large"
    for status in (413, 404):
        with pytest.raises(HindsightRefused) as err:
            check_status(status, page, "http://h/v1/default/banks/b/memories", "b")
        assert len(err.value.line().splitlines()) == 1, err.value.line()


def test_a_reflect_on_an_unknown_bank_is_a_404_and_makes_no_bank(stub: HindsightStub) -> None:
    # Hindsight 1.1.0 makes the bank and runs its LLM on nothing when asked to reflect on a
    # bank it does not know: the client asks the list API (no LLM) first.
    with pytest.raises(HindsightRefused, match="no bank 'nobody'") as err:
        HindsightClient(stub.url, "k").reflect("nobody", {"query": "where is the bike?"})
    assert err.value.exit_code == EXIT_INVALID and err.value.status == 404
    assert "nobody" not in stub.banks
    assert not [r for r in stub.requests if r.path.endswith("/reflect")]
    text = HindsightClient(stub.url, "k").reflect("Adolf::tg::ada", {"query": "where is the bike?"})
    assert "bike is in the shed" in text
