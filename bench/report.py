"""The results as a compact Markdown table: rows are metrics, columns are boards."""

from __future__ import annotations

from typing import Any


def _ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}x" if base else "n/a"


def _errors(d: dict[str, int]) -> int:
    return sum(d.values())


def _n(x: Any) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "n/a"
    return f"{x:g}" if isinstance(x, int | float) else str(x)


def rows_for(res: dict[str, Any]) -> dict[str, str]:
    """metric -> cell, for one target."""
    t = res["trips"]
    cli = t["cli"]
    rows: dict[str, str] = {
        "Round trips: `Fabric.submit`": _n(t["submit"]["mean"]),
        "Round trips: submit with a new idempotency key": _n(t["submit_key_new"]["mean"]),
        "Round trips: submit repeating a key (returns the original)": _n(t["submit_key_repeat"]["mean"]),
        "Round trips: `agap submit` CLI, warm layout cache (proxy-counted)": _n(cli["warm_posts"]["mean"]),
        "Round trips: `agap submit` CLI, cold layout cache (proxy-counted)": _n(
            (cli["cold"] or {}).get("proxy_posts")
        ),
        "Round trips: claim (poll + claim), as the worker daemon claims": _n(t["claim"]["mean"]),
        "Round trips: claim of a fresh task, its record written at once (`agap claim`, MCP, A2A)": _n(
            (t.get("claim_at_once") or {}).get("mean")
        ),
        "Round trips: complete": _n(t["complete"]["mean"]),
        "Round trips: lifecycle submit → claim → complete": _n(t["lifecycle"]["mean"]),
        "Round trips: the same, the worker woken by the submit's live event (MQTT)": _n(
            (t.get("lifecycle_woken") or {}).get("mean")
        ),
        "Round trips: idle poll (empty queue)": _n(t["idle_poll"]),
        "Round trips: lease renewal": _n(t.get("renew")),
        "Round trips: one side effect (intent + receipt)": _n(t.get("side_effect")),
        "Lifecycle latency, sequential (x one `getTask`)": _n(t.get("lifecycle_x_getTask")) + "x",
    }
    if t.get("spoiled_samples"):
        rows["Round-trip samples spoiled by board errors (excluded)"] = _n(sum(t["spoiled_samples"].values()))
    thr = res["throughput"]
    best, totals = thr["best"], thr["totals"]
    for key in sorted(best["raw"], key=int):
        p = int(key)
        raw, fab, nai, tot = best["raw"][key], best["fabric"][key], best["naive"][key], totals[key]
        base = raw["per_second"]
        rows[f"{p} proc: board ceiling, raw `createTask`/s"] = f"{base:g}/s" + (
            f" ({tot['raw_errors']} errors)" if tot["raw_errors"] else ""
        )
        rows[f"{p} proc: fabric tasks done/s (x ceiling)"] = (
            f"{_ratio(fab['per_second'], base)} ({fab['per_second']:g}/s)"
        )
        rows[f"{p} proc: naive tasks done/s (x ceiling)"] = (
            f"{_ratio(nai['per_second'], base)} ({nai['per_second']:g}/s)"
        )
        rows[f"{p} proc: double executions (tasks run more than once), fabric / naive"] = (
            f"**{tot['fabric_double_executions']}** / **{tot['naive_double_executions']}** of {tot['tasks']}"
        )
        rows[f"{p} proc: tasks done, fabric / naive"] = (
            f"{tot['fabric_done']} / {tot['naive_done']} of {tot['tasks']}"
        )
        if "fabric_stuck" in tot:
            rows[
                f"{p} proc: stuck (not done, or card in the wrong column), at the end → "
                "after settle, fabric / naive"
            ] = (
                f"{_settled(tot, 'fabric_stuck', bold=True)} / "
                f"{_settled(tot, 'naive_stuck', bold=True)} of {tot['tasks']}"
            )
            rows[f"{p} proc: not done at the end, fabric / naive"] = (
                f"{tot['fabric_not_done']} / {tot['naive_not_done']} of {tot['tasks']}"
            )
            rows[f"{p} proc: cards in the wrong column, at the end → after settle, fabric / naive"] = (
                f"{_settled(tot, 'fabric_wrong_column')} / {_settled(tot, 'naive_wrong_column')}"
                + (
                    f" ({tot['fabric_moves_resent']} moves re-sent by the settle poll)"
                    if tot.get("fabric_moves_resent")
                    else ""
                )
            )
        if tot.get("fabric_timed_out") or tot.get("naive_timed_out"):
            rows[f"{p} proc: runs that hit the deadline, fabric / naive"] = (
                f"{tot.get('fabric_timed_out', 0)} / {tot.get('naive_timed_out', 0)}"
            )
        fab_trips_per_s = fab["trips"] / fab["seconds"] if fab["seconds"] else 0.0
        rows[f"{p} proc: fabric round trips per done task"] = (
            f"{fab['trips_per_task']:g} ({_ratio(fab_trips_per_s, base)} ceiling in trips/s)"
        )
        rows[f"{p} proc: board errors (all runs), fabric / naive"] = (
            f"{tot['fabric_errors']} / {tot['naive_errors']}"
        )
    return rows


