"""Re-sending writes that failed ambiguously (fabric.kanboard.resend)."""

from __future__ import annotations

from collections.abc import Sequence

from fabric.kanboard.port import Call, Outcome, RpcError
from fabric.kanboard.resend import send

LOCKED = RpcError(0, "SQLSTATE[HY000]: General error: 5 database is locked", method="saveTaskMetadata")


class Scripted:
    """A port that answers each batch from a script, and keeps what it was sent."""

    def __init__(self, answers: list[list[object]]) -> None:
        self.answers = answers
        self.sent: list[list[str]] = []

    def batch(self, calls: Sequence[Call]) -> list[Outcome]:
        self.sent.append([c.method for c in calls])
        values = self.answers.pop(0)
        return [
            Outcome(c, error=v) if isinstance(v, RpcError) else Outcome(c, value=v)
            for c, v in zip(calls, values, strict=True)
        ]


def test_a_read_after_a_resent_write_is_read_again_after_it() -> None:
    write = Call("saveTaskMetadata", {"task_id": 1, "values": {"fabric.e1": "{}"}})
    before = Call("getTask", {"task_id": 1})
    after = Call("getTaskMetadata", {"task_id": 1})
    port = Scripted([["row", LOCKED, {}], [True, {"fabric.e1": "{}"}]])
    out = send(port, [before, write, after])  # type: ignore[arg-type]
    # The read before the write is not sent again; the one after it is, behind the write.
    assert port.sent == [
        ["getTask", "saveTaskMetadata", "getTaskMetadata"],
        ["saveTaskMetadata", "getTaskMetadata"],
    ]
    assert [o.value for o in out] == ["row", True, {"fabric.e1": "{}"}]


def test_a_batch_whose_writes_landed_is_sent_once() -> None:
    write = Call("saveTaskMetadata", {"task_id": 1, "values": {}})
    port = Scripted([[True, {}]])
    send(port, [write, Call("getTaskMetadata", {"task_id": 1})])  # type: ignore[arg-type]
    assert len(port.sent) == 1
