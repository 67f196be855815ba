"""Workspace leases without git or sockets: refs, branch names, the push guard, sandboxes."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric.apps.sandbox import SandboxSpec, load_sandboxes, sandbox_service
from fabric.apps.workspace import (
    HOOK,
    PushRefused,
    RepoRef,
    Workspace,
    WorkspaceState,
    branch_name,
    find_repo_ref,
    slug,
    workspace_path,
)
from fabric.errors import ConfigError, InvalidInput
from tests.conftest import ROOT

UID = "0123456789abcdef"


@pytest.mark.parametrize(
    ("text", "url", "branch", "commit", "repo"),
    [
        (
            "git+https://gitea.example/alvis/agap.git#main",
            "https://gitea.example/alvis/agap.git",
            "main",
            None,
            "alvis/agap",
        ),
        ("git+file:///srv/git/alvis/agap.git", "file:///srv/git/alvis/agap.git", "main", None, "alvis/agap"),
        (
            "git+ssh://git@gitea.example:2222/alvis/agap.git#release/2.x",
            "ssh://git@gitea.example:2222/alvis/agap.git",
            "release/2.x",
            None,
            "alvis/agap",
        ),
        (
            f"git+file:///r/o/x.git#agap/{UID}-fix@{'a' * 40}",
            "file:///r/o/x.git",
            f"agap/{UID}-fix",
            "a" * 40,
            "o/x",
        ),
        ("git+https://h/o/r#user@example", "https://h/o/r", "user@example", None, "o/r"),
    ],
)
def test_repo_refs_parse_and_print(text: str, url: str, branch: str, commit: str | None, repo: str) -> None:
    ref = RepoRef.parse(text)
    assert (ref.url, ref.branch, ref.commit, ref.repo) == (url, branch, commit, repo)
    assert RepoRef.parse(ref.text()) == ref


@pytest.mark.parametrize(
    "text",
    [
        "https://gitea.example/alvis/agap.git#main",  # not git+
        "git+ftp://h/o/r.git#main",
        "git+file://#main",
        "git+https://h/o/r.git#bad..name",
        "git+https://h/o/r.git#with space",
        "git+https://h/o/r.git#-flag",
    ],
)
def test_bad_repo_refs_say_what_is_wrong(text: str) -> None:
    with pytest.raises(InvalidInput):
        RepoRef.parse(text)


def test_the_task_repo_is_its_first_git_ref() -> None:
    refs = ["file:///notes.md", "git+https://h/o/a.git#dev", "git+https://h/o/b.git"]
    found = find_repo_ref(refs)
    assert found is not None and found.repo == "o/a" and found.branch == "dev"
    assert find_repo_ref(["task:3"]) is None
    assert find_repo_ref(["git+file:///srv/git/notes.git#main:week.md"]) is None  # a file, as context


def test_branch_names_are_stable_and_safe() -> None:
    assert (
        slug('Fix the CSV parser — it drops "quoted" commas!') == "fix-the-csv-parser-it-drops-quoted"
    )  # whole words, at most 40
    assert len(slug("word " * 40)) <= 40 and slug("¿¡!") == "task"
    name = branch_name(UID, "Fix <the> parser\nsecond line ignored")
    assert name == f"agap/{UID}-fix-the-parser"
    assert RepoRef.parse(f"git+file:///r/o/x.git#{name}").branch == name


def test_workspace_paths_cannot_escape_the_root(tmp_path: Path) -> None:
    assert workspace_path(tmp_path, "claude-coder", UID) == tmp_path / "workspaces" / "claude-coder" / UID
    for agent, uid in (("..", UID), ("a/b", UID), ("coder", "../x"), ("coder", "")):
        with pytest.raises(InvalidInput):
            workspace_path(tmp_path, agent, uid)


def test_the_guard_allows_only_the_task_branch(tmp_path: Path) -> None:
    branch = branch_name(UID, "Fix it")
    ws = Workspace(
        tmp_path,
        WorkspaceState(
            agent="claude-coder",
            uid=UID,
            task_id=1,
            epoch=1,
            owner="w",
            url="file:///r/o/x.git",
            base="develop",
            branch=branch,
            remote_head="",
            resumed_from="",
        ),
    )
    ws.guard(branch)
    ws.guard(f"refs/heads/{branch}")
    for dest in ("main", "refs/heads/main", "master", "develop", "agap/other", f"{branch}-x"):
        with pytest.raises(PushRefused):
            ws.guard(dest)
    with pytest.raises(PushRefused, match="never pushes"):
        ws.push("main")  # refused before git is ever run (there is no repository here)


def test_the_pre_push_hook_names_only_the_task_branch() -> None:
    hook = HOOK.format(branch="agap/x-y", base="main")
    assert hook.startswith("#!/bin/sh") and 'allowed="refs/heads/agap/x-y"' in hook


def test_sandboxes_load_from_cards_and_render_for_compose(tmp_path: Path) -> None:
    boxes = load_sandboxes(ROOT / "cards", known_agents=["claude-coder", "kimi"])
    coder = boxes["claude-coder"]
    assert coder.no_vault and coder.memory == "4g" and "litellm:4000" in coder.network_allow
    out = sandbox_service("claude-coder", coder)
    svc = out["service"]
    assert svc["networks"] == ["sandbox-claude-coder"] and svc["cap_drop"] == ["ALL"]
    assert svc["cpus"] == 2.0 and svc["mem_limit"] == "4g" and svc["pids_limit"] == 512
    assert svc["environment"]["HTTPS_PROXY"] == "http://egress-claude-coder:3128"
    assert out["networks"] == {"sandbox-claude-coder": {"internal": True}}
    assert out["egress_proxy"]["allow"] == list(coder.network_allow)
    assert "VAULT_" in out["forbidden_env_prefixes"]
    assert not any(k.startswith("VAULT_") for k in svc["environment"])
    assert load_sandboxes(tmp_path) == {}

    (tmp_path / "_sandbox.yaml").write_text("ghost: {image: x}\n")
    with pytest.raises(ConfigError, match="no card for agent 'ghost'"):
        load_sandboxes(tmp_path, known_agents=["claude-coder"])
    (tmp_path / "_sandbox.yaml").write_text("claude-coder: {image: x, memory: lots}\n")
    with pytest.raises(ConfigError, match="memory"):
        load_sandboxes(tmp_path)
    (tmp_path / "_sandbox.yaml").write_text("claude-coder: {image: x, vault: true}\n")
    with pytest.raises(ConfigError, match="vault"):
        load_sandboxes(tmp_path)
    assert SandboxSpec(image="x", no_vault=False).no_vault is False