def _settled(tot: dict[str, Any], key: str, *, bold: bool = False) -> str:
    """ "<at the end> → <after settle>", or just the first when there was no settle."""
    b = "**" if bold else ""
    end, after = tot.get(key), tot.get(f"{key}_settled")
    cell = f"{b}{_n(end)}{b}"
    return cell if after is None else f"{cell} → {b}{_n(after)}{b}"


def table(results: dict[str, Any]) -> str:
    targets = {k: t for k, t in results["targets"].items() if "error" not in t}
    labels = [targets[k]["label"] for k in targets]
    per = [rows_for(targets[k]) for k in targets]
    metrics: list[str] = []
    for r in per:
        for m in r:
            if m not in metrics:
                metrics.append(m)
    lines = ["| metric | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for m in metrics:
        lines.append(f"| {m} | " + " | ".join(r.get(m, "-") for r in per) + " |")
    return "\n".join(lines)


def readme_block(results: dict[str, Any]) -> str:
    m = results["machine"]
    reps = results["config"]["repeats"]
    sizes = ", ".join(
        f"{t['label']}: {t['tasks']} tasks per point" for t in results["targets"].values() if "error" not in t
    )
    failed = "".join(
        f" {t['label']} at {t['url']} failed and is left out: {t['error']}."
        for t in results["targets"].values()
        if "error" in t
    )
    return (
        f"Measured with `{results['command']}` on {m['date']} ({m['nproc']} CPUs, "
        f"Python {m['python']}, load average {m['loadavg_at_start'][0]} at start; {sizes}; "
        f"best of {reps} runs per point; drill executor, no sleep). Throughput is a ratio of "
        "the board's own `createTask` rate measured in the same run with the same number of "
        'processes (one `createTask` is one round trip). "Run more than once", '
        '"done", "stuck" and "wrong column" are summed over all runs. '
        + _stuck_note(results)
        + failed
        + "\n\n"
        + table(results)
        + "\n"
        + "".join(section_table(sec) for sec in results.get("sections", {}).values())
    )


def _stuck_note(results: dict[str, Any]) -> str:
    settle = results["config"].get("settle")
    note = (
        "A task is stuck when it is not done once a run's processes have ended, or when "
        "its card sits in a column that disagrees with its state (a lost projection): "
        "for the fabric the state is the task's current record, for the naive claimer "
        "a task its log shows executed belongs in Done."
    )
    if settle:
        note += (
            f' "After settle" counts again {settle:g} s after the run: by then each '
            "fabric worker connection has polled once more (a poll reads back its own "
            "recent moves and re-sends lost ones); the naive claimer has no such step "
            "and only waits."
        )
    return note


def section_table(section: dict[str, Any]) -> str:
    """One benchmark section as its own table (rows of [metric, value], or its own Markdown)."""
    if "markdown" in section:
        return f"\n**{section.get('title', 'Live events')}**\n\n{section['markdown']}\n"
    rows = section.get("rows") or [[k, _n(v)] for k, v in section.items() if k not in ("title", "data")]
    lines = [f"\n**{section.get('title', 'more')}**\n", "| metric | value |", "|---|---|"]
    lines += [f"| {m} | {v} |" for m, v in rows]
    return "\n".join(lines) + "\n"
