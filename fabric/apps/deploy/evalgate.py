"""``agap eval``: the gate before a backbone or routing change takes effect.

A persona card names its golden set (``golden: cards/golden/<id>.yaml``: canonical
exchanges, each with an expectation). ``agap eval --agent ID --backbone MODEL`` replays
every case through the model plane twice — on the *current* backbone (the card's
``runtime.model``, else its backbone model card's ``runtime.model``) and on the *proposed*
``MODEL`` — scores both, prints them side by side, and fails on a regression.

Scoring, per case: ``contains`` (every string, case-insensitive), ``exact`` (trimmed),
``regex`` (matches somewhere), or ``judge`` — a model call with the rubric, the input and
the answer, which must answer PASS or FAIL on its first line (anything else counts as
FAIL). The judge is the same model for both runs (``--judge``, default: the current
backbone), so it cannot favour the candidate by being the candidate. A case whose model
call fails counts as failed.

Every call goes through the workers' model path (:mod:`workers.answer`: the same client,
chosen by the same ``AGAP_MODEL_MODE`` rule); only the messages are the gate's own: the
persona and the golden input as it is, without the task prompt or the ask rule.

**The rule.** The proposed backbone is a regression, and ``agap eval`` exits 1, when

* it passes fewer cases than the current one, or
* any case the current backbone passes, it fails — even if it passes others instead: a
  golden case is a promise the agent already keeps, and trading one for another is a
  change for a human to decide, not for a gate to wave through.

Otherwise it exits 0 (equal or better, case by case). Invalid input exits 2; a model plane
that cannot be reached at all exits 3.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabric.cards import Card, CardSet, GoldenCase, load_golden
from fabric.cards.backbone import read_record
from fabric.errors import EXIT_UNREACHABLE, FabricError, InvalidInput
from workers.answer import client_for, complete
from workers.llm import ModelClient, ModelError
from workers.prompt import persona_for

JUDGE_SYSTEM = (
    "You grade one answer of an AI assistant against a rubric. Read the rubric, the user's "
    "message and the answer. Reply with exactly one word on the first line: PASS if the "
    "answer meets the rubric, FAIL if it does not. You may explain on the following lines."
)
_VERDICT = re.compile(r"^\W*(PASS|FAIL)\b", re.I)


class ModelPlaneDown(FabricError):
    """Not one model call of the replay succeeded: nothing was compared."""

    exit_code = EXIT_UNREACHABLE

    def __init__(self, note: str) -> None:
        super().__init__(
            "every model call failed: the model plane is unreachable or refuses", where="agap eval", hint=note
        )


@dataclass
class CaseResult:
    name: str
    passed: bool
    answer: str = ""
    note: str = ""  # why it failed (the judge's reason, a model error)


@dataclass
class Run:
    model: str
    results: list[CaseResult] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)


@dataclass
class EvalReport:
    agent: str
    current: Run
    proposed: Run
    judge: str

    @property
    def broken(self) -> list[str]:
        """Cases the current backbone passes and the proposed one fails."""
        return [
            c.name
            for c, p in zip(self.current.results, self.proposed.results, strict=True)
            if c.passed and not p.passed
        ]

    @property
    def regression(self) -> bool:
        return self.proposed.passed < self.current.passed or bool(self.broken)

    def table(self) -> str:
        """The side-by-side table and the verdict, as printed by ``agap eval``."""
        names = [r.name for r in self.current.results]
        head = ("CASE", f"CURRENT {self.current.model}", f"PROPOSED {self.proposed.model}")
        rows = [head]
        for name, c, p in zip(names, self.current.results, self.proposed.results, strict=True):
            mark = "  <- regression" if c.passed and not p.passed else ""
            rows.append((name, _mark(c), _mark(p) + mark))
        n = len(names)
        rows.append(("total", f"{self.current.passed}/{n}", f"{self.proposed.passed}/{n}"))
        widths = [max(len(r[i]) for r in rows) for i in range(2)]
        lines = ["  ".join((r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2])).rstrip() for r in rows]
        if self.regression:
            why = (
                (f"fails {len(self.broken)} case(s) the current backbone passes: " + ", ".join(self.broken))
                if self.broken
                else f"passes {self.proposed.passed} of {n}, the current one {self.current.passed}"
            )
            lines.append(f"REGRESSION: {self.proposed.model} {why}")
        else:
            lines.append(
                f"ok: {self.proposed.model} keeps every case {self.current.model} passes "
                f"({self.proposed.passed}/{n} vs {self.current.passed}/{n})"
            )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        def run(r: Run) -> dict[str, Any]:
            return {
                "model": r.model,
                "passed": r.passed,
                "cases": [
                    {"name": c.name, "passed": c.passed, "note": c.note, "answer": c.answer}
                    for c in r.results
                ],
            }

        return {
            "agent": self.agent,
            "judge": self.judge,
            "current": run(self.current),
            "proposed": run(self.proposed),
            "broken": self.broken,
            "regression": self.regression,
        }


def _mark(r: CaseResult) -> str:
    return "PASS" if r.passed else ("FAIL" + (f" ({r.note})" if r.note else ""))


def current_backbone(card: Card, cards: CardSet) -> str:
    """The model the agent thinks with now: the one the gate last passed (the record in
    the cards folder), else its ``runtime.model`` (its resolved backbone), else its backbone
    model card's ``runtime.model``."""
    gated = read_record(cards.directory).get(card.id) if cards.directory is not None else None
    if gated:
        return gated
    if card.runtime.model:
        return card.runtime.model
    if card.backbone is not None and card.backbone.model is not None:
        model = cards.get(card.backbone.model).runtime.model
        if model:
            return model
    raise InvalidInput(
        f"agent {card.id!r} names no current backbone model",
        where=f"cards/{card.id}.yaml",
        hint="set runtime.model, or backbone.model to a model card with a runtime.model",
    )


