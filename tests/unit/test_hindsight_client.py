"""The fabric's Hindsight client (:mod:`fabric.hindsight`) against the stand-in over
loopback: each status Hindsight answers becomes one error class, one line and one exit
code, and nothing is sent twice."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from fabric.errors import EXIT_INVALID, EXIT_UNREACHABLE
from fabric.hindsight import HindsightClient, HindsightRefused, HindsightUnavailable, detail, valid_bank_id
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
    assert detail(b"<html>gateway</html>") == "<html>gateway</html>"
