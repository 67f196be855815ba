"""Workspace leases: a fresh clone and branch per claimed coding task, merged only by PR.

The remote is a bare repository in tmp_path (``git+file://…``) and the forge is a loopback
stand-in speaking Gitea's pull-request API. No network is used.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import fabric.apps.cli.workspace_cmd  # noqa: F401  (registers `agap workspace`)
from fabric.apps.cli import main
from fabric.apps.forge import ForgeError, GiteaForge
from fabric.apps.workspace import PushRefused, RepoRef, Workspace, WorkspaceError
from fabric.core import Fabric
from fabric.embedded.server import EmbeddedBoard
from fabric.ledger import Lease
from fabric.settings.resolve import Settings
from fabric.task import State
from tests.conftest import ROOT, FakeClock
from tests.fakes.gitea_stub import GiteaStub
from workers.queue import QueueReader

AGENT = "claude-coder"


@pytest.fixture(autouse=True)
def _git_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "Test Agent")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "agent@example.invalid")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("HOME", str(tmp_path))


def git(*args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    """A bare repository ``alvis/agap.git`` with one commit on main."""
    bare = tmp_path / "forge" / "alvis" / "agap.git"
    bare.parent.mkdir(parents=True)
    git("init", "--quiet", "--bare", "--initial-branch=main", str(bare))
    seed = tmp_path / "seed"
    git("init", "--quiet", "--initial-branch=main", str(seed))
    (seed / "README.md").write_text("# agap\n")
    git("add", "README.md", cwd=seed)
    git("commit", "--quiet", "-m", "initial", cwd=seed)
    git("push", "--quiet", str(bare), "main", cwd=seed)
    return bare


def head_of(bare: Path, branch: str) -> str:
    out = git("--git-dir", str(bare), "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False)
    return out.stdout.strip()


@pytest.fixture
def forge() -> Iterator[GiteaStub]:
    with GiteaStub(repos={"alvis/agap"}) as stub:
        yield stub


def claim(fab: Fabric, owner: str) -> Lease:
    lease = QueueReader.for_agent(fab, fab.cards.get(AGENT)).claim_next(owner, lease_seconds=60)
    assert lease is not None
    return lease


def test_workspace_lease_lifecycle(
    local_fabric: Fabric, clock: FakeClock, remote: Path, forge: GiteaStub, tmp_path: Path
) -> None:
    fab, root = local_fabric, tmp_path / "state"
    ref = f"git+file://{remote}#main"
    tid = fab.submit("Fix the CSV parser\nIt drops quoted commas.", target=AGENT, refs=[ref]).task_id

    # prepare: a fresh clone on the task's own branch, from main
    lease = claim(fab, "w1")
    ws = Workspace.prepare(root, lease)
    assert ws.path == root / "workspaces" / AGENT / lease.uid
    assert ws.branch == f"agap/{lease.uid}-fix-the-csv-parser"
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=ws.path).stdout.strip() == ws.branch
    assert (ws.path / "README.md").read_text() == "# agap\n"
    assert ws.state.resumed_from == head_of(remote, "main") and ws.state.remote_head == ""
    assert (ws.path / ".git" / "hooks" / "pre-push").exists()

    # edit -> checkpoint: committed, pushed, recorded on the task
    (ws.path / "parser.py").write_text("def parse(line):\n    return line.split(',')\n")
    point = ws.checkpoint("parser: first cut")
    sha = head_of(remote, ws.branch)
    assert sha and point == f"git+file://{remote}#{ws.branch}@{sha}"
    assert RepoRef.parse(point) == RepoRef(f"file://{remote}", ws.branch, sha)
    lease = fab.ledger.checkpoint(lease, point)
    assert head_of(remote, "main") == ws.state.resumed_from  # main untouched

    # kill: unpushed work is lost with the worker; the lease expires and the task requeues
    (ws.path / "lost.txt").write_text("never pushed\n")
    clock.advance(120)
    fab.ledger.requeue_expired(fab.board.read(tid))
    lease2 = claim(fab, "w2")
    assert lease2.epoch == lease.epoch + 2 and lease2.checkpoint == point

    # the next epoch gets a new workspace, resumed from the last pushed checkpoint
    ws2 = Workspace.prepare(root, lease2)
    assert ws2.path == ws.path and ws2.branch == ws.branch
    assert ws2.state.resumed_from == sha and ws2.state.remote_head == sha
    assert (ws2.path / "parser.py").exists() and not (ws2.path / "lost.txt").exists()
    assert "parser: first cut" in git("log", "--format=%s", cwd=ws2.path).stdout

    # a zombie copy elsewhere (same branch, older view of it) cannot overwrite new pushes
    zombie = Workspace.prepare(tmp_path / "other-host", lease2)
    (ws2.path / "parser.py").write_text(
        "import csv\n\ndef parse(line):\n    return next(csv.reader([line]))\n"
    )
    ws2.checkpoint("parser: use csv")
    (zombie.path / "parser.py").write_text("# stale\n")
    with pytest.raises(WorkspaceError, match="push of"):
        zombie.checkpoint("stale edit")
    assert "use csv" in git("--git-dir", str(remote), "log", "-1", "--format=%s", ws2.branch).stdout
    zombie.release()

    # finish: one pull request, and a retry finds it instead of opening another
    env = {"GITEA_TOKEN": forge.token}
    gitea = GiteaForge(forge.url, "GITEA_TOKEN", env=env)
    url = ws2.finish(gitea, "Fix the CSV parser", "Handles quoted commas.")
    assert url == f"{forge.url}/alvis/agap/pulls/1"
    assert ws2.finish(gitea, "Fix the CSV parser", "Handles quoted commas.") == url
    assert len(forge.created()) == 1
    post = forge.created()[0]
    assert post.path == "/api/v1/repos/alvis/agap/pulls"
    assert post.headers["authorization"] == f"token {forge.token}"
    assert {k: post.body[k] for k in ("head", "base", "title")} == {
        "head": ws2.branch,
        "base": "main",
        "title": "Fix the CSV parser",
    }
    assert fab.ledger.complete(lease2, url).state == State.DONE

    # never to main: the guard refuses before git runs …
    main_before = head_of(remote, "main")
    for target in ("main", "refs/heads/main", "master", "agap/some-other-task"):
        with pytest.raises(PushRefused):
            ws2.push(target)
    # … and the workspace's pre-push hook refuses a raw git push too
    for dest in ("HEAD:main", "HEAD:refs/heads/release", ":main"):
        raw = git("push", "origin", dest, cwd=ws2.path, check=False)
        assert raw.returncode != 0 and "agap pre-push: refusing" in raw.stderr, raw.stderr
    assert head_of(remote, "main") == main_before

    # release: the directory goes, the pushed branch stays
    ws2.release()
    assert not ws2.path.exists() and not (root / "workspaces" / AGENT).exists()
    assert head_of(remote, ws2.branch)


def test_gitea_forge_is_idempotent_under_a_race_and_checks_the_token(forge: GiteaStub) -> None:
    gitea = GiteaForge(forge.url, "GITEA_TOKEN", env={"GITEA_TOKEN": forge.token})
    first = gitea.open_pull_request("alvis/agap", "agap/x-1", "main", "One", "")
    # Another process opened it between our look and our POST: Gitea answers 409.
    calls = {"n": 0}
    real = gitea.find_open_pull_request

    def late(repo: str, head: str, base: str) -> str | None:
        calls["n"] += 1
        return None if calls["n"] == 1 else real(repo, head, base)

    gitea.find_open_pull_request = late  # type: ignore[method-assign]
    assert gitea.open_pull_request("alvis/agap", "agap/x-1", "main", "One", "") == first
    assert [r.body["_status"] for r in forge.requests if r.method == "POST"] == [201, 409]
    with pytest.raises(ForgeError, match="refused the token"):
        GiteaForge(forge.url, "T", env={"T": "wrong"}).open_pull_request(
            "alvis/agap", "agap/x-2", "main", "Two", ""
        )
    with pytest.raises(Exception, match="GITEA_TOKEN is not set"):
        GiteaForge(forge.url, env={}).open_pull_request("alvis/agap", "agap/x-2", "main", "T", "")


def test_prepare_needs_a_repository_and_an_existing_base(
    local_fabric: Fabric, remote: Path, tmp_path: Path
) -> None:
    local_fabric.submit("Refactor nothing", target=AGENT)
    lease = claim(local_fabric, "w1")
    with pytest.raises(Exception, match="names no repository"):
        Workspace.prepare(tmp_path, lease)
    with pytest.raises(WorkspaceError, match="'nope' is not in"):
        Workspace.prepare(tmp_path, lease, f"git+file://{remote}#nope")
    assert not (tmp_path / "workspaces" / AGENT / lease.uid).exists()


# -- the CLI, as an external runtime uses it ---------------------------------------------


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_cli_prepare_checkpoint_finish(
    embedded_board: EmbeddedBoard, remote: Path, forge: GiteaStub, tmp_path: Path
) -> None:
    env = {
        "KANBOARD_URL": embedded_board.url,
        "KANBOARD_API_TOKEN": embedded_board.token,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "AGAP_STATE_DIR": str(tmp_path / "var"),
        "AGAP_FORGE_URL": forge.url,
        "GITEA_TOKEN": forge.token,
    }
    assert run(env, "init").exit_code == 0
    sub = run(
        env,
        "submit",
        "--target",
        AGENT,
        "--intent",
        "Add a CHANGELOG",
        "--ref",
        f"git+file://{remote}#main",
        "--json",
    )
    tid = json.loads(sub.output)["task_id"]
    claimed = json.loads(run(env, "claim", "--agent", AGENT, "--owner", "loop-1", "--json").output)
    lease = ["--epoch", str(claimed["epoch"]), "--owner", "loop-1"]

    prep = run(env, "workspace", "prepare", str(tid), *lease, "--json")
    assert prep.exit_code == 0, prep.output
    path = Path(json.loads(prep.output)["path"])
    assert path.is_relative_to(tmp_path / "var" / "workspaces" / AGENT)
    (path / "CHANGELOG.md").write_text("# Changelog\n")
    cp = run(env, "workspace", "checkpoint", str(tid), *lease, "-m", "changelog", "--json")
    assert cp.exit_code == 0, cp.output
    point = json.loads(cp.output)["checkpoint"]
    shown = json.loads(run(env, "show", str(tid), "--json").output)
    assert json.dumps(shown).count(point) >= 1  # recorded on the task

    done = run(
        env, "workspace", "finish", str(tid), *lease, "--title", "Add a CHANGELOG", "--complete", "--json"
    )
    assert done.exit_code == 0, done.output
    out = json.loads(done.output)
    assert out["pull_request"] == f"{forge.url}/alvis/agap/pulls/1" and out["state"] == "done"
    assert not path.exists()
    shown = json.loads(run(env, "show", str(tid), "--json").output)
    assert shown["state"] == "done" and shown["result_ref"] == out["pull_request"]
    assert len(forge.created()) == 1
    # The lease is over: acting under it again is fenced before anything is pushed.
    again = run(env, "workspace", "checkpoint", str(tid), *lease, "-m", "late")
    assert again.exit_code == 4 and "fenced" in again.output
    wrong = run(env, "workspace", "prepare", str(tid), "--epoch", "0", "--owner", "loop-1")
    assert wrong.exit_code == 4 and "holds no working lease" in wrong.output


def test_cli_fenced_owner_cannot_push(embedded_board: EmbeddedBoard, remote: Path, tmp_path: Path) -> None:
    env = {
        "KANBOARD_URL": embedded_board.url,
        "KANBOARD_API_TOKEN": embedded_board.token,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "AGAP_STATE_DIR": str(tmp_path / "var"),
    }
    assert run(env, "init").exit_code == 0
    tid = json.loads(
        run(
            env,
            "submit",
            "--target",
            AGENT,
            "--intent",
            "Tidy up",
            "--ref",
            f"git+file://{remote}#main",
            "--json",
        ).output
    )["task_id"]
    claimed = json.loads(
        run(env, "claim", "--agent", AGENT, "--owner", "slow", "--lease", "0.5", "--json").output
    )
    lease = ["--epoch", str(claimed["epoch"]), "--owner", "slow"]
    prep = run(env, "workspace", "prepare", str(tid), *lease, "--json")
    path = Path(json.loads(prep.output)["path"])
    # The keeper's clock reads a minute on: the 0.5 s lease has run out (no waiting for it).
    fab = Fabric.connect(Settings.from_env(env), clock=lambda: time.time() + 60)
    fab.ledger.requeue_expired(fab.board.read(tid))
    (path / "late.txt").write_text("too late\n")
    late = run(env, "workspace", "checkpoint", str(tid), *lease, "-m", "late")
    assert late.exit_code == 4 and "fenced" in late.output
    branch = json.loads(prep.output)["branch"]
    assert head_of(remote, branch) == ""  # nothing was pushed


def test_claim_with_workspace_prepares_it_on_the_tasks_branch(
    embedded_board: EmbeddedBoard, remote: Path, tmp_path: Path
) -> None:
    env = {
        "KANBOARD_URL": embedded_board.url,
        "KANBOARD_API_TOKEN": embedded_board.token,
        "AGAP_CARDS_DIR": str(ROOT / "cards"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "AGAP_STATE_DIR": str(tmp_path / "var"),
    }
    assert run(env, "init").exit_code == 0
    run(env, "submit", "--target", AGENT, "--intent", "Fix the typo", "--ref", f"git+file://{remote}#main")
    out = run(env, "claim", "--agent", AGENT, "--owner", "loop-1", "--workspace", "--json")
    assert out.exit_code == 0, out.output
    ws = json.loads(out.output)["workspace"]
    path = Path(ws["path"])
    assert path.is_relative_to(tmp_path / "var" / "workspaces" / AGENT) and (path / ".git").exists()
    assert ws["branch"].startswith("agap/") and ws["resumed"] is False