def _case_name(i: int, case: GoldenCase) -> str:
    return case.name or f"case {i + 1}"


class Evaluator:
    """Replays a golden set through a model client (see the module doc)."""

    def __init__(
        self,
        card: Card,
        cards: CardSet,
        client: ModelClient,
        *,
        persona: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self.card = card
        self.cards = cards
        self.client = client
        self.persona = persona
        self.timeout = timeout or card.runtime.timeout_seconds

    def _ask(self, messages: list[dict[str, str]], model: str, key: str) -> str:
        completion = complete(
            self.card,
            self.client,
            messages,
            model=model,
            key=key,
            timeout=self.timeout,
            metadata={
                "agent": self.card.id,
                "queue": self.card.queue_name,
                "task": "eval",
                "tags": [f"agent:{self.card.id}", "eval"],
            },
        )
        return completion.text

    def answer(self, case: GoldenCase, model: str, key: str) -> str:
        messages = [{"role": "system", "content": self.persona}] if self.persona else []
        messages.append({"role": "user", "content": case.input})
        return self._ask(messages, model, key)

    def judge(self, case: GoldenCase, answer: str, judge_model: str, key: str) -> tuple[bool, str]:
        rubric = case.expect.judge or ""
        prompt = f"Rubric:\n{rubric}\n\nUser's message:\n{case.input}\n\nAnswer:\n{answer}\n"
        verdict = self._ask(
            [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": prompt}],
            judge_model,
            key,
        )
        m = _VERDICT.match(verdict.strip())
        if m is None:
            return False, "the judge answered neither PASS nor FAIL"
        passed = m.group(1).upper() == "PASS"
        reason = verdict.strip().splitlines()[1:2]
        return passed, "" if passed else (reason[0].strip()[:80] if reason else "judge: FAIL")

    def run(self, cases: list[GoldenCase], model: str, judge_model: str) -> Run:
        out = Run(model)
        for i, case in enumerate(cases):
            name = _case_name(i, case)
            key = f"eval:{self.card.id}:{model}:{i}"
            try:
                answer = self.answer(case, model, key)
                if case.expect.judge is not None:
                    passed, note = self.judge(case, answer, judge_model, key + ":judge")
                else:
                    passed, note = case.expect.matches(answer), ""
            except ModelError as exc:
                out.results.append(CaseResult(name, False, "", f"model error: {exc.what}"[:80]))
                continue
            out.results.append(CaseResult(name, passed, answer, note))
        return out


def evaluate(
    agent: str,
    proposed: str,
    cards: CardSet,
    *,
    env: Mapping[str, str] | None = None,
    judge: str | None = None,
    client: ModelClient | None = None,
) -> EvalReport:
    """Replay ``agent``'s golden set on its current backbone and on ``proposed``."""
    card = cards.get(agent)
    if card.golden is None:
        raise InvalidInput(
            f"agent {agent!r} has no golden set",
            where=f"cards/{agent}.yaml",
            hint="add golden: cards/golden/<id>.yaml (see cards/golden/adolf.yaml)",
        )
    base = cards.base_dir or Path.cwd()
    golden = load_golden(base / card.golden, base_dir=base)
    if not proposed.strip():
        raise InvalidInput("the proposed backbone is empty", where="--backbone")
    current = current_backbone(card, cards)
    judge_model = judge or current
    if client is None:
        client = client_for(card, env)
    ev = Evaluator(card, cards, client, persona=persona_for(card, cards))
    cases = list(golden.cases)
    report = EvalReport(
        agent, ev.run(cases, current, judge_model), ev.run(cases, proposed, judge_model), judge_model
    )
    if all(r.note.startswith("model error") for r in report.current.results + report.proposed.results):
        raise ModelPlaneDown(report.current.results[0].note)
    return report


def dumps(report: EvalReport) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True)


__all__ = [
    "CaseResult",
    "EvalReport",
    "Evaluator",
    "ModelPlaneDown",
    "Run",
    "current_backbone",
    "dumps",
    "evaluate",
]
